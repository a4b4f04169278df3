// Package builder owns the loops: it runs the sources that make images and the
// upload lifecycle, on timers as a daemon or each step once, and reloads config.
package builder

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/metrics"
	"github.com/nodepool-builder/nodepool-builder/progress"
	"github.com/nodepool-builder/nodepool-builder/source"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/uploader"
)

// Intervals of the daemon's loops; zero values take the defaults.
type Intervals struct {
	Plan        time.Duration // missing uploads are looked for (at once, too, when a build arrives); 10s
	Cleanup     time.Duration // retention, deletes, recovery, leftovers, nodepool 11's builder gauges; 10s
	Sweep       time.Duration // the leak sweep lists the clouds; 10m
	DIBCheck    time.Duration // a diskimage is checked for being due; 10s
	ConfigCheck time.Duration // the config file is checked for changes; 5s
	// LeftoverAge is how long a file of the builder's must have been left
	// unchanged before a tidy-up takes it for a leftover; 10m.
	LeftoverAge time.Duration
}

func (i *Intervals) defaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&i.Plan, 10*time.Second)
	def(&i.Cleanup, 10*time.Second)
	def(&i.Sweep, 10*time.Minute)
	def(&i.DIBCheck, 10*time.Second)
	def(&i.ConfigCheck, 5*time.Second)
	def(&i.LeftoverAge, 10*time.Minute)
}

// Options configure a Builder.
type Options struct {
	Config *config.Config
	Store  *store.Store
	Logger *slog.Logger
	// UploadWorkers overrides builder.upload-workers when above 0.
	UploadWorkers int
	// BuildWorkers bounds the DIB builds that run at once; default 1.
	BuildWorkers int
	// Read reads the config files again; the daemon reloads when Reload fires
	// and when the files change. Nil: no reloads. Reload is the operator's
	// act: it also applies a change that releases a provider's or an image's
	// every upload, which a change of the files alone never does.
	Read   func() (*config.Snapshot, error)
	Reload <-chan struct{}
	// OpenCloud opens a provider's image service; default: its clouds.yaml entry.
	OpenCloud OpenCloud
	// RetryBase is the uploader's first wait before retrying a failed upload.
	RetryBase time.Duration
	// CleanupGrace bounds the delete of a half-made image when an upload is
	// interrupted, at shutdown too; default uploader.DefaultCleanupGrace.
	CleanupGrace time.Duration
	Intervals    Intervals
	// Metrics records what the builder does and reads its state at scrapes;
	// nil: nothing is recorded.
	Metrics *metrics.Metrics
	// Progress, when set, holds the downloads, uploads and builds while they
	// run; the daemon also leaves them in the images-dir for image-status.
	Progress *progress.Tracker
}

// Builder runs the sources and the upload lifecycle of one images-dir.
type Builder struct {
	opts  Options
	log   *slog.Logger
	store *store.Store
	// runner makes every build, for every source; it outlives reloads.
	runner  *source.Runner
	cfgFile *config.Snapshot // the config files as they were when the builder started

	cur    atomic.Pointer[parts]
	queue  *queue
	wake   chan struct{} // a build arrived: plan uploads now
	retain chan struct{} // an upload is ready: apply retention now

	// onUploadError receives the failures of uploads (--once collects them).
	onUploadError atomic.Pointer[func(error)]
	// gearman serves the builder's gearman functions while the daemon runs.
	gearman atomic.Pointer[gearmanService]
	// loops records the passes of Run's loops, for Health.
	loops loops
	// sup runs the sources' loops while the daemon runs; mqtt runs the
	// listener to Zuul's MQTT reports, which wakes them.
	sup  atomic.Pointer[supervisor]
	mqtt atomic.Pointer[mqttService]
	// streams are the uploads that follow downloads.
	streams streams
}

