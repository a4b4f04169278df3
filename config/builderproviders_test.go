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
      upload-method: web-download
`)
	for provider, want := range map[string]string{"cloud-a": UploadGlanceDirect, "cloud-b": UploadWebDownload, "cloud-c": UploadPut} {
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
			4, "builder.providers[0].upload-method", `"swift" is not an upload method; they are put, glance-direct, web-download`},
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

// TestWebDownloadWithAPostUploadHook: a post-upload-hook is given the
// image's file, which web-download does not download: the two are refused
// together, naming what to change.
func TestWebDownloadWithAPostUploadHook(t *testing.T) {
	np := strings.Replace(providersYAML, "    cloud: a\n", "    cloud: a\n    post-upload-hook: /usr/local/bin/check\n", 1)
	_, err := parseFiles(np, "builder:\n  providers:\n    - name: cloud-a\n      upload-method: web-download\n")
	if err == nil || !strings.Contains(err.Error(), "provider cloud-a has a post-upload-hook") ||
		!strings.Contains(err.Error(), "use glance-direct or put for it, or drop the hook") {
		t.Fatalf("web-download with a post-upload-hook: %v", err)
	}
	if _, err := parseFiles(np, "builder:\n  providers:\n    - name: cloud-a\n      upload-method: glance-direct\n"); err != nil {
		t.Fatalf("glance-direct with a post-upload-hook: %v", err)
	}
}

// TestFetchedByClouds: a format of a zuul-image is fetched by the clouds
// alone when every provider that lists the image in it, paused or not, is a
// web-download one, and the image keeps no format of its own.
func TestFetchedByClouds(t *testing.T) {
	const np = `images-dir: /opt/images
diskimages:
  - name: debian
    pause: true
  - name: ubuntu
    pause: true
providers:
  - name: web-a
    cloud: a
    diskimages:
      - name: debian
      - name: ubuntu
  - name: web-b
    cloud: b
    diskimages:
      - name: debian
        pause: true
  - name: put-raw
    cloud: c
    image-format: raw
    diskimages:
      - name: debian
`
	cfg := mustParseFiles(t, np, `zuul-images:
  - name: debian
    api-url: https://zuul.example.org/
    project: org/images
    job: build-debian
  - name: ubuntu
    api-url: https://zuul.example.org/
    project: org/images
    job: build-ubuntu
    formats: [qcow2]
builder:
  providers:
    - name: web-a
      upload-method: web-download
    - name: web-b
      upload-method: web-download
`)
	for _, tc := range []struct {
		image, format string
		want          bool
	}{
		{"debian", "qcow2", true},  // web-a and the paused web-b
		{"debian", "raw", false},   // put-raw PUTs it
		{"ubuntu", "qcow2", false}, // the image's own format
		{"debian", "vhd", false},   // no provider lists it in vhd
		{"centos", "qcow2", false}, // no such zuul-image
	} {
		if got := cfg.FetchedByClouds(tc.image, tc.format); got != tc.want {
			t.Errorf("FetchedByClouds(%s, %s) = %v, want %v", tc.image, tc.format, got, tc.want)
		}
	}
	cfg.Builder.Providers["web-b"] = BuilderProvider{Name: "web-b", UploadMethod: UploadPut}
	if cfg.FetchedByClouds("debian", "qcow2") {
		t.Error("a paused provider that PUTs needs the file when it is un-paused")
	}
}
