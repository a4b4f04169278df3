package uploader

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// TestPlanRetention: what a Retain pass releases and forgets, and why, from
// what it read. Builds are named <image>-<n>, the larger n the newer, n unique
// as a build id is; uploads <image>-<n>/<provider>/<id>.
func TestPlanRetention(t *testing.T) {
	const us, them = "us", "them"
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	build := func(image string, n int, state store.State, builder string) store.Build {
		return store.Build{Image: image, ID: fmt.Sprint(n), State: state, Created: t0.Add(time.Duration(n) * time.Hour), BuilderID: builder}
	}
	upload := func(image string, n int, provider, id string, state store.State) store.Upload {
		return store.Upload{Image: image, BuildID: fmt.Sprint(n), Provider: provider, ID: id, State: state}
	}
	left := func(up store.Upload) store.Upload { up.ExternalID = "00000000-0000-4000-8000-000000000001"; return up }
	provider := func(name string, images ...string) config.Provider {
		p := config.Provider{Name: name}
		for _, image := range images {
			p.DiskImages = append(p.DiskImages, config.ProviderImage{Name: image})
		}
		return p
	}
	paused := config.Provider{Name: "p", DiskImages: []config.ProviderImage{{Name: "a", Pause: true}}}
	const (
		ready, failed, uploading = store.Ready, store.Failed, store.Uploading
		building, deleting       = store.Building, store.Deleting
	)

	for _, c := range []struct {
		name                    string
		keepBuilds, keepUploads int
		images                  []string // of the config
		providers               []config.Provider
		builds                  []store.Build
		uploads                 []store.Upload
		want                    []string
	}{{
		name: "keep-builds: older ready builds go", keepBuilds: 2, keepUploads: 2,
		images: []string{"a"}, providers: []config.Provider{provider("p", "a")},
		builds: []store.Build{build("a", 1, ready, us), build("a", 2, ready, us), build("a", 3, ready, us)},
		want:   []string{"release build a-1 (): more than keep-builds (2) ready builds"},
	}, {
		name: "keep-builds of 0 keeps one", keepBuilds: 0, keepUploads: 0,
		images: []string{"a"}, providers: []config.Provider{provider("p", "a")},
		builds: []store.Build{build("a", 1, ready, us), build("a", 2, ready, us)},
		want:   []string{"release build a-1 (): more than keep-builds (1) ready builds"},
	}, {
		name: "a build stays while an upload of it is kept", keepBuilds: 1, keepUploads: 2,
		images: []string{"a"}, providers: []config.Provider{provider("p", "a")},
		builds:  []store.Build{build("a", 1, ready, us), build("a", 2, ready, us)},
		uploads: []store.Upload{upload("a", 1, "p", "1", ready), upload("a", 2, "p", "1", ready)},
	}, {
		name: "keep-uploads: older ready uploads go, then their builds with the rest of their uploads", keepBuilds: 1, keepUploads: 1,
		images: []string{"a"}, providers: []config.Provider{provider("p", "a"), provider("q", "a")},
		builds:  []store.Build{build("a", 1, ready, us), build("a", 2, ready, us)},
		uploads: []store.Upload{upload("a", 1, "p", "1", ready), upload("a", 2, "p", "1", ready), upload("a", 1, "q", "1", failed)},
		want: []string{
			"release upload a-1/p/1: more than keep-uploads (1) ready uploads",
			"release build a-1 (a-1/p/1 a-1/q/1): more than keep-builds (1) ready builds",
		},
	}, {
		name: "a paused image rotates as any other", keepBuilds: 1, keepUploads: 1,
		images: []string{"a"}, providers: []config.Provider{paused},
		builds:  []store.Build{build("a", 1, ready, us), build("a", 2, ready, us)},
		uploads: []store.Upload{upload("a", 1, "p", "1", ready), upload("a", 2, "p", "1", ready)},
		want: []string{
			"release upload a-1/p/1: more than keep-uploads (1) ready uploads",
			"release build a-1 (a-1/p/1): more than keep-builds (1) ready builds",
		},
	}, {
		name: "an upload under way keeps its build and does not count as kept", keepBuilds: 1, keepUploads: 1,
		images: []string{"a"}, providers: []config.Provider{provider("p", "a")},
		builds: []store.Build{build("a", 1, ready, us), build("a", 2, ready, us), build("a", 3, ready, us)},
		uploads: []store.Upload{upload("a", 1, "p", "1", uploading), upload("a", 2, "p", "1", ready),
			upload("a", 3, "p", "1", uploading)},
	}, {
		name: "records being built, uploaded or deleted are left as they are", keepBuilds: 1, keepUploads: 1,
		images: []string{"a"}, providers: []config.Provider{provider("p", "a")},
		builds: []store.Build{build("a", 1, ready, us), build("a", 2, deleting, us), build("a", 3, ready, us),
			build("a", 4, building, us)},
		uploads: []store.Upload{upload("a", 1, "p", "1", deleting), left(upload("a", 1, "p", "2", failed))},
		want:    []string{"release build a-1 (a-1/p/2): more than keep-builds (1) ready builds"},
	}, {
		name: "failed builds older than the newest build go", keepBuilds: 2, keepUploads: 2,
		images: []string{"a"}, providers: []config.Provider{provider("p", "a")},
		builds: []store.Build{build("a", 1, failed, us), build("a", 2, ready, us), build("a", 3, failed, us)},
		want:   []string{"release build a-1 (): failed, and a newer build exists"},
	}, {
		name: "a failed upload is forgotten once a newer or as new one is ready, unless it holds an image", keepBuilds: 3, keepUploads: 2,
		images: []string{"a"}, providers: []config.Provider{provider("p", "a"), provider("q", "a")},
		builds: []store.Build{build("a", 1, ready, us), build("a", 2, ready, us), build("a", 3, ready, us)},
		uploads: []store.Upload{
			upload("a", 1, "p", "1", failed), left(upload("a", 1, "p", "2", failed)),
			upload("a", 2, "p", "1", ready), upload("a", 2, "p", "2", failed),
			upload("a", 3, "p", "1", failed), // newer than the newest ready
			upload("a", 1, "q", "1", failed), // nothing ready in q
		},
		want: []string{"forget a-2/p/2", "forget a-1/p/1"},
	}, {
		name: "an image no longer listed for a provider: its uploads there go, not its builds", keepBuilds: 2, keepUploads: 2,
		images: []string{"a"}, providers: []config.Provider{provider("p", "a"), provider("q")},
		builds: []store.Build{build("a", 1, ready, us), build("a", 2, ready, us), build("a", 3, ready, us)},
		uploads: []store.Upload{upload("a", 1, "p", "1", ready), upload("a", 1, "q", "1", ready),
			upload("a", 2, "q", "1", failed), upload("a", 1, "q", "2", uploading), upload("a", 3, "q", "1", deleting)},
		want: []string{
			"release upload a-1/q/1: image no longer listed for this provider",
			"release upload a-2/q/1: image no longer listed for this provider",
		},
	}, {
		name: "an upload under way to a provider that no longer lists the image keeps its build", keepBuilds: 1, keepUploads: 1,
		images: []string{"a"}, providers: []config.Provider{provider("q")},
		builds:  []store.Build{build("a", 1, ready, us), build("a", 2, ready, us)},
		uploads: []store.Upload{upload("a", 1, "q", "1", uploading)},
	}, {
		name: "an image no longer in the config: this builder's builds go with their uploads, another builder's stay", keepBuilds: 2, keepUploads: 2,
		providers: []config.Provider{provider("p")},
		builds:    []store.Build{build("a", 1, ready, us), build("a", 2, ready, them), build("a", 3, failed, us)},
		uploads:   []store.Upload{upload("a", 1, "p", "1", ready), upload("a", 2, "p", "1", ready)},
		want: []string{
			"release upload a-1/p/1: image is no longer in the config",
			"release build a-3 (): image is no longer in the config",
			"release build a-1 (a-1/p/1): image is no longer in the config",
		},
	}, {
		name: "an image another builder makes: nothing of it is touched", keepBuilds: 1, keepUploads: 1,
		images: []string{"a"}, providers: []config.Provider{provider("p", "a", "b")},
		builds:  []store.Build{build("a", 1, ready, us), build("b", 2, ready, them), build("b", 3, ready, them)},
		uploads: []store.Upload{upload("b", 2, "p", "1", ready), upload("b", 3, "p", "1", ready)},
	}, {
		name: "another builder's builds of an image of this config rotate as this builder's do", keepBuilds: 1, keepUploads: 1,
		images: []string{"a"}, providers: []config.Provider{provider("p", "a")},
		builds: []store.Build{build("a", 1, ready, them), build("a", 2, ready, them)},
		want:   []string{"release build a-1 (): more than keep-builds (1) ready builds"},
	}, {
		name: "a provider gone from the config: its uploads wait and keep their builds", keepBuilds: 1, keepUploads: 1,
		images: []string{"a"}, providers: []config.Provider{provider("p", "a")},
		builds:  []store.Build{build("a", 1, ready, us), build("a", 2, ready, us)},
		uploads: []store.Upload{upload("a", 1, "gone", "1", ready), upload("a", 1, "gone", "2", ready)},
	}, {
		name: "a build released with its image leaves its uploads to a provider gone out of its write", keepBuilds: 1, keepUploads: 1,
		providers: []config.Provider{provider("p")},
		builds:    []store.Build{build("a", 1, ready, us)},
		uploads:   []store.Upload{upload("a", 1, "gone", "1", ready), upload("a", 1, "p", "1", failed)},
		want: []string{
			"release upload a-1/p/1: image is no longer in the config",
			"release build a-1 (a-1/p/1): image is no longer in the config",
		},
	}} {
		t.Run(c.name, func(t *testing.T) {
			cfg := &config.Config{Builder: config.Builder{KeepBuilds: c.keepBuilds, KeepUploads: c.keepUploads}, Providers: c.providers}
			for _, name := range c.images {
				cfg.DiskImages = append(cfg.DiskImages, config.DiskImage{Name: name})
			}
			// As the store lists them: newest first.
			builds := slices.SortedFunc(slices.Values(c.builds), func(a, b store.Build) int { return b.Created.Compare(a.Created) })
			got := describeRetention(planRetention(cfg, us, builds, c.uploads))
			if !slices.Equal(got, c.want) {
				t.Errorf("plan:\n\t%s\nwant:\n\t%s", strings.Join(got, "\n\t"), strings.Join(c.want, "\n\t"))
			}
		})
	}
}

func describeRetention(p retention) []string {
	var out []string
	for _, r := range p.uploads {
		out = append(out, fmt.Sprintf("release upload %s: %s", r.upload, r.why))
	}
	for _, up := range p.forget {
		out = append(out, "forget "+up.String())
	}
	for _, r := range p.builds {
		var ups []string
		for _, up := range r.uploads {
			ups = append(ups, up.String())
		}
		out = append(out, fmt.Sprintf("release build %s (%s): %s", r.build.Name(), strings.Join(ups, " "), r.why))
	}
	return out
}
