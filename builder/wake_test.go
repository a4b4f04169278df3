package builder

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/source"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// gatedSource is a source of one image whose every look waits until the test
// lets it go; nothing is ever due.
type gatedSource struct {
	images map[string]time.Duration
	gate   chan struct{} // a value lets one look go

	mu    sync.Mutex
	looks int
}

func (g *gatedSource) Images() map[string]time.Duration { return maps.Clone(g.images) }

func (g *gatedSource) Due(ctx context.Context, image string, _ source.Look) (source.Work, error) {
	g.mu.Lock()
	g.looks++
	g.mu.Unlock()
	select {
	case <-g.gate:
	case <-ctx.Done():
		return source.Work{}, ctx.Err()
	}
	return source.NotDue("the test says so"), nil
}

func (g *gatedSource) Abandon(context.Context, store.Build) error { return nil }

func (g *gatedSource) count() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.looks
}

// newGatedRig is a rig whose only source is a gatedSource with the image
// gate-a looked at every hour.
func newGatedRig(t *testing.T) (r *rig, g *gatedSource, k loopKey) {
	t.Helper()
	r = newRig(t, twoImages, func(o *Options) { o.Read = nil })
	g = &gatedSource{images: map[string]time.Duration{"gate-a": time.Hour}, gate: make(chan struct{})}
	p := *r.b.cur.Load()
	p.sources = map[store.SourceName]source.Source{sourceDir: g}
	r.b.cur.Store(&p)
	return r, g, loopKey{sourceDir, "gate-a"}
}

// waitPasses waits until the loop's passes (steps) have ended n times, as the
// health check counts them, and the loop runs none: from then on it only
// waits, and steps again only when woken (a wake it had before then is
// pending, and answered at once).
func waitPasses(t *testing.T, r *rig, k loopKey, n int) {
	t.Helper()
	name := fmt.Sprintf("%s image %s", k.source, k.image)
	testenv.WaitFor(t, 10*time.Second, fmt.Sprintf("%d steps of %s ended", n, name), func() bool {
		r.b.loops.mu.Lock()
		defer r.b.loops.mu.Unlock()
		rec := r.b.loops.byName[name]
		return rec != nil && rec.passes == n && !rec.ended.Before(rec.began)
	})
}

// TestWakeStepsAtOnce: a woken loop steps at once, not an interval (an hour)
// after its last step; an image with no loop is not woken.
func TestWakeStepsAtOnce(t *testing.T) {
	r, g, k := newGatedRig(t)
	r.run()
	testenv.WaitFor(t, 10*time.Second, "the first step", func() bool { return g.count() == 1 })
	g.gate <- struct{}{}
	waitPasses(t, r, k, 1)

	if !r.b.sup.Load().wake(k) {
		t.Fatal("wake found no loop of gate-a")
	}
	testenv.WaitFor(t, 10*time.Second, "a step right after the wake", func() bool { return g.count() == 2 })
	g.gate <- struct{}{}
	waitPasses(t, r, k, 2)
	if r.b.sup.Load().wake(loopKey{sourceDir, "no-such-image"}) {
		t.Error("wake found a loop of an image no source has")
	}
}

// TestWakeWhileStepRunsMakesOneMoreStep: wakes that come while a step runs
// are answered by one more step, right after it, not by a step each.
func TestWakeWhileStepRunsMakesOneMoreStep(t *testing.T) {
	r, g, k := newGatedRig(t)
	r.run()
	testenv.WaitFor(t, 10*time.Second, "the first step", func() bool { return g.count() == 1 })
	for range 3 {
		r.b.sup.Load().wake(k)
	}
	g.gate <- struct{}{}
	testenv.WaitFor(t, 10*time.Second, "a step right after the one the wakes came during", func() bool { return g.count() == 2 })
	g.gate <- struct{}{}
	waitPasses(t, r, k, 2)
	if n := g.count(); n != 2 {
		t.Fatalf("%d steps after three wakes during the first; want 2", n)
	}
	s := r.b.sup.Load()
	s.mu.Lock()
	pending := len(s.loops[k].wake)
	s.mu.Unlock()
	if pending != 0 {
		t.Fatal("a wake is still pending once the step after the wakes ended")
	}
}
