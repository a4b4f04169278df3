// Package dib builds diskimages locally with diskimage-builder, exactly as nodepool
// does: it decides when an image is due, runs disk-image-create and records the build.
package dib

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/metrics"
	"github.com/nodepool-builder/nodepool-builder/progress"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// Defaults of Options.
const (
	DefaultFailureBackoff = 10 * time.Minute
	DefaultKillGrace      = 30 * time.Second
	DefaultCheckInterval  = 10 * time.Second
)

// ErrUnknownImage is returned (wrapped) for an image that is not a diskimage of the config.
var ErrUnknownImage = errors.New("not a diskimage of the config")

// ErrBuilding is returned (wrapped) by Build when this Source is already building the image.
var ErrBuilding = errors.New("a build of this image is already running")

// Options configure a Source.
type Options struct {
	Store  *store.Store
	Config *config.Config
	Logger *slog.Logger     // default slog.Default()
	Now    func() time.Time // default time.Now; give the store the same clock
	// FailureBackoff is how long after a failed build the image is not built
	// again, unless an operator requests a build.
	FailureBackoff time.Duration // default 10m
	// KillGrace is how long a timed-out or cancelled build gets between SIGTERM,
	// which lets DIB unmount what it mounted, and SIGKILL.
	KillGrace time.Duration // default 30s
	// Slots bounds the builds that run at once (nodepool's --build-workers): a
	// build holds a slot while it runs. It outlives a Source, so that a reload
	// does not lift the bound. Nil: no bound.
	Slots chan struct{}
	// CheckInterval is how often an image is checked for being due; default 10s.
	CheckInterval time.Duration
	// QemuImg checks what DIB made; empty means "qemu-img" from PATH.
	QemuImg string
	// Metrics is told of every finished build; nil: nobody is.
	Metrics *metrics.Metrics
	// Progress, when set, holds a task for each build while DIB runs, its note
	// the step DIB is at.
	Progress *progress.Tracker
}

// Source builds the diskimages of a config, one at a time. Its methods are
// steps: the daemon calls Step in a loop, --once calls it once.
type Source struct {
	opts Options
	log  *slog.Logger

	mu      sync.Mutex
	running map[string]bool // images being built by this Source
}

// New returns a Source.
func New(opts Options) *Source {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.FailureBackoff <= 0 {
		opts.FailureBackoff = DefaultFailureBackoff
	}
	if opts.KillGrace <= 0 {
		opts.KillGrace = DefaultKillGrace
	}
	return &Source{opts: opts, log: opts.Logger, running: map[string]bool{}}
}

// Images lists the diskimages of the config that are built (not abstract), each
// with how often it is checked for being due.
func (b *Source) Images() map[string]time.Duration {
	every := b.opts.CheckInterval
	if every <= 0 {
		every = DefaultCheckInterval
	}
	out := map[string]time.Duration{}
	for _, img := range b.opts.Config.DiskImages {
		out[img.Name] = every
	}
	return out
}

// Step builds an image when it is due, waiting for a build slot first, and
// returns the ready build; nil when the image was not due.
//
// An image that is due but held back by the backoff after a failed build is
// not built, and Step says so with a *HeldBack error: due work not done.
func (b *Source) Step(ctx context.Context, image string) (*store.Build, error) {
	reason, back, err := b.check(ctx, image)
	switch {
	case err != nil:
		return nil, err
	case back != nil:
		return nil, back
	case reason == "":
		return nil, nil
	}
	if b.opts.Slots != nil {
		select {
		case b.opts.Slots <- struct{}{}:
			defer func() { <-b.opts.Slots }()
		case <-ctx.Done():
			return nil, fmt.Errorf("build %s: waiting for a build worker: %w", image, ctx.Err())
		}
	}
	// The image's build lock, as nodepool's builders take it: another holder
	// builds it, and this builder leaves it alone.
	held, err := b.opts.Store.TryLock(ctx, store.LockKey{Image: image})
	if errors.Is(err, store.ErrHeld) {
		b.log.Info("another builder holds the image's build lock; it builds the image", "image", image)
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("build %s: %w", image, err)
	}
	defer held.Release()
	ctx, cancel := store.UnderLock(ctx, held)
	defer cancel()
	// The wait for a slot may have been long, and the lock's last holder may
	// have just built it: the image may no longer be due.
	reason, back, err = b.checkLocked(ctx, image)
	switch {
	case err != nil:
		return nil, err
	case back != nil:
		return nil, back
	case reason == "":
		return nil, nil
	}
	b.log.Info("image build due", "image", image, "reason", reason)
	built, err := b.Build(ctx, image)
	if built.State != store.Ready {
		return nil, err
	}
	return &built, err // a ready build, and maybe a failure of its housekeeping
}

