// Package dib is the source of the diskimages built on this host with diskimage-builder, as
// nodepool builds them: it says when one is due and runs disk-image-create into the build's files.
package dib

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/diskimage"
	"github.com/nodepool-builder/nodepool-builder/metrics"
	"github.com/nodepool-builder/nodepool-builder/progress"
	"github.com/nodepool-builder/nodepool-builder/source"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// Defaults of Options.
const (
	DefaultKillGrace     = 30 * time.Second
	DefaultCheckInterval = 10 * time.Second
)

// ErrUnknownImage is returned (wrapped) for an image that is not a diskimage of the config.
var ErrUnknownImage = errors.New("not a diskimage of the config")

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

// Source builds the diskimages of a config: it says when one is due and runs
// DIB into the build the core begins (see package source). A build takes one
// of the build slots (nodepool's --build-workers) while it runs.
type Source struct {
	opts Options
	log  *slog.Logger
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
		opts.FailureBackoff = diskimage.DefaultFailureBackoff
	}
	if opts.KillGrace <= 0 {
		opts.KillGrace = DefaultKillGrace
	}
	return &Source{opts: opts, log: opts.Logger}
}

// Images lists the diskimages of the config that are built (not abstract), each
// with how often it is checked for being due; none with build-diskimages: false.
func (b *Source) Images() map[string]time.Duration {
	every := b.opts.CheckInterval
	if every <= 0 {
		every = DefaultCheckInterval
	}
	out := map[string]time.Duration{}
	if b.opts.Config.Builder.LeaveDiskImages {
		return out // other builders build them
	}
	for _, img := range b.opts.Config.DiskImages {
		out[img.Name] = every
	}
	return out
}

// Due says whether an image needs a build now, and why: when an operator asked
// for one; when it has no ready build, when its newest ready build is older
// than rebuild-age or lacks a format the config needs, but not within
// FailureBackoff of a failed build (a *HeldBack error says so: due work not
// done); when a manual build request (image-build) waits. Under the image's
// lock a build request is read from the state itself, since the last holder
// of the lock may have just built the image and cleared its request, which a
// lagging listing may not show yet.
func (b *Source) Due(ctx context.Context, image string, look source.Look) (source.Work, error) {
	return b.due(ctx, image, look, false)
}

// due is Due, before the image's build lock or under it (Recheck).
func (b *Source) due(ctx context.Context, image string, look source.Look, locked bool) (source.Work, error) {
	img := b.opts.Config.DiskImage(image)
	if img == nil {
		return source.Work{}, fmt.Errorf("check whether %s is due: %w", image, ErrUnknownImage)
	}
	reason := "an operator asked for a build"
	if look.Request != "" {
		reason += " (request " + look.Request + ")"
	}
	if !look.Asked {
		why, back, err := b.checkAt(ctx, image, locked)
		switch {
		case err != nil:
			return source.Work{}, err
		case back != nil:
			return source.Work{}, back
		case why == "":
			return source.NotDue("not due"), nil
		}
		reason = why
	}
	return source.Do(source.Todo{
		Reason: reason,
		Slot:   true,
		// The builder's own pid until DIB has one: the record must name a live process.
		New: store.Build{Image: image, Source: store.SourceDIB, PID: os.Getpid(),
			Username: img.Username, PythonPath: img.PythonPath, ShellType: img.ShellType},
		Maker: &build{src: b, img: img, look: look, formats: diskimage.Formats(b.opts.Config, image)},
	}), nil
}

func (b *Source) checkAt(ctx context.Context, image string, locked bool) (string, *HeldBack, error) {
	cfg, st := b.opts.Config, b.opts.Store
	img := cfg.DiskImage(image)
	if img == nil {
		return "", nil, fmt.Errorf("check whether %s is due: %w", image, ErrUnknownImage)
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
		settled := store.NewestReady(builds, image)
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
	reason := diskimage.DueReason(cfg, img, builds, now)
	if reason == "" {
		return "", nil, nil
	}
	// A build that failed since the newest ready one: give whatever broke it
	// time to mend rather than building again and again. A build the builder
	// stopped did not fail, and holds nothing back.
	if f := diskimage.LastFailure(cfg, image, builds, b.opts.FailureBackoff); f != nil && now.Before(f.NextAttempt) {
		return "", &HeldBack{Image: image, Failure: *f, Backoff: b.opts.FailureBackoff}, nil
	}
	return reason, nil, nil
}
