package builder

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/uploader"
)

// supervisor runs one loop per image of every source, each on its own timer,
// so that a long build of one image holds up no other image, no poll, no upload.
// On a reload it starts the loops of new images and cancels those of images the
// config dropped; the other loops take the new config at their next step, and a
// step already running finishes under the config it started with. A loop
// waiting for its next step takes a changed interval at once: its next step is
// due the new interval after its last one.
//
// A loop can be woken: its next step starts at once, whatever its interval.
// A wake while a step runs makes the next step start right after it; wakes
// that come together make one step, never a step each.
type supervisor struct {
	b     *Builder
	mu    sync.Mutex
	loops map[loopKey]*loopHandle
	wg    sync.WaitGroup
	// reloaded is closed, and replaced, when a reload made new parts: the
	// loops read their intervals again.
	reloaded chan struct{}
}

type loopKey struct {
	source store.SourceName
	image  string
}

// loopHandle is what the supervisor holds of a running loop.
type loopHandle struct {
	cancel context.CancelFunc
	// wake holds one pending wake: the next step is due now.
	wake chan struct{}
}

func newSupervisor(b *Builder) *supervisor {
	return &supervisor{b: b, loops: map[loopKey]*loopHandle{}, reloaded: make(chan struct{})}
}

// wake makes the next step of an image's loop due now: at once when the loop
// waits, right after the step it runs otherwise. It tells whether the image
// has a loop.
func (s *supervisor) wake(k loopKey) bool {
	s.mu.Lock()
	h, ok := s.loops[k]
	s.mu.Unlock()
	if !ok {
		return false
	}
	select {
	case h.wake <- struct{}{}:
	default: // a wake is pending already: one step answers both
	}
	return true
}

// changed returns the channel that is closed at the next reload.
func (s *supervisor) changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reloaded
}