// New assembles a builder for opts.Config. It fails, wrapping config.ErrUnusable, when
// the config cannot be used (clouds, Zuul URLs, ca-certs).
func New(ctx context.Context, opts Options) (*Builder, error) {
	opts.Intervals.defaults()
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.BuildWorkers <= 0 {
		opts.BuildWorkers = 1
	}
	b := &Builder{
		opts:   opts,
		log:    opts.Logger,
		store:  opts.Store,
		queue:  newQueue(),
		wake:   make(chan struct{}, 1),
		retain: make(chan struct{}, 1),
	}
	b.runner = source.NewRunner(source.Options{Store: opts.Store, Config: b.Config, Logger: opts.Logger,
		Slots: make(chan struct{}, opts.BuildWorkers), Metrics: opts.Metrics})
	p, err := b.assemble(ctx, opts.Config)
	if err != nil {
		return nil, err
	}
	b.cur.Store(p)
	b.watchMetrics()
	// A change of the files from the text loaded is a reason to reload.
	b.cfgFile = opts.Config.Snapshot
	return b, nil
}

// Config is the config the builder runs now.
func (b *Builder) Config() *config.Config { return b.cur.Load().cfg }

func (b *Builder) uploadLimit() int {
	if b.opts.UploadWorkers > 0 {
		return b.opts.UploadWorkers
	}
	return max(b.cur.Load().cfg.Builder.UploadWorkers, 1)
}

