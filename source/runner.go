package source

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/internal/diskspace"
	"github.com/nodepool-builder/nodepool-builder/metrics"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// Options configure a Runner.
type Options struct {
	Store *store.Store
	// Config is the config in force now; it is read on every step, so that a
	// reload pauses and unpauses images.
	Config func() *config.Config
	Logger *slog.Logger // default slog.Default()
	// Slots bounds the work that takes a build slot (Todo.Slot) at once:
	// builder.build-workers. Nil: no bound.
	Slots chan struct{}
	Now   func() time.Time // default time.Now
	// Metrics is told when a build is being made; nil: nobody is.
	Metrics *metrics.Metrics
}

// Runner makes the builds of every source of one builder. It outlives reloads:
// the images it is on, the build slots and the images waiting for free space
// are not forgotten by one.
type Runner struct {
	opts  Options
	log   *slog.Logger
	busy  busyImages
	space *spaceBackoff
}

// NewRunner returns a Runner.
func NewRunner(opts Options) *Runner {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Runner{opts: opts, log: opts.Logger, space: newSpaceBackoff()}
}

// Result is what one step on an image did.
type Result struct {
	// Build is the build the step made ready (or added files to); nil when
	// none.
	Build *store.Build
	// Skipped says why nothing was made, when nothing was.
	Skipped string
}

// Busy tells whether a step of this runner is on the image: its building
// record, partial downloads and conversions have an owner.
func (r *Runner) Busy(image string) bool { return r.busy.has(image) }

// Step looks at an image once and, when its source finds work due, makes it.
// An image a step is on already is left to it. Due work that was held back is
// an error that implements NotDone(); what is not due (a paused image, nothing
// new, another builder on it) is no error, and Result.Skipped says why.
func (r *Runner) Step(ctx context.Context, src Source, image string) (Result, error) {
	if !r.busy.tryEnter(image) {
		return Result{Skipped: "a step of this builder is on it"}, nil
	}
	defer r.busy.leave(image)
	return r.run(ctx, src, image, Look{})
}

// BuildNow makes a build of an image now, as an operator asked (request, when not
// empty, names the asking and is recorded on a new build), once the step
// running on the image, if any, is done: a new build whatever the schedule
// says, or, for a source that fetches, the build that is there already when
// there is nothing new. allow, when not nil, is asked once that step is done,
// so that it sees the build the step made: an error from it refuses the
// request. A paused image, or one another builder holds the build lock of, is
// refused too. A build that became ready may come with an error of the
// housekeeping after it.
func (r *Runner) BuildNow(ctx context.Context, src Source, image, request string, allow func(context.Context) error) (store.Build, error) {
	if err := r.busy.enter(ctx, image); err != nil {
		return store.Build{}, err
	}
	defer r.busy.leave(image)
	if allow != nil {
		if err := allow(ctx); err != nil {
			return store.Build{}, err
		}
	}
	res, err := r.run(ctx, src, image, Look{Asked: true, Request: request})
	switch {
	case res.Build != nil:
		return *res.Build, err
	case err != nil:
		return store.Build{}, err
	}
	return store.Build{}, errSkipped(image, res.Skipped)
}

// run is a step on an image the caller marked busy.
func (r *Runner) run(ctx context.Context, src Source, image string, look Look) (Result, error) {
	if res, stop, err := r.pausedStop(ctx, image, look); stop {
		return res, err
	}
	if until := r.space.until(image); r.opts.Now().Before(until) {
		why := "images-dir had too little free space; next try after " + until.Format(time.RFC3339)
		if look.Asked {
			return Result{}, fmt.Errorf("%s: %s", image, why)
		}
		return Result{Skipped: why}, nil
	}
	work, err := src.Due(ctx, image, look)
	if err != nil || work.Todo == nil {
		return result(work), err
	}
	if work.Todo.Slot && r.opts.Slots != nil {
		select {
		case r.opts.Slots <- struct{}{}:
			defer func() { <-r.opts.Slots }()
		case <-ctx.Done():
			return Result{}, fmt.Errorf("build %s: waiting for a build worker: %w", image, ctx.Err())
		}
	}
	// The image's build lock, as nodepool's builders take it: another holder
	// makes the build, and this builder leaves the image alone.
	ctx, unlock, err := r.opts.Store.Hold(ctx, store.LockKey{Image: image})
	if errors.Is(err, store.ErrHeld) {
		if look.Asked {
			return Result{}, fmt.Errorf("build %s: another builder holds the image's build lock and is building it; ask again when it is done: %w", image, err)
		}
		r.log.Info("another builder holds the image's build lock; it makes the build", "image", image)
		return Result{Skipped: "another builder holds the image's build lock"}, nil
	}
	if err != nil {
		return Result{}, fmt.Errorf("build %s: %w", image, err)
	}
	defer unlock()
	// The wait for a slot may have been long, and the lock's last holder may
	// have just made the build: the work may be done, or be other work now.
	// An image paused meanwhile is left alone too.
	if res, stop, err := r.pausedStop(ctx, image, look); stop {
		return res, err
	}
	var made *store.Build
	if work, err = work.Todo.Maker.Recheck(ctx); err == nil && work.Todo != nil {
		todo := *work.Todo
		if look.Asked {
			// So that the same request made again finds the build.
			todo.New.Request = look.Request
		}
		made, err = r.make(ctx, image, todo)
		work = Work{Have: made}
	}
	if errors.Is(err, diskspace.ErrNoSpace) {
		wait := r.space.fail(image, r.opts.Now())
		err = fmt.Errorf("%w; %s waits %s before it tries again: free space in the images-dir", err, image, wait)
	} else if err == nil {
		r.space.clear(image)
	}
	return result(work), err
}

