package builder

import (
	"slices"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/config"
)

// TestDropsToConfirm: what a reload releases that the file watcher alone may
// not apply: a provider's every upload, an image's every upload, every image.
func TestDropsToConfirm(t *testing.T) {
	prov := func(name string, images ...string) config.Provider {
		p := config.Provider{Name: name}
		for _, i := range images {
			p.DiskImages = append(p.DiskImages, config.ProviderImage{Name: i})
		}
		return p
	}
	cfg := func(images []string, provs ...config.Provider) *config.Config {
		c := &config.Config{Providers: provs}
		for _, i := range images {
			c.DiskImages = append(c.DiskImages, config.DiskImage{Name: i})
		}
		return c
	}
	ab := []string{"a", "b"}
	running := cfg(ab, prov("p", "a", "b"), prov("q", "a"))
	for _, c := range []struct {
		name string
		next *config.Config
		want []string
	}{
		{"unchanged", running, nil},
		{"an image moves to another provider", cfg(ab, prov("p", "a"), prov("q", "a", "b")), nil},
		{"a provider lists more", cfg(slices.Concat(ab, []string{"c"}), prov("p", "a", "b", "c"), prov("q", "a")), nil},
		{"a provider is added", cfg(ab, prov("p", "a", "b"), prov("q", "a"), prov("r", "b")), nil},
		{"a diskimage without uploads goes", &config.Config{DiskImages: []config.DiskImage{{Name: "a"}, {Name: "b"}, {Name: "c"}},
			Providers: running.Providers}, nil},
		{"a provider lists none of its images", cfg(ab, prov("p", "a", "b"), prov("q")),
			[]string{"provider q: every upload (it no longer lists a)"}},
		{"a provider lists other images only", cfg(ab, prov("p", "a", "b"), prov("q", "b")),
			[]string{"provider q: every upload (it no longer lists a)"}},
		{"a provider goes", cfg(ab, prov("p", "a", "b")),
			[]string{"provider q: every upload (it is no longer in the config)"}},
		{"an image is listed by no provider", cfg(ab, prov("p", "a"), prov("q", "a")),
			[]string{"image b: every upload (no provider lists it)"}},
		{"an image leaves the config", cfg([]string{"a"}, prov("p", "a"), prov("q", "a")),
			[]string{"image b: every upload (no provider lists it)"}},
		{"cut after the first provider's image-format", cfg(ab, prov("p")), []string{
			"provider p: every upload (it no longer lists a, b)",
			"provider q: every upload (it is no longer in the config)",
			"image a: every upload (no provider lists it)",
			"image b: every upload (no provider lists it)",
		}},
		{"every image", cfg(nil), []string{
			"provider p: every upload (it is no longer in the config)",
			"provider q: every upload (it is no longer in the config)",
			"image a: every upload (no provider lists it)",
			"image b: every upload (no provider lists it)",
			"every image (the config lists none)",
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := dropsToConfirm(running, c.next); !slices.Equal(got, c.want) {
				t.Errorf("dropsToConfirm =\n%q\nwant\n%q", got, c.want)
			}
		})
	}
	// Images without providers: dropping them all is the one drop.
	if got := dropsToConfirm(cfg(ab), cfg(nil)); !slices.Equal(got, []string{"every image (the config lists none)"}) {
		t.Errorf("every image of a config without providers: %q", got)
	}
	// From no images, nothing is dropped.
	if got := dropsToConfirm(cfg(nil), cfg(nil)); got != nil {
		t.Errorf("from an empty config: %q", got)
	}
}
