// Package service runs the builder as the host's service: it holds the
// images-dir's lock and the pid file, opens the state, metrics and status
// pages, turns SIGHUP into reloads, and runs the builder's loops, or every
// step once.
package service

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/nodepool-builder/nodepool-builder/builder"
	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/metrics"
	"github.com/nodepool-builder/nodepool-builder/progress"
	"github.com/nodepool-builder/nodepool-builder/state"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/webapp"
)

// Options configure a run of the builder.
type Options struct {
	Config *config.Config
	Logger *slog.Logger
	// Version is the builder's, recorded where it registers in the state.
	Version string
	// PIDFile, when set, holds the process's pid while it runs, as
	// nodepool's -p does.
	PIDFile string
	// Once does every due step once, then returns; otherwise the loops run
	// until ctx ends, and SIGHUP reloads the config.
	Once bool
	// UploadWorkers overrides builder.upload-workers when above 0;
	// BuildWorkers bounds the DIB builds that run at once.
	UploadWorkers int
	BuildWorkers  int
	// Progress holds the work under way; ShowProgress, when set, shows it
	// from when the builder is ready until it stops.
	Progress     *progress.Tracker
	ShowProgress func(context.Context)
}

// StepsError is the error of a run with Once in which steps failed or left
// due work undone: Err joins their errors.
type StepsError struct{ Err error }

func (e *StepsError) Error() string { return e.Err.Error() }
func (e *StepsError) Unwrap() error { return e.Err }

// unusable marks err, a setting this host cannot use (a port taken, a
// STATSD_PORT that is no port), as config.ErrUnusable's, without changing
// what it says.
type unusable struct{ error }

func (e unusable) Unwrap() []error { return []error{e.error, config.ErrUnusable} }

// Run runs the builder of opts.Config until ctx ends, or every step once. Its
// error wraps store.ErrLocked when another builder holds the images-dir;
// config.ErrUnusable, store.ErrOtherBuilder or store.ErrForeignImagesDir when
// the config cannot be used on this host; it is a *StepsError when steps of a
// Once run failed.
func Run(ctx context.Context, opts Options) error {
	lock, err := store.LockDir(opts.Config.ImagesDir)
	if err != nil {
		return err
	}
	defer lock.Unlock()
	if opts.PIDFile != "" {
		if err := writePIDFile(opts.PIDFile); err != nil {
			return err
		}
		defer removePIDFile(opts.PIDFile)
	}
	st, err := state.Open(ctx, opts.Config, state.Options{Access: store.Create, Logger: opts.Logger, Register: true,
		Version: opts.Version})
	if err != nil {
		return err
	}
	defer st.Close()
	return run(ctx, opts, st)
}

// run runs the builder on the state st, opened and locked.
func run(ctx context.Context, opts Options, st *store.Store) error {
	cfg, log := opts.Config, opts.Logger
	log.Info("builder ready", "builder_id", st.BuilderID(), "images_dir", cfg.ImagesDir)
	if files, err := st.Unrecorded(ctx); err != nil {
		log.Warn("could not list the images-dir", "error", err)
	} else if len(files) > 0 {
		log.Info("the images-dir holds files of builds this builder has no record of; they are not its own and are left "+
			"as they are", "files", files)
	}
	reload := make(chan struct{}, 1)
	if !opts.Once {
		// Before the clouds are opened, which takes a while: a SIGHUP meanwhile
		// is a reload, not the end of the process.
		stop := reloadOnHangup(ctx, reload)
		defer stop()
	}
	// Statsd as nodepool's builder takes it: from STATSD_HOST and STATSD_PORT.
	m, err := metrics.New(metrics.Options{Getenv: os.Getenv, Logger: log})
	if err != nil {
		return unusable{err}
	}
	defer m.Close()
	b, err := builder.New(ctx, builder.Options{
		Config:        cfg,
		Store:         st,
		Logger:        log,
		UploadWorkers: opts.UploadWorkers,
		BuildWorkers:  opts.BuildWorkers,
		Read:          func() (*config.Snapshot, error) { return config.Read(cfg.Files) },
		Reload:        reload,
		Metrics:       m,
		Progress:      opts.Progress,
	})
	if err != nil {
		return err
	}
	log.Info("config loaded", "config", cfg.Path, "builder_config", cfg.BuilderPath, "secure_config", cfg.SecurePath, "diskimages", len(cfg.DiskImages),
		"zuul_images", len(cfg.ZuulImages), "providers", len(cfg.Providers))
	for _, w := range cfg.Warnings {
		log.Warn(w)
	}
	if opts.ShowProgress != nil {
		pctx, stopProgress := context.WithCancel(ctx)
		var shown sync.WaitGroup
		shown.Go(func() { opts.ShowProgress(pctx) })
		defer func() {
			stopProgress()
			shown.Wait()
		}()
	}
	if opts.Once {
		if err := b.Once(ctx); err != nil {
			return &StepsError{Err: err}
		}
		return nil
	}
	stopWeb, err := serveWebapp(ctx, log, cfg, webapp.Options{Store: st, Config: b.Config, Health: b.Health,
		Progress: opts.Progress, Metrics: m.Handler(), Logger: log})
	if err != nil {
		return err
	}
	defer stopWeb()
	err = b.Run(ctx)
	log.Info("stopped")
	return err
}

// reloadOnHangup sends on reload at each SIGHUP (one pending at most) until
// ctx ends or stop is called; stop waits for it to end.
func reloadOnHangup(ctx context.Context, reload chan<- struct{}) (stop func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				select {
				case reload <- struct{}{}:
				default:
				}
			}
		}
	})
	return func() {
		signal.Stop(hup)
		cancel()
		wg.Wait()
	}
}