// result is what a step on an image returns of its work: why nothing was
// due, or the build that is there or was made.
func result(work Work) Result {
	return Result{Build: work.Have, Skipped: work.Skip}
}

// pausedStop tells whether the step stops because the image is paused (or
// its pauses could not be read), and with what.
func (r *Runner) pausedStop(ctx context.Context, image string, look Look) (Result, bool, error) {
	why, err := r.paused(ctx, image)
	if err == nil && why == "" {
		return Result{}, false, nil
	}
	if err == nil && look.Asked {
		err = fmt.Errorf("%s: %w %s", image, ErrPaused, why)
	}
	return Result{Skipped: "paused"}, true, err
}

// paused says why an image is paused ("" when it is not): by image-pause, or
// in the config.
func (r *Runner) paused(ctx context.Context, image string) (string, error) {
	paused, err := r.opts.Store.Paused(ctx)
	if err != nil {
		return "", fmt.Errorf("%s: %w", image, err)
	}
	by := store.PausedBy(paused, image, r.opts.Config().PausedInConfig(image))
	switch {
	case slices.Contains(by, store.PausedByCommand):
		return "by image-pause; image-unpause it first", nil
	case len(by) > 0:
		return "in the config (pause: true)", nil
	}
	return "", nil
}

// make makes the work under the image's lock (ctx holds it) and records its
// outcome: a new build is begun, made, and committed, or aborted with its
// files removed; the files added to a ready build are committed, those added
// before a failure too. An
// outcome that cannot be recorded (a write whose fate is unknown, or the lock
// lost) leaves the build as recorded, building, for recovery, which takes the
// lock again. It returns the build the work made ready, if any: a new build
// may come with a failure of the housekeeping after it.
func (r *Runner) make(ctx context.Context, image string, work Todo) (*store.Build, error) {
	st, maker := r.opts.Store, work.Maker
	// The image is being built, as nodepool's builder says from the moment it
	// holds the lock and found the build due until its outcome is recorded.
	defer r.opts.Metrics.Building(image)()
	if work.Into != nil {
		w := st.WriterOf(*work.Into)
		err := maker.Make(ctx, w)
		if store.LockLost(ctx) {
			err = errors.Join(err, store.ErrLockLost)
		} else if _, cerr := w.Commit(context.WithoutCancel(ctx), nil); cerr != nil {
			err = errors.Join(err, cerr)
		}
		built := w.Build()
		if err = errors.Join(err, maker.Done(context.WithoutCancel(ctx), End{Build: built, Err: err, Recorded: true})); err != nil {
			return nil, err
		}
		return &built, nil
	}
	r.log.Info("build due", "image", image, "reason", work.Reason)
	w, err := st.BeginBuild(ctx, work.New)
	if err != nil {
		return nil, fmt.Errorf("build %s: %w", image, err)
	}
	err = maker.Make(ctx, w)
	// The outcome is recorded even when ctx ended the work, but never once
	// the image's lock is lost: another builder may hold it by now.
	wctx := context.WithoutCancel(ctx)
	var unknown error // the outcome could not be written: recovery settles the build
	switch {
	case store.LockLost(ctx):
		unknown = store.ErrLockLost
	case err == nil:
		if _, cerr := w.Commit(wctx, maker.Cursor(w.Build(), nil)); errors.Is(cerr, store.ErrConflict) {
			err = cerr // not written, for sure: someone else changed the record
		} else if cerr != nil {
			unknown = cerr
		}
	}
	if err != nil && unknown == nil {
		// The record first: a build recorded failed is never uploaded from.
		failed, aerr := w.Abort(wctx, err.Error(), maker.Cursor(w.Build(), err))
		switch {
		case failed.State != store.Failed:
			unknown = aerr // the failure is not recorded: the build stays as it is, for recovery
		case aerr != nil:
			r.log.Warn("could not remove the files of a failed build", "build", failed.Name(), "error", aerr)
		}
	}
	built := w.Build()
	if unknown != nil {
		err = fmt.Errorf("build %s: its outcome could not be recorded, the builder settles it on its next pass: %w",
			built.Name(), errors.Join(err, unknown))
		return nil, errors.Join(err, maker.Done(wctx, End{Build: built, Err: err}))
	}
	if err == nil {
		r.log.Info("build ready", "image", image, "build", built.ID, "formats", built.Formats())
	}
	after := maker.Done(wctx, End{Build: built, Err: err, Recorded: true})
	switch {
	case err != nil:
		return nil, fmt.Errorf("build %s: %w", built.Name(), errors.Join(err, after))
	case after != nil:
		return &built, fmt.Errorf("build %s is ready, but: %w", built.Name(), after)
	}
	return &built, nil
}
