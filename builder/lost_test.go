package builder

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/store/storetest"
)

// TestWarnLost: a build of this builder deleted by another program is a loss,
// said at warning level with the likely cause, unless it was rotated out: not
// its poll cursor's build, and its image keeps the ready builds nodepool's
// cleanup keeps. Such a build a Python nodepool-builder that has the image
// deletes as this builder would; that is said at info level, or at warning
// level when keep-builds asks for more builds than nodepool keeps.
func TestWarnLost(t *testing.T) {
	ctx := context.Background()
	st, raw := storetest.Open(t, store.Options{ImagesDir: t.TempDir()})
	defer st.Close()
	for _, image := range []string{"kept", "kept", "alone"} {
		b, err := st.CreateBuild(ctx, store.Build{Image: image, Source: store.SourceZuul})
		if err != nil {
			t.Fatal(err)
		}
		if err := raw.SetBuildState(ctx, &b, store.Ready, ""); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name  string
		lost  store.LostBuild
		keep  int
		level string
		says  string
	}{
		{"rotated out", store.LostBuild{Image: "kept", ID: store.NewBuildID()}, 2,
			"level=INFO", "deleted in rotation by another builder"},
		{"rotated out past keep-builds", store.LostBuild{Image: "kept", ID: store.NewBuildID()}, 3,
			"level=WARN", "keep-builds is 3, but a Python nodepool-builder sharing the state keeps the 2 newest"},
		{"the cursor's build", store.LostBuild{Image: "kept", ID: store.NewBuildID(), ZuulUUID: "u"}, 2,
			"level=WARN", "does not declare zuul-image kept"},
		{"the image left with one build", store.LostBuild{Image: "alone", ID: store.NewBuildID()}, 2,
			"level=WARN", "does not declare zuul-image alone"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var logs bytes.Buffer
			b := &Builder{store: st, log: slog.New(slog.NewTextHandler(&logs, nil))}
			cfg := &config.Config{Builder: config.Builder{KeepBuilds: c.keep},
				ZuulImages: []config.ZuulImage{{Name: "kept"}, {Name: "alone"}}}
			b.warnLost(ctx, cfg, c.lost)
			line := logs.String()
			if !strings.Contains(line, c.level) || !strings.Contains(line, c.says) ||
				!strings.Contains(line, "build="+store.BuildName(c.lost.Image, c.lost.ID)) {
				t.Errorf("logged %q; want %s saying %q", line, c.level, c.says)
			}
		})
	}
}
