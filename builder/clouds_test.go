package builder

import (
	"context"
	"errors"
	"io"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/uploader"
	"github.com/nodepool-builder/nodepool-builder/uploader/openstack"
)

// formatCloud is a cloud whose clouds.yaml entry names an image format.
type formatCloud struct {
	*gatedCloud
	format string
}

func (c formatCloud) ImageFormat() string { return c.format }

// TestOpenClouds: providers of one clouds.yaml entry and region share one
// client, a provider without image-format takes its cloud's, and a cloud that
// does not open names its provider.
func TestOpenClouds(t *testing.T) {
	for _, tc := range []struct {
		name      string
		providers []config.Provider
		opened    []string          // the providers a cloud was opened for
		share     map[string]string // provider: the provider whose client it has
		formats   map[string]string
		err       string
	}{{
		name: "one cloud and region, one client",
		providers: []config.Provider{
			{Name: "pa", Cloud: "c"}, {Name: "pb", Cloud: "c"}, {Name: "pc", Cloud: "c", RegionName: "other"}, {Name: "pd", Cloud: "d"}},
		opened:  []string{"pa", "pc", "pd"},
		share:   map[string]string{"pa": "pa", "pb": "pa", "pc": "pc", "pd": "pd"},
		formats: map[string]string{"pa": "qcow2", "pb": "qcow2", "pc": "qcow2", "pd": "qcow2"},
	}, {
		name:      "image-format set, or taken from the cloud",
		providers: []config.Provider{{Name: "pa", Cloud: "c", ImageFormat: "raw"}, {Name: "pb", Cloud: "c"}},
		opened:    []string{"pa"},
		share:     map[string]string{"pa": "pa", "pb": "pa"},
		formats:   map[string]string{"pa": "raw", "pb": "qcow2"},
	}, {
		name:      "a cloud that does not open",
		providers: []config.Provider{{Name: "pa", Cloud: "c"}, {Name: "pb", Cloud: "missing"}},
		opened:    []string{"pa", "pb"},
		err:       "provider pb: no cloud missing in clouds.yaml",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			var opened []string
			byProvider := map[uploader.Cloud]string{}
			open := func(_ context.Context, p *config.Provider) (uploader.Cloud, error) {
				opened = append(opened, p.Name)
				if p.Cloud == "missing" {
					return nil, errors.New("no cloud missing in clouds.yaml")
				}
				c := formatCloud{newGatedCloud(), "qcow"}
				byProvider[c] = p.Name
				return c, nil
			}
			clouds, err := OpenClouds(context.Background(), tc.providers, open)
			if !slices.Equal(opened, tc.opened) {
				t.Errorf("clouds opened for %v, want %v", opened, tc.opened)
			}
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			share := map[string]string{}
			for name, c := range clouds {
				share[name] = byProvider[c]
			}
			if !maps.Equal(share, tc.share) {
				t.Errorf("clients by provider %v, want %v", share, tc.share)
			}
			formats := map[string]string{}
			for _, p := range tc.providers {
				formats[p.Name] = p.ImageFormat
			}
			if !maps.Equal(formats, tc.formats) {
				t.Errorf("image formats %v, want %v", formats, tc.formats)
			}
		})
	}
}

// importCloud is a cloud that answers whether it offers an import method.
type importCloud struct {
	*gatedCloud
	answer error
}

func (c importCloud) ImportMethods(context.Context) ([]string, error) {
	return nil, errors.New("not asked here")
}
func (c importCloud) CheckImportMethod(context.Context, string) error { return c.answer }
func (c importCloud) Stage(context.Context, string, io.Reader, int64) error {
	return errors.New("not staged here")
}
func (c importCloud) Import(context.Context, string, string, string) error {
	return errors.New("not imported here")
}
func (c importCloud) ImportFailure(context.Context, string) (string, error) { return "", nil }

// TestCheckImportMethods: a cloud that answers that it does not offer a
// provider's upload-method is a problem naming what it offers; one that
// cannot be asked a warning; a provider that PUTs is not asked.
func TestCheckImportMethods(t *testing.T) {
	cfg := &config.Config{
		Providers: []config.Provider{{Name: "offers", Cloud: "a"}, {Name: "refuses", Cloud: "b"}, {Name: "down", Cloud: "c"},
			{Name: "puts", Cloud: "d"}},
		Builder: config.Builder{Providers: map[string]config.BuilderProvider{
			"offers":  {Name: "offers", UploadMethod: config.UploadGlanceDirect},
			"refuses": {Name: "refuses", UploadMethod: config.UploadGlanceDirect},
			"down":    {Name: "down", UploadMethod: config.UploadGlanceDirect},
		}},
	}
	answers := map[string]error{
		"a": nil,
		"b": &openstack.ImportMethodError{Cloud: "b", Method: "glance-direct", Offered: []string{"web-download"}},
		"c": errors.New("connection refused"),
	}
	var asked []string
	open := func(_ context.Context, p *config.Provider) (uploader.Cloud, error) {
		asked = append(asked, p.Name)
		return importCloud{gatedCloud: &gatedCloud{}, answer: answers[p.Cloud]}, nil
	}
	problems, warnings := CheckImportMethods(t.Context(), cfg, open)
	if want := []string{"offers", "refuses", "down"}; !slices.Equal(asked, want) {
		t.Errorf("the clouds asked: %v; want %v", asked, want)
	}
	if len(problems) != 1 || !strings.Contains(problems[0].Error(),
		`provider refuses: upload-method glance-direct (builder.providers in nodepool-builder.yaml): cloud b does not offer the image import method "glance-direct": it offers web-download`) {
		t.Errorf("problems: %v", problems)
	}
	if len(warnings) != 1 || !strings.Contains(warnings[0], "provider down: could not ask its cloud") ||
		!strings.Contains(warnings[0], "connection refused") {
		t.Errorf("warnings: %q", warnings)
	}
}