// reconcile starts and stops loops to match the current config.
func (s *supervisor) reconcile(ctx context.Context) {
	p := s.b.cur.Load()
	want := map[loopKey]bool{}
	for kind, src := range p.sources {
		for image := range src.Images() {
			want[loopKey{kind, image}] = true
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	close(s.reloaded)
	s.reloaded = make(chan struct{})
	for k, h := range s.loops {
		if !want[k] {
			s.b.log.Info("image dropped from the config; stopping its work", "image", k.image, "source", k.source)
			h.cancel()
			delete(s.loops, k)
		}
	}
	for k := range want {
		if _, ok := s.loops[k]; ok {
			continue
		}
		lctx, cancel := context.WithCancel(ctx)
		h := &loopHandle{cancel: cancel, wake: make(chan struct{}, 1)}
		s.loops[k] = h
		s.wg.Go(func() { s.loop(lctx, k, h.wake) })
	}
}

// loop steps one image until its context ends. The next step is due its
// image's interval after the last step ended, the interval as the config says
// now: a reload that shortens it makes the step due at once when that time has
// passed, rather than at the end of the old interval. A wake makes it due at once.
func (s *supervisor) loop(ctx context.Context, k loopKey, wake <-chan struct{}) {
	b := s.b
	pass := b.loops.start(fmt.Sprintf("%s image %s", k.source, k.image), b.stepBound(k.image))
	// A loop ends when its image leaves the config, which is no failure.
	defer pass.exit(ctx, true)
	held := "" // what was last said of due work held back, said once
	for {
		src, ok := b.cur.Load().sources[k.source]
		if !ok {
			return
		}
		if _, ok := src.Images()[k.image]; !ok {
			return
		}
		pass.begin()
		_, err := b.step(ctx, src, k.image)
		pass.end()
		switch {
		case err == nil || ctx.Err() != nil:
			held = ""
		case IsNotDone(err):
			// Said again on every check until it changes, it would drown the log.
			if msg := err.Error(); msg != held {
				b.log.Warn("image not built", "image", k.image, "source", k.source, "reason", err)
				held = msg
			}
		default:
			held = ""
			b.log.Error("step failed", "image", k.image, "source", k.source, "error", err)
		}
		last := time.Now()
		if !s.wait(ctx, k, last, wake) {
			return
		}
	}
}

// wait waits until the image's next step is due, its interval after last or
// at once when the loop is woken; it returns false when the loop is to end
// (ctx ended, or the image left the config).
func (s *supervisor) wait(ctx context.Context, k loopKey, last time.Time, wake <-chan struct{}) bool {
	for {
		// Read before the interval, so that a reload in between is not missed.
		reloaded := s.changed()
		src, ok := s.b.cur.Load().sources[k.source]
		if !ok {
			return false
		}
		every, ok := src.Images()[k.image]
		if !ok {
			return false
		}
		select {
		case <-wake: // came while the step ran
			return true
		default:
		}
		due := time.Until(last.Add(every))
		if due <= 0 {
			return true
		}
		t := time.NewTimer(due)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-reloaded:
			t.Stop()
		case <-wake:
			t.Stop()
			return true
		case <-t.C:
			return true
		}
	}
}

// stop waits for every loop; their contexts end with the daemon's.
func (s *supervisor) stop() {
	s.wg.Wait()
}

// watchConfig reloads the config on the Reload signal and when a config file
// changes. A config that does not load, or cannot be used, is reported and the
// running one stays. A change of the files that widens what the builder does
// or trusts, or releases what it keeps, is held until the Reload signal
// confirms it (see toConfirm): a file cut short by a full disk or an
// interrupted write, or removed, holds still and may well load.
func (b *Builder) watchConfig(ctx context.Context, sources *supervisor) {
	files := b.cur.Load().cfg.Files
	file := configFile{last: b.cfgFile}
	t := time.NewTicker(b.opts.Intervals.ConfigCheck)
	defer t.Stop()
	for {
		var why string
		var snap *config.Snapshot
		confirmed := false
		select {
		case <-ctx.Done():
			return
		case <-b.opts.Reload:
			why, confirmed = "reload signal", true
			var err error
			if snap, err = b.opts.Read(); err != nil {
				b.log.Error("config not reloaded; the running one stays", "reason", why, "error", err)
				continue
			}
			file.settle(snap)
		case <-t.C:
			now, err := b.opts.Read()
			if err != nil || !file.changed(now) {
				continue
			}
			why, snap = "config file changed", now
		}
		applied, err := b.reload(ctx, sources, snap, confirmed)
		var held heldError
		switch {
		case errors.As(err, &held):
			b.log.Warn(held.Error()+"; send SIGHUP to the daemon (systemctl reload) to apply it, "+
				"or correct the files", append(held.attrs(), "reason", why, "files", files.Nodepool)...)
			continue
		case err != nil:
			b.log.Error("config not reloaded; the running one stays", "reason", why, "error", err)
			continue
		}
		cfg := b.cur.Load().cfg
		attrs := []any{"reason", why, "diskimages", len(cfg.DiskImages), "zuul_images", len(cfg.ZuulImages), "providers", len(cfg.Providers)}
		if len(applied.changes) > 0 {
			attrs = append(attrs, "changes", applied.changes)
		}
		b.log.Info("config reloaded", attrs...)
		if len(applied.drops) > 0 {
			b.log.Warn("the reloaded config releases what drops lists, as the reload signal confirmed", "drops", applied.drops)
		}
		for _, w := range cfg.Warnings {
			b.log.Warn(w)
		}
	}
}

// configFile tells a change of the config files that is done from one under
// way. A file rewritten in place can be read half-written, and half a config may
// well load: one that lists fewer images would have their uploads, files and
// records deleted. So a change counts once the files have read the same at two
// checks in a row. (A file cut short and left so holds still: toConfirm
// guards against that.)
type configFile struct {
	last    *config.Snapshot // what the running config was loaded from, as last settled
	pending *config.Snapshot // a different content seen at the last check
}

// changed takes the files read at a check and reports whether they hold a new
// content that held still since the check before.
func (f *configFile) changed(now *config.Snapshot) bool {
	if now.Equal(f.last) {
		f.pending = nil
		return false
	}
	if f.pending == nil || !now.Equal(f.pending) {
		f.pending = now
		return false
	}
	f.settle(now)
	return true
}

// settle takes a content as judged, by a check or by the Reload signal: it is
// no change from now on.
func (f *configFile) settle(now *config.Snapshot) {
	f.last, f.pending = now, nil
}

// confirmation is what a change of the config does that only the
// operator's confirmation, the Reload signal, may apply.
type confirmation struct {
	// changes are the keys whose change a file change alone never applies:
	// the builder's own settings, a post-upload-hook taken away.
	changes []string
	// drops are what the change would release (dropsToConfirm).
	drops []string
}

// none tells whether the change needs no confirmation.
func (c confirmation) none() bool { return len(c.changes) == 0 && len(c.drops) == 0 }

// toConfirm says what a change from the running config to next does that
// only the operator's confirmation may apply:
//
//   - any change of the builder's own settings (zuul-images and builder), its
//     file coming or going included. A file cut short or removed brings the
//     keys it lost back to their defaults, which widen what the builder does
//     and trusts (gearman functions, build-diskimages, a zuul-image's branch)
//     or drop what it keeps (keep-builds). Holding every change of them is a
//     rule the operator can predict; a list of the keys that widen would not be.
//   - a provider's post-upload-hook taken away: later uploads would go unchecked.
//   - what dropsToConfirm lists, in any file.
//
// nodepool.yaml's other keys are nodepool's, whose own daemons take their
// changes by themselves; the secure file holds the ZooKeeper settings, which
// apply at the next start only, and diskimages' secrets.
func toConfirm(running, next *config.Config) confirmation {
	return confirmation{changes: running.HeldChanges(next), drops: dropsToConfirm(running, next)}
}

// heldError is a reload held back until the operator confirms it.
type heldError struct{ confirmation }

func (e heldError) Error() string {
	return "config change held: " + e.why()
}

// why says why the change is held, naming the log attributes of attrs.
func (e heldError) why() string {
	var why []string
	if len(e.changes) > 0 {
		why = append(why, "it changes the keys changes lists, which a file change alone does not apply")
	}
	if len(e.drops) > 0 {
		why = append(why, "it would release what drops lists")
	}
	return strings.Join(why, "; ")
}

// attrs are the log attributes of what is held: the keys (never their
// values, which may be secrets) and what would be released.
func (e heldError) attrs() []any {
	var out []any
	if len(e.changes) > 0 {
		out = append(out, "changes", e.changes)
	}
	if len(e.drops) > 0 {
		out = append(out, "drops", e.drops)
	}
	return out
}

// dropsToConfirm says what a change from the running config to next releases
// that only the operator's confirmation may apply: every upload of a provider
// (it goes, or lists none of the images it listed), every upload of an image
// (no provider lists it any more), every image. Each is what a file cut short
// looks like; a change that keeps some of each is an edit. It judges by the
// images the running config lists, which is what their uploads are for.
func dropsToConfirm(running, next *config.Config) []string {
	var drops []string
	listedBefore := []string{} // in the order the running providers list them
	for _, p := range running.Providers {
		if len(p.DiskImages) == 0 {
			continue
		}
		var names []string
		for _, i := range p.DiskImages {
			names = append(names, i.Name)
			if !slices.Contains(listedBefore, i.Name) {
				listedBefore = append(listedBefore, i.Name)
			}
		}
		switch np := next.Provider(p.Name); {
		case np == nil:
			drops = append(drops, fmt.Sprintf("provider %s: every upload (it is no longer in the config)", p.Name))
		case !slices.ContainsFunc(names, func(n string) bool { return np.Entry(n) != nil }):
			drops = append(drops, fmt.Sprintf("provider %s: every upload (it no longer lists %s)", p.Name, strings.Join(names, ", ")))
		}
	}
	for _, image := range listedBefore {
		if !slices.ContainsFunc(next.Providers, func(p config.Provider) bool { return p.Entry(image) != nil }) {
			drops = append(drops, fmt.Sprintf("image %s: every upload (no provider lists it)", image))
		}
	}
	if len(running.ImageNames()) > 0 && len(next.ImageNames()) == 0 {
		drops = append(drops, "every image (the config lists none)")
	}
	return drops
}

// reload loads and assembles a snapshot of the config files and makes it
// current: loops of dropped images stop, new images get loops, uploads the new
// config no longer asks for are cancelled, and the planner looks at once.
// Unless confirmed, a config with something to confirm (toConfirm) is not
// taken: the error is a heldError. It returns what it applied that needed the
// confirmation.
func (b *Builder) reload(ctx context.Context, sources *supervisor, snap *config.Snapshot, confirmed bool) (confirmation, error) {
	cfg, err := snap.Load()
	if err != nil {
		return confirmation{}, err
	}
	// What the builder would refuse at start, a reload refuses too.
	if problems := checkHost(ctx, cfg); len(problems) > 0 {
		return confirmation{}, &CheckError{Path: cfg.Path, Problems: problems}
	}
	confirm := toConfirm(b.cur.Load().cfg, cfg)
	if !confirm.none() && !confirmed {
		return confirmation{}, heldError{confirm}
	}
	p, err := b.assemble(ctx, cfg)
	if err != nil {
		return confirmation{}, err
	}
	for _, msg := range b.cur.Load().cfg.Restarts(cfg) {
		b.log.Warn(msg)
	}
	if old := b.cur.Load().cfg.ZooKeeper; !old.Equal(cfg.ZooKeeper) {
		b.log.Warn("the ZooKeeper settings changed (zookeeper-servers, zookeeper-tls or zookeeper-timeout); the builder " +
			"keeps its state where it opened it until it is restarted")
	}
	b.cur.Store(p)
	sources.reconcile(ctx)
	if m := b.mqtt.Load(); m != nil {
		m.apply(p) // after the loops it wakes
	}
	if g := b.gearman.Load(); g != nil {
		g.refresh() // images may have come or gone
	}
	for _, j := range b.queue.cancel(func(j uploader.Planned) bool {
		prov := cfg.Provider(j.Provider)
		return prov == nil || prov.Entry(j.Build.Image) == nil
	}) {
		b.log.Info("upload stopped: the config no longer asks for it", "job", j.String())
	}
	b.queue.signal() // upload-workers may have changed
	b.wakePlanner()
	return confirm, nil
}