func (b *Builder) wakePlanner() {
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// onceParallel bounds the images of one source that Once looks at at a time.
const onceParallel = 16

// Once does every step once, to completion: recovery and leftovers, every
// source's images, the uploads that are missing, retention and deletes, and
// meanwhile the leak sweep; then it sends nodepool 11's builder gauges. It
// returns every failure, and every piece of due work it left undone and why
// (IsNotDone tells them apart), joined.
func (b *Builder) Once(ctx context.Context) error {
	var mu sync.Mutex
	var errs []error
	fail := func(err error) {
		if err != nil {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
	}
	// The sweep waits on the clouds' listings, the steps mostly on the state
	// and Zuul: they overlap, as the daemon's loops do. A sweep is safe beside
	// uploads and deletes: it lists the clouds before it reads the state, and
	// deletes an image only when it saw it unknown on an earlier sweep too.
	var sweep sync.WaitGroup
	sweep.Go(func() { fail(b.cur.Load().uploader.Sweep(ctx)) })
	defer sweep.Wait()
	fail(b.Recover(ctx))
	fail(b.store.MarkOwnedBuilds(ctx))
	// Nothing of this process runs yet and the images-dir lock keeps others out:
	// whatever is left over now is a leftover, however young.
	fail(b.tidy(ctx, b.store.Now()))

	// The uploads that follow downloads fail --once as the planned ones do.
	onErr := func(err error) { fail(err) }
	b.onUploadError.Store(&onErr)
	b.streams.begin(ctx)
	p := b.cur.Load()
	var wg sync.WaitGroup
	for _, src := range p.sources {
		// A source's images are looked at onceParallel at a time: enough to
		// overlap the waits on Zuul, few enough not to flood it or the state.
		slots := make(chan struct{}, onceParallel)
		for image := range src.Images() {
			wg.Go(func() {
				select {
				case slots <- struct{}{}:
				case <-ctx.Done():
					fail(ctx.Err())
					return
				}
				defer func() { <-slots }()
				_, err := b.step(ctx, src, image)
				fail(err)
			})
		}
	}
	wg.Wait()

	fail(b.plan(ctx))
	b.dispatch(ctx, true)
	b.streams.wait()
	b.onUploadError.Store(nil)

	fail(b.lifecycle(ctx))
	fail(b.sendImageStates(ctx))
	sweep.Wait()
	mu.Lock()
	defer mu.Unlock()
	return errors.Join(errs...)
}

// Run runs the daemon's loops until ctx ends, then waits for the work under
// way to stop: builds are killed, uploads interrupted and their half-made images
// deleted within the uploader's clean-up grace.
func (b *Builder) Run(ctx context.Context) error {
	b.loops.running.Store(true)
	defer b.loops.running.Store(false)
	// What a builder that is gone left in flight is settled before anything
	// starts, so that no new step is taken for its owner.
	if err := b.Recover(ctx); err != nil {
		b.log.Error("recovery incomplete; it is tried again on every pass", "error", err)
	}
	if err := b.store.MarkOwnedBuilds(ctx); err != nil {
		b.log.Error("could not mark this builder's builds; it is tried again at the next start", "error", err)
	}
	if err := b.tidy(ctx, b.store.Now()); err != nil {
		b.log.Error("tidy-up incomplete", "error", err)
	}
	b.streams.begin(ctx)
	var wg sync.WaitGroup
	sources := newSupervisor(b)
	b.sup.Store(sources)
	sources.reconcile(ctx)
	// Zuul's reports wake the loops, so they listen once the loops run.
	mqtt := newMQTTService(ctx, b)
	b.mqtt.Store(mqtt)
	b.opts.Metrics.WatchZuulMQTT(mqtt.metrics)
	mqtt.apply(b.cur.Load())
	wg.Go(func() { b.dispatch(ctx, false) })
	wg.Go(func() {
		b.every(ctx, b.opts.Intervals.Plan, b.wake, "plan uploads", b.plan)
	})
	wg.Go(func() {
		b.every(ctx, b.opts.Intervals.Cleanup, b.retain, "lifecycle", func(ctx context.Context) error {
			// Files of work under way keep changing: only those left alone
			// for LeftoverAge are taken for leftovers.
			// Then nodepool 11's builder gauges, as its cleanup worker sends them.
			return errors.Join(b.Recover(ctx), b.lifecycle(ctx), b.tidy(ctx, b.store.Now().Add(-b.opts.Intervals.LeftoverAge)),
				b.sendImageStates(ctx))
		})
	})
	wg.Go(func() {
		b.every(ctx, b.opts.Intervals.Sweep, nil, "leak sweep", func(ctx context.Context) error {
			return b.cur.Load().uploader.Sweep(ctx)
		})
	})
	if b.opts.Read != nil {
		wg.Go(func() { b.watchConfig(ctx, sources) })
	}
	if b.opts.Progress != nil {
		wg.Go(func() { b.writeProgress(ctx) })
	}
	if len(b.cur.Load().cfg.Builder.GearmanServers) > 0 {
		g := newGearmanService(b)
		b.gearman.Store(g)
		b.opts.Metrics.WatchGearman(g.links)
		wg.Go(func() { g.run(ctx) })
	}
	<-ctx.Done()
	b.log.Info("stopping: waiting for the work under way to stop")
	sources.stop()
	wg.Wait()
	b.streams.wait()
	mqtt.wait()
	return nil
}

// every runs step now and then each interval, or sooner when wake fires, until
// ctx ends. A failed step is logged; the next one reads the world afresh.
func (b *Builder) every(ctx context.Context, interval time.Duration, wake <-chan struct{}, what string, step func(context.Context) error) {
	pass := b.loops.start(what, passBound)
	defer pass.exit(ctx, false)
	for {
		pass.begin()
		err := step(ctx)
		pass.end()
		if err != nil && ctx.Err() == nil {
			b.log.Error(what+" had failures", "error", err)
		}
		t := time.NewTimer(interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-wake:
		case <-t.C:
		}
		t.Stop()
	}
}

// IsNotDone tells whether an error of a step says that due work was left
// undone for a reason that is no failure of the step itself: a build held back
// after a failed one, say. It is reported as such, and still fails --once;
// what is not due (a paused image, nothing new from Zuul, another builder on
// it) is no error at all.
func IsNotDone(err error) bool {
	var nd interface{ NotDone() }
	return errors.As(err, &nd)
}

// step runs the core's build path on an image once, and wakes the planner
// when it made a build. An image busy with a step asked for by an operator (a
// gearman job) is left to it.
func (b *Builder) step(ctx context.Context, src source.Source, image string) (*store.Build, error) {
	res, err := b.runner.Step(ctx, src, image)
	if res.Build != nil {
		b.built()
	}
	if res.Skipped != "" {
		b.log.Debug("nothing made", "image", image, "reason", res.Skipped)
	}
	return res.Build, err
}

// buildNow makes a build of an image now, as an operator asked (request names
// the asking), after the step running on it, if any, is done. allow, when not
// nil, is asked once that step is done, so that it sees the build the step
// made: an error from it refuses the build.
func (b *Builder) buildNow(ctx context.Context, src source.Source, image, request string, allow func(context.Context) error) (store.Build, error) {
	built, err := b.runner.BuildNow(ctx, src, image, request, allow)
	if built.State == store.Ready {
		b.built()
	}
	return built, err
}

// built tells the parts that care that a build became ready.
func (b *Builder) built() {
	b.wakePlanner()
	if g := b.gearman.Load(); g != nil {
		g.refresh()
	}
}

// plan queues the uploads that are missing.
func (b *Builder) plan(ctx context.Context) error {
	planned, err := b.cur.Load().uploader.Plan(ctx)
	for _, j := range planned {
		if b.queue.add(j) {
			b.log.Debug("upload queued", "job", j.String())
		}
	}
	return err
}

// dispatch starts queued uploads on up to the upload-workers limit, each on
// the parts current when it starts, until ctx ends or, with untilIdle, until
// nothing is queued or running. It waits for the uploads it started.
func (b *Builder) dispatch(ctx context.Context, untilIdle bool) {
	var wg sync.WaitGroup
	defer wg.Wait()
	var pass *loopPass // the daemon's dispatcher is watched by Health
	if !untilIdle {
		pass = b.loops.start("upload dispatcher", passBound)
		defer pass.exit(ctx, false)
	}
	for {
		j, jctx, ok := b.queue.take(ctx, b.uploadLimit, untilIdle)
		if !ok {
			return
		}
		pass.begin()
		p := b.cur.Load()
		wg.Go(func() {
			up, err := p.uploader.Upload(jctx, j)
			b.queue.done(j, up, err)
			switch {
			case err == nil:
				// Retention may now release older uploads.
				select {
				case b.retain <- struct{}{}:
				default:
				}
			case errors.Is(err, uploader.ErrDropped):
				b.log.Info("upload dropped", "job", j.String(), "reason", err)
			default:
				// An upload interrupted while the builder runs on (its image
				// left the provider's list, its lock was lost) is no failure,
				// and the uploader has logged it.
				if f := b.onUploadError.Load(); f != nil {
					(*f)(err)
				} else if ctx.Err() == nil && !IsNotDone(err) {
					b.log.Error("upload failed", "job", j.String(), "error", err)
				}
			}
		})
		pass.end()
	}
}

// lifecycle drops uploaded files, applies retention and carries out deletes.
func (b *Builder) lifecycle(ctx context.Context) error {
	up := b.cur.Load().uploader
	return errors.Join(up.DropUploaded(ctx), up.Retain(ctx), up.Delete(ctx))
}

// Recover settles what no worker of this process owns: uploads left uploading
// and this builder's builds left building (their processes stopped first, then
// their files removed). It runs at start and on every pass.
func (b *Builder) Recover(ctx context.Context) error {
	p := b.cur.Load()
	return errors.Join(b.runner.Recover(ctx, p.sources), p.uploader.Recover(ctx))
}

// tidy settles the builds of this builder whose records another program
// deleted, and removes the builder's own leftovers last changed before a
// time: temporary files, files of builds the state does not know, partial
// downloads nobody will resume.
func (b *Builder) tidy(ctx context.Context, before time.Time) error {
	cfg := b.cur.Load().cfg
	busy := func(image, buildID string) bool {
		return (image != "" && b.runner.Busy(image)) || (buildID != "" && b.queue.onBuild(buildID))
	}
	lost, lostErr := b.store.SettleLost(ctx, before, busy)
	for _, l := range lost {
		b.warnLost(ctx, cfg, l)
	}
	if lostErr != nil {
		lostErr = fmt.Errorf("settle builds deleted by another program: %w", lostErr)
	}
	zuul := map[string]bool{}
	for _, zi := range cfg.ZuulImages {
		zuul[zi.Name] = true
	}
	removed, err := b.store.RemoveLeftovers(ctx, store.Leftovers{
		Before:     before,
		ZuulImages: zuul,
		Busy:       busy,
	})
	for _, path := range removed {
		b.log.Info("removed leftover file", "path", path)
	}
	if err != nil {
		err = fmt.Errorf("remove leftovers: %w", err)
	}
	return errors.Join(lostErr, err)
}

// nodepoolKeepBuilds is how many ready builds of an image nodepool's cleanup
// keeps (CleanupWorker._cleanupImage, for an image its nodepool.yaml has): it
// deletes the older ones, whichever builder made them.
const nodepoolKeepBuilds = 2

// warnLost says that a build of this builder was deleted by another program,
// and the likely cause: a nodepool.yaml, of a Python nodepool-builder sharing
// the ZooKeeper, that does not have the image, so that its cleanup deletes
// the image's uploads and builds. A build that is not its poll cursor's and
// that the image's ready builds outnumber as nodepool keeps them was rotated
// out: a Python nodepool-builder that has the image deletes such a build as
// this builder would, and may do so first. That is no loss, unless keep-builds
// asks for more builds than nodepool keeps.
func (b *Builder) warnLost(ctx context.Context, cfg *config.Config, l store.LostBuild) {
	args := []any{"image", l.Image, "build", store.BuildName(l.Image, l.ID)}
	ready, err := b.store.Builds(ctx, store.BuildFilter{Image: l.Image, State: store.Ready})
	if err == nil && l.ZuulUUID == "" && len(ready) >= nodepoolKeepBuilds {
		if keep := cfg.Builder.KeepBuilds; keep > nodepoolKeepBuilds {
			b.log.Warn(fmt.Sprintf("a build of this builder was deleted by another program in rotation: keep-builds is %d, "+
				"but a Python nodepool-builder sharing the state keeps the %d newest ready builds of an image and deletes "+
				"the older ones; its files are removed. Set keep-builds to %d or less beside Python nodepool-builders.",
				keep, nodepoolKeepBuilds, nodepoolKeepBuilds), args...)
			return
		}
		b.log.Info(fmt.Sprintf("a build of this builder was deleted in rotation by another builder, which keeps the %d "+
			"newest ready builds of an image as this builder does: its files are removed", nodepoolKeepBuilds), args...)
		return
	}
	cause := fmt.Sprintf("Likely cause: a Python nodepool-builder sharing the state whose nodepool.yaml does not "+
		"list %s under diskimages deletes its builds and uploads (so does nodepool dib-image-delete).", l.Image)
	if zi := cfg.ZuulImage(l.Image); zi != nil {
		cause = fmt.Sprintf("Likely cause: a Python nodepool-builder sharing the state whose nodepool.yaml does not "+
			"declare zuul-image %s: add \"- {name: %s, pause: true}\" under diskimages in the nodepool.yaml of every "+
			"nodepool-builder and launcher (or nodepool dib-image-delete was run).", l.Image, l.Image)
	}
	if l.ZuulUUID != "" {
		args = append(args, "zuul_build", l.ZuulUUID)
		cause += " That Zuul build is not fetched again on its own: the next one is, or a gearman image-build:" + l.Image +
			" job fetches it now."
	}
	b.log.Warn("a build of this builder was deleted by another program, not by this builder: its files are removed. "+cause, args...)
}