// ErrPaused is returned (wrapped) by BuildNow for an image that is paused.
var ErrPaused = errors.New("paused")

// BuildNow builds an image now, whatever its schedule says, as an operator's
// request (a gearman job) asks, and returns the ready build; request is
// recorded on it. A paused image, or one another builder holds the build lock
// of, is refused.
func (b *Source) BuildNow(ctx context.Context, image, request string) (store.Build, error) {
	img := b.opts.Config.DiskImage(image)
	if img == nil {
		return store.Build{}, fmt.Errorf("build %s: %w", image, ErrUnknownImage)
	}
	paused, err := b.opts.Store.Paused(ctx)
	if err != nil {
		return store.Build{}, fmt.Errorf("build %s: %w", image, err)
	}
	if _, ok := paused[image]; ok {
		return store.Build{}, fmt.Errorf("build %s: %w by image-pause; image-unpause it first", image, ErrPaused)
	}
	if img.Pause {
		return store.Build{}, fmt.Errorf("build %s: %w in the config (pause: true)", image, ErrPaused)
	}
	if b.opts.Slots != nil {
		select {
		case b.opts.Slots <- struct{}{}:
			defer func() { <-b.opts.Slots }()
		case <-ctx.Done():
			return store.Build{}, fmt.Errorf("build %s: waiting for a build worker: %w", image, ctx.Err())
		}
	}
	held, err := b.opts.Store.TryLock(ctx, store.LockKey{Image: image})
	if errors.Is(err, store.ErrHeld) {
		return store.Build{}, fmt.Errorf("build %s: another builder holds the image's build lock and is building it; ask again when it is done: %w", image, err)
	}
	if err != nil {
		return store.Build{}, fmt.Errorf("build %s: %w", image, err)
	}
	defer held.Release()
	ctx, cancel := store.UnderLock(ctx, held)
	defer cancel()
	b.log.Info("image build asked for", "image", image, "request", request)
	return b.build(ctx, image, request)
}

// Due says whether an image needs a build now, and why ("" = not due). A paused
// image is never due. A manual request makes it due at once; otherwise it is due
// when it has no ready build, when its newest ready build is older than
// rebuild-age or lacks a format the config needs, but not within FailureBackoff
// of a failed build.
func (b *Source) Due(ctx context.Context, image string) (string, error) {
	reason, _, err := b.check(ctx, image)
	return reason, err
}

// check is Due, and says too when the image would be due but a failed build
// holds it back.
func (b *Source) check(ctx context.Context, image string) (string, *HeldBack, error) {
	return b.checkAt(ctx, image, false)
}

// checkLocked is check under the image's lock: a build request is read from
// the state itself, since the last holder of the lock may have just built the
// image and cleared its request, which a lagging listing may not show yet.
func (b *Source) checkLocked(ctx context.Context, image string) (string, *HeldBack, error) {
	return b.checkAt(ctx, image, true)
}

