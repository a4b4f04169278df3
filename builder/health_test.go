package builder

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/store/storetest"
)

func TestLoopsCheck(t *testing.T) {
	var l loops
	now := time.Now()
	if err := l.check(now); err == nil || !strings.Contains(err.Error(), "not running") {
		t.Fatalf("check before Run = %v, want not running", err)
	}
	l.running.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	plan := l.start("plan uploads", time.Minute)
	plan.begin()
	plan.end()
	if err := l.check(now.Add(time.Hour)); err != nil {
		t.Fatalf("a loop between passes: %v", err)
	}
	plan.begin()
	if err := l.check(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatalf("a pass within its bound: %v", err)
	}
	if err := l.check(time.Now().Add(2 * time.Minute)); err == nil || !strings.Contains(err.Error(), `"plan uploads" is stuck`) {
		t.Fatalf("a pass past its bound = %v", err)
	}
	plan.end()

	sweep := l.start("leak sweep", time.Minute)
	sweep.exit(ctx, false)
	if err := l.check(time.Now()); err == nil || !strings.Contains(err.Error(), `"leak sweep" stopped`) {
		t.Fatalf("a loop that exited while the daemon runs = %v", err)
	}

	// An image's loop ends when the image leaves the config; a loop started
	// again under its name is not forgotten with the old one.
	old := l.start("zuul image a", time.Minute)
	again := l.start("zuul image a", time.Minute)
	old.exit(ctx, true)
	again.begin()
	if err := l.check(time.Now().Add(2 * time.Minute)); err == nil || !strings.Contains(err.Error(), `"zuul image a" is stuck`) {
		t.Fatalf("the restarted loop's stuck pass = %v", err)
	}
	again.exit(ctx, true)

	cancel()
	l2 := loops{}
	l2.running.Store(true)
	l2.start("lifecycle", time.Minute).exit(ctx, false)
	if err := l2.check(time.Now()); err != nil {
		t.Fatalf("a loop that stopped with the daemon: %v", err)
	}
}

// TestHealthZuulBehindCursor: a zuul-image whose Zuul is behind its poll
// cursor makes Health degraded, naming the image and zuul-cursor-reset; once
// the cursor is not behind, Health is nil again. A failing loop is still
// unhealthy, not merely degraded.
func TestHealthZuulBehindCursor(t *testing.T) {
	ctx := context.Background()
	st, raw := storetest.Open(t, store.Options{ImagesDir: t.TempDir()})
	defer st.Close()
	cfg := &config.Config{ZuulImages: []config.ZuulImage{{Name: "debian"}, {Name: "fedora"}}}
	b := &Builder{store: st}
	b.cur.Store(&parts{cfg: cfg})
	b.loops.running.Store(true)
	if err := b.Health(ctx); err != nil {
		t.Fatalf("Health of a working builder = %v", err)
	}

	if err := raw.Write(ctx, store.PutCursor(store.Cursor{Image: "fedora", ZuulID: 1000, ZuulUUID: "abc", Outcome: "ready", BehindID: 7})); err != nil {
		t.Fatal(err)
	}
	err := b.Health(ctx)
	var d *Degraded
	if !errors.As(err, &d) || !d.Degraded() {
		t.Fatalf("Health with Zuul behind a cursor = %v (%T), want *Degraded", err, err)
	}
	for _, w := range []string{"zuul-image fedora", "id 7", "id 1000", "zuul-cursor-reset fedora"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("Health does not say %q: %v", w, err)
		}
	}

	b.loops.running.Store(false)
	err = b.Health(ctx)
	if _, degraded := err.(*Degraded); degraded || err == nil || !strings.Contains(err.Error(), "not running") ||
		!strings.Contains(err.Error(), "zuul-cursor-reset fedora") {
		t.Fatalf("Health with the loops stopped and Zuul behind = %v (%T); want unhealthy, saying both", err, err)
	}
	b.loops.running.Store(true)

	if err := raw.Write(ctx, store.PutCursor(store.Cursor{Image: "fedora", ZuulID: 1000, ZuulUUID: "abc", Outcome: "ready"})); err != nil {
		t.Fatal(err)
	}
	if err := b.Health(ctx); err != nil {
		t.Fatalf("Health once the cursor is not behind = %v", err)
	}
}

// TestHealthWaitingForArtifactHost: a zuul-image whose newest Zuul build
// waits for an artifact host to be allowed makes Health degraded, saying why;
// once it does not wait, Health is nil again.
func TestHealthWaitingForArtifactHost(t *testing.T) {
	ctx := context.Background()
	st, raw := storetest.Open(t, store.Options{ImagesDir: t.TempDir()})
	defer st.Close()
	b := &Builder{store: st}
	b.cur.Store(&parts{cfg: &config.Config{ZuulImages: []config.ZuulImage{{Name: "debian"}}}})
	b.loops.running.Store(true)
	const why = "Zuul build abc is not fetched: add objects.example.com to the zuul-image's artifact-hosts"
	if err := raw.Write(ctx, store.PutCursor(store.Cursor{Image: "debian", Waiting: why})); err != nil {
		t.Fatal(err)
	}
	err := b.Health(ctx)
	var d *Degraded
	if !errors.As(err, &d) || !strings.Contains(err.Error(), "zuul-image debian: "+why) {
		t.Fatalf("Health of a build waiting for a host = %v (%T), want *Degraded saying why", err, err)
	}
	if err := raw.Write(ctx, store.PutCursor(store.Cursor{Image: "debian"})); err != nil {
		t.Fatal(err)
	}
	if err := b.Health(ctx); err != nil {
		t.Fatalf("Health once nothing waits = %v", err)
	}
}
