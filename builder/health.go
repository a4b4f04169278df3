package builder

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nodepool-builder/nodepool-builder/store"
)

// Bounds on a pass of the daemon's loops, past which Health calls the loop
// stuck. A pass of a timer loop (planning uploads, the lifecycle, the leak
// sweep) talks to the state and the clouds, each call with its own timeout;
// half an hour is far past any such pass that still makes progress. A source's
// step builds or fetches one image: a DIB build is bounded by the diskimage's
// build-timeout, to which passBound is added for its uploads of logs and
// clean-up; a Zuul fetch of many gigabytes over a slow link may take hours.
const (
	passBound      = 30 * time.Minute
	zuulStepBound  = 4 * time.Hour
	storeProbeTime = 5 * time.Second // the state's answer to Health's read
)

// loops records the passes of the daemon's loops, for Health.
type loops struct {
	running atomic.Bool // Run is running
	mu      sync.Mutex
	byName  map[string]*loopRecord
}

type loopRecord struct {
	bound        time.Duration // a pass running longer is stuck; 0: never
	began, ended time.Time     // the last pass's; began after ended while it runs
	gone         bool          // the loop exited while the daemon ran
	passes       int           // passes ended
}

// start registers a loop; the returned record's pass and exit are its to call.
func (l *loops) start(name string, bound time.Duration) *loopPass {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byName == nil {
		l.byName = map[string]*loopRecord{}
	}
	r := &loopRecord{bound: bound}
	l.byName[name] = r
	return &loopPass{l: l, name: name, r: r}
}

// loopPass is one loop's handle on its record.
type loopPass struct {
	l    *loops
	name string
	r    *loopRecord // a loop started again under the same name has a new one
}

// begin and end mark a pass; a nil *loopPass marks nothing.
func (p *loopPass) begin() {
	if p == nil {
		return
	}
	p.l.mu.Lock()
	p.r.began = time.Now()
	p.l.mu.Unlock()
}

func (p *loopPass) end() {
	if p == nil {
		return
	}
	p.l.mu.Lock()
	p.r.ended = time.Now()
	p.r.passes++
	p.l.mu.Unlock()
}

// Passes is what Passes tells of a loop: how many passes it ended, and when
// its last one began and ended.
type Passes struct {
	Count        int
	Began, Ended time.Time
}

// Passes tells, by loop name ("plan uploads", "lifecycle", "leak sweep",
// "upload dispatcher"), how many passes the daemon's loops made and when the
// last one ran.
func (b *Builder) Passes() map[string]Passes {
	b.loops.mu.Lock()
	defer b.loops.mu.Unlock()
	out := map[string]Passes{}
	for name, r := range b.loops.byName {
		out[name] = Passes{Count: r.passes, Began: r.began, Ended: r.ended}
	}
	return out
}

// exit records that the loop returned: gone when ctx, the daemon's, still
// runs and the loop was not meant to stop (expected), forgotten otherwise.
func (p *loopPass) exit(ctx context.Context, expected bool) {
	p.l.mu.Lock()
	defer p.l.mu.Unlock()
	if ctx.Err() == nil && !expected {
		p.r.gone = true
		return
	}
	if p.l.byName[p.name] == p.r {
		delete(p.l.byName, p.name)
	}
}

// check says which loops are stuck or gone at now.
func (l *loops) check(now time.Time) error {
	if !l.running.Load() {
		return errors.New("the builder's loops are not running")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	var errs []error
	names := make([]string, 0, len(l.byName))
	for name := range l.byName {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		r := l.byName[name]
		switch {
		case r.gone:
			errs = append(errs, fmt.Errorf("loop %q stopped while the daemon runs", name))
		case r.bound > 0 && r.began.After(r.ended) && now.Sub(r.began) > r.bound:
			errs = append(errs, fmt.Errorf("loop %q is stuck: its pass began %s ago (bound %s)",
				name, now.Sub(r.began).Round(time.Second), r.bound))
		}
	}
	return errors.Join(errs...)
}

// Health says whether the daemon works: nil when Run's loops are alive (none
// has stopped, no pass runs past its bound), the state answers a read within a
// few seconds and nothing waits for the operator; otherwise an error saying
// what is wrong. When the daemon works but something waits for the operator (a
// zuul-image's Zuul is behind its poll cursor, or its newest Zuul build has
// an artifact on a host it does not allow), the error is a *Degraded.
func (b *Builder) Health(ctx context.Context) error {
	errs := []error{b.loops.check(time.Now())}
	ctx, cancel := context.WithTimeout(ctx, storeProbeTime)
	defer cancel()
	cfg := b.Config()
	probe := "health"
	if names := cfg.ImageNames(); len(names) > 0 {
		probe = names[0]
	}
	// One poll cursor: a single small read in every backend.
	if _, err := b.store.Cursor(ctx, probe); err != nil {
		errs = append(errs, fmt.Errorf("the state does not answer: %w", err))
		return errors.Join(errs...)
	}
	// Each zuul-image's cursor: one small read each.
	var degraded Degraded
	for _, zi := range cfg.ZuulImages {
		cur, err := b.store.Cursor(ctx, zi.Name)
		if errors.Is(err, store.ErrRefusedRecord) {
			// The state answers; what it holds stops this zuul-image's polls.
			degraded.Reasons = append(degraded.Reasons, fmt.Sprintf("zuul-image %s: %v", zi.Name, err))
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("the state does not answer: %w", err))
			break
		}
		if cur.Waiting != "" {
			degraded.Reasons = append(degraded.Reasons, fmt.Sprintf("zuul-image %s: %s", zi.Name, cur.Waiting))
		}
		if cur.BehindID != 0 {
			degraded.Reasons = append(degraded.Reasons, fmt.Sprintf("zuul-image %s: Zuul's newest build (id %d) is behind the poll "+
				"cursor (id %d) and is not fetched; if Zuul's database was rebuilt or restored, run zuul-cursor-reset %s",
				zi.Name, cur.BehindID, cur.ZuulID, zi.Name))
		}
	}
	if err := errors.Join(errs...); err != nil {
		if len(degraded.Reasons) > 0 {
			err = errors.Join(err, errors.New(degraded.Error()))
		}
		return err
	}
	if len(degraded.Reasons) > 0 {
		return &degraded
	}
	return nil
}

// Degraded is Health's answer when the daemon works but something waits for
// the operator: /healthz says so without calling the daemon unhealthy, as a
// restart would not help.
type Degraded struct {
	Reasons []string
}

func (d *Degraded) Error() string { return strings.Join(d.Reasons, "; ") }

// Degraded tells that the daemon works.
func (d *Degraded) Degraded() bool { return true }

// stepBound is how long a source's step on an image may run before Health
// calls it stuck.
func (b *Builder) stepBound(image string) time.Duration {
	if di := b.Config().DiskImage(image); di != nil {
		return di.BuildTimeout + passBound
	}
	return zuulStepBound
}
