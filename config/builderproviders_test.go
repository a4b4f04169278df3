package config

import (
	"errors"
	"strings"
	"testing"
)

// providersYAML is a nodepool.yaml with two providers, cloud-a and cloud-b.
const providersYAML = `images-dir: /opt/images
diskimages:
  - name: debian
providers:
  - name: cloud-a
    cloud: a
    diskimages:
      - name: debian
  - name: cloud-b
    cloud: b
    diskimages:
      - name: debian
`

func TestBuilderProvidersUploadMethod(t *testing.T) {
	cfg := mustParseFiles(t, providersYAML, `builder:
  providers:
    - name: cloud-a
      upload-method: glance-direct
    - name: cloud-b
`)
	for provider, want := range map[string]string{"cloud-a": UploadGlanceDirect, "cloud-b": UploadPut, "cloud-c": UploadPut} {
		if got := cfg.Builder.UploadMethod(provider); got != want {
			t.Errorf("upload method of %s = %q, want %q", provider, got, want)
		}
	}
	cfg = mustParseFiles(t, providersYAML, "builder:\n  keep-builds: 2\n")
	if got := cfg.Builder.UploadMethod("cloud-a"); got != UploadPut {
		t.Errorf("upload method without builder.providers = %q, want put", got)
	}
}

func TestBuilderProvidersErrors(t *testing.T) {
	tests := []struct {
		name, own string
		line      int
		path, msg string
	}{
		{"unknown provider", "builder:\n  providers:\n    - name: swift-eu\n      upload-method: glance-direct\n",
			3, "builder.providers[0].name", `"swift-eu" is not a provider of nodepool.yaml; its providers are cloud-a, cloud-b`},
		{"a misspelt provider", "builder:\n  providers:\n    - name: cloud-aa\n",
			3, "builder.providers[0].name", "did you mean cloud-a?"},
		{"unknown method", "builder:\n  providers:\n    - name: cloud-a\n      upload-method: swift\n",
			4, "builder.providers[0].upload-method", `"swift" is not an upload method; they are put, glance-direct`},
		{"web-download", "builder:\n  providers:\n    - name: cloud-a\n      upload-method: web-download\n",
			4, "builder.providers[0].upload-method", "web-download is not supported by this version yet; use put, glance-direct"},
		{"unknown key", "builder:\n  providers:\n    - name: cloud-a\n      image-format: raw\n",
			4, "builder.providers[0].image-format", "unknown key in a provider's builder settings"},
		{"no name", "builder:\n  providers:\n    - upload-method: put\n",
			3, "builder.providers[0].name", "is required"},
		{"twice", "builder:\n  providers:\n    - name: cloud-a\n    - name: cloud-a\n",
			4, "builder.providers[1].name", "listed twice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseFiles(providersYAML, tt.own)
			var es Errors
			if !errors.As(err, &es) {
				t.Fatalf("error %v is not an Errors", err)
			}
			for _, e := range es {
				if e.Line == tt.line && e.Path == tt.path && strings.Contains(e.Msg, tt.msg) &&
					strings.HasPrefix(e.Error(), "nodepool-builder.yaml:") {
					return
				}
			}
			t.Errorf("no error in nodepool-builder.yaml at line %d, path %q, containing %q; got:\n%v", tt.line, tt.path, tt.msg, err)
		})
	}
}