func (b *Source) checkAt(ctx context.Context, image string, locked bool) (string, *HeldBack, error) {
	cfg, st := b.opts.Config, b.opts.Store
	img := cfg.DiskImage(image)
	if img == nil {
		return "", nil, fmt.Errorf("check whether %s is due: %w", image, ErrUnknownImage)
	}
	if img.Pause || b.isRunning(image) {
		return "", nil, nil
	}
	paused, err := st.Paused(ctx)
	if err != nil {
		return "", nil, fmt.Errorf("check whether %s is due: %w", image, err)
	}
	if _, ok := paused[image]; ok {
		return "", nil, nil
	}
	requests, err := st.BuildRequests(ctx)
	if err != nil {
		return "", nil, fmt.Errorf("check whether %s is due: %w", image, err)
	}
	builds, err := st.Builds(ctx, store.BuildFilter{Image: image})
	if err != nil {
		return "", nil, fmt.Errorf("check whether %s is due: %w", image, err)
	}
	at, ok := requests[image]
	if ok && locked {
		if at, ok, err = st.BuildRequest(ctx, image); err != nil {
			return "", nil, fmt.Errorf("check whether %s is due: %w", image, err)
		}
	}
	if ok {
		settled := newestReady(builds, image)
		if settled == nil || !settled.Created.After(at) {
			return "manual build requested at " + at.Format(time.RFC3339), nil, nil
		}
		// A build made since the request is ready: its builder recorded it,
		// but the answer, and so the clearing of the request, was lost.
		b.log.Info("build request already settled by a ready build; clearing it", "image", image, "build", settled.Name())
		if err := st.ClearBuildRequest(ctx, image, settled.Created); err != nil {
			return "", nil, fmt.Errorf("check whether %s is due: %w", image, err)
		}
	}
	now := b.opts.Now()
	reason := dueReason(cfg, img, builds, now)
	if reason == "" {
		return "", nil, nil
	}
	// A build that failed since the newest ready one: give whatever broke it
	// time to mend rather than building again and again. A build the builder
	// stopped did not fail, and holds nothing back.
	if f := LastFailure(cfg, image, builds, b.opts.FailureBackoff); f != nil && now.Before(f.NextAttempt) {
		return "", &HeldBack{Image: image, Failure: *f, Backoff: b.opts.FailureBackoff}, nil
	}
	return reason, nil, nil
}

// dueReason says why an image needs a build at a time, from its builds (newest
// first), failures and requests aside; "" when it does not.
func dueReason(cfg *config.Config, img *config.DiskImage, builds []store.Build, now time.Time) string {
	image := img.Name
	newest := newestReady(builds, image)
	if newest == nil {
		return "no ready build"
	}
	if age := now.Sub(newest.StateTime); age >= img.RebuildAge {
		return fmt.Sprintf("newest build %s is %s old (rebuild-age %s)", newest.Name(), age.Round(time.Second), img.RebuildAge)
	}
	// A build's recorded formats count even when a file was removed after
	// upload (keep-formats, delete-after-upload), as in nodepool.
	var have []string
	for _, f := range newest.Files {
		have = append(have, f.Format)
	}
	var missing []string
	for _, f := range buildFormats(cfg, image) {
		if !slices.Contains(have, f) {
			missing = append(missing, f)
		}
	}
	if len(missing) > 0 {
		return fmt.Sprintf("newest build %s lacks %s", newest.Name(), strings.Join(missing, ", "))
	}
	return ""
}

// newestReady is the newest ready build of image among builds, newest first.
func newestReady(builds []store.Build, image string) *store.Build {
	for i := range builds {
		if builds[i].Image == image && builds[i].State == store.Ready {
			return &builds[i]
		}
	}
	return nil
}

// claim marks image as being built; false when it already is.
func (b *Source) claim(image string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.running[image] {
		return false
	}
	b.running[image] = true
	return true
}

func (b *Source) release(image string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.running, image)
}

func (b *Source) isRunning(image string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.running[image]
}
