package builder

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/uploader"
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
