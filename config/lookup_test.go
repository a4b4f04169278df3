package config

import (
	"reflect"
	"testing"
	"time"
)

const lookupConfig = `images-dir: /i
diskimages:
  - name: dib-a
    formats: [vhd]
  - name: dib-b
  - name: base
    abstract: true
zuul-images:
  - {name: zuul-a, api-url: 'https://z/', project: p, job: j, formats: [raw]}
  - {name: zuul-b, api-url: 'https://z/', project: p, job: j}
providers:
  - name: qcow-cloud
    cloud: a
    diskimages:
      - name: dib-a
      - name: zuul-a
        pause: true
  - name: raw-cloud
    cloud: b
    image-format: raw
    diskimages:
      - name: dib-a
      - name: zuul-b
  - name: vhd-cloud
    cloud: c
    image-format: vhd
    diskimages:
      - name: zuul-b
`

func TestLookups(t *testing.T) {
	cfg := mustParse(t, lookupConfig)

	if got, want := cfg.ImageNames(), []string{"dib-a", "dib-b", "zuul-a", "zuul-b"}; !reflect.DeepEqual(got, want) {
		t.Errorf("ImageNames = %v, want %v", got, want)
	}
	if cfg.DiskImage("dib-b") == nil || cfg.DiskImage("zuul-a") != nil || cfg.DiskImage("base") != nil {
		t.Errorf("DiskImage finds the wrong images")
	}
	if cfg.ZuulImage("zuul-b") == nil || cfg.ZuulImage("dib-a") != nil {
		t.Errorf("ZuulImage finds the wrong images")
	}
	if p := cfg.Provider("raw-cloud"); p == nil || p.Cloud != "b" || cfg.Provider("nope") != nil {
		t.Errorf("Provider(raw-cloud) = %+v", p)
	}
	// Lookups point into the config, so that callers see one copy.
	cfg.ZuulImage("zuul-a").Pause = true
	if !cfg.ZuulImages[0].Pause {
		t.Errorf("ZuulImage returned a copy")
	}

	qcow := cfg.Provider("qcow-cloud")
	if qcow.Format() != "qcow2" || cfg.Provider("raw-cloud").Format() != "raw" {
		t.Errorf("Format() = %q, %q; want qcow2, raw", qcow.Format(), cfg.Provider("raw-cloud").Format())
	}
	if pi := qcow.Entry("zuul-a"); pi == nil || !pi.Pause {
		t.Errorf("Image(zuul-a) = %+v, want the paused entry", pi)
	}
	if qcow.Entry("zuul-b") != nil {
		t.Errorf("Image(zuul-b) found an image qcow-cloud does not list")
	}
}

func TestProvidersForAndNeededFormats(t *testing.T) {
	cfg := mustParse(t, lookupConfig)
	tests := []struct {
		image     string
		providers []string
		formats   []string
	}{
		{"dib-a", []string{"qcow-cloud", "raw-cloud"}, []string{"qcow2", "raw", "vhd"}},
		{"dib-b", nil, nil},
		{"zuul-a", []string{"qcow-cloud"}, []string{"qcow2", "raw"}}, // paused entry counts
		{"zuul-b", []string{"raw-cloud", "vhd-cloud"}, []string{"raw", "vhd"}},
		{"base", nil, nil},
		{"unknown", nil, nil},
	}
	for _, tt := range tests {
		var names []string
		for _, p := range cfg.ProvidersFor(tt.image) {
			names = append(names, p.Name)
		}
		if !reflect.DeepEqual(names, tt.providers) {
			t.Errorf("ProvidersFor(%s) = %v, want %v", tt.image, names, tt.providers)
		}
		if got := cfg.NeededFormats(tt.image); !reflect.DeepEqual(got, tt.formats) {
			t.Errorf("NeededFormats(%s) = %v, want %v", tt.image, got, tt.formats)
		}
	}
}

func TestNeededFormatsDoesNotAlias(t *testing.T) {
	// Without providers the result is the image's own formats, sorted: that
	// must not sort or share the config's slice.
	cfg := mustParse(t, "images-dir: /i\ndiskimages:\n  - {name: d, formats: [vhd, qcow2, raw]}\n")
	got := cfg.NeededFormats("d")
	if !reflect.DeepEqual(got, []string{"qcow2", "raw", "vhd"}) {
		t.Fatalf("NeededFormats(d) = %v", got)
	}
	got[0] = "changed"
	if want := []string{"vhd", "qcow2", "raw"}; !reflect.DeepEqual(cfg.DiskImage("d").Formats, want) {
		t.Errorf("image formats became %v, want %v", cfg.DiskImage("d").Formats, want)
	}
}

// TestUploadTimeout: one default of image-upload-timeout, nodepool's 3600 s,
// for a provider parsed without the key and for one made in code alike.
func TestUploadTimeout(t *testing.T) {
	cfg := mustParse(t, lookupConfig)
	if got := cfg.Provider("qcow-cloud").UploadTimeout(); got != time.Hour {
		t.Errorf("parsed provider without image-upload-timeout: %v, want 1h", got)
	}
	if got := (&Provider{}).UploadTimeout(); got != time.Hour {
		t.Errorf("provider made in code: %v, want 1h", got)
	}
	if got := (&Provider{ImageUploadTimeout: 90 * time.Second}).UploadTimeout(); got != 90*time.Second {
		t.Errorf("image-upload-timeout 90: %v, want 1m30s", got)
	}
}
