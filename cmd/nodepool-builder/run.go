package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/nodepool-builder/nodepool-builder/builder"
	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/internal/escape"
	"github.com/nodepool-builder/nodepool-builder/internal/perm"
	"github.com/nodepool-builder/nodepool-builder/metrics"
	"github.com/nodepool-builder/nodepool-builder/progress"
	"github.com/nodepool-builder/nodepool-builder/state"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/webapp"
)

// runBuilder is the builder itself: the daemon, or every step once.
func runBuilder(c *cli.Context) error {
	tracker := progress.NewTracker()
	// --once on a terminal draws bars, and the log writes above them; elsewhere
	// progress is a log line per task now and then.
	var bars *progress.Bars
	logOut := c.App.ErrWriter
	if c.Bool("once") && isTerminal(logOut) {
		bars = progress.NewBars(tracker, logOut)
		logOut = bars
	}
	log, err := newLoggerTo(c, logOut)
	if err != nil {
		return err
	}
	cfg, err := loadConfig(c)
	if err != nil {
		return err
	}
	// What config-validate checks, before anything is created or locked; and
	// when it fails, said as config-validate says it. A builder that runs logs
	// the warnings when it opens the Zuul clients and the clouds.
	if warnings, err := builder.Check(c.Context, cfg); err != nil {
		reportWarnings(c.App.ErrWriter, c.String("log-format"), warnings)
		return withCode(exitUsage, err)
	}
	lock, err := store.LockDir(cfg.ImagesDir)
	if err != nil {
		if errors.Is(err, store.ErrLocked) {
			return withCode(exitLocked, err)
		}
		return withCode(exitFailed, err)
	}
	defer lock.Unlock()
	if pf := c.String("pid-file"); pf != "" {
		if err := writePIDFile(pf); err != nil {
			return withCode(exitFailed, err)
		}
		defer removePIDFile(pf)
	}
	ctx := c.Context
	st, err := state.Open(ctx, cfg, state.Options{Access: store.Create, Logger: log, Register: true, Version: version()})
	if errors.Is(err, store.ErrOtherBuilder) || errors.Is(err, store.ErrForeignImagesDir) || errors.Is(err, config.ErrUnusable) {
		return withCode(exitUsage, err)
	}
	if err != nil {
		return withCode(exitFailed, err)
	}
	defer st.Close()
	log.Info("builder ready", "builder_id", st.BuilderID(), "images_dir", cfg.ImagesDir)
	if files, err := st.Unrecorded(ctx); err != nil {
		log.Warn("could not list the images-dir", "error", err)
	} else if len(files) > 0 {
		log.Info("the images-dir holds files of builds this builder has no record of; they are not its own and are left "+
			"as they are", "files", files)
	}

	hup := make(chan os.Signal, 1)
	reload := make(chan struct{}, 1)
	if !c.Bool("once") {
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
		go func() {
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
		}()
	}
	// Statsd as nodepool's builder takes it: from STATSD_HOST and STATSD_PORT.
	m, err := metrics.New(metrics.Options{Getenv: os.Getenv, Logger: log})
	if err != nil {
		return withCode(exitUsage, err)
	}
	defer m.Close()
	b, err := builder.New(ctx, builder.Options{
		Config:        cfg,
		Store:         st,
		Logger:        log,
		UploadWorkers: c.Int("upload-workers"),
		BuildWorkers:  c.Int("build-workers"),
		Read:          func() (*config.Snapshot, error) { return config.Read(cfg.Files) },
		Reload:        reload,
		Metrics:       m,
		Progress:      tracker,
	})
	if err != nil {
		if errors.Is(err, config.ErrUnusable) {
			return withCode(exitUsage, err)
		}
		return withCode(exitFailed, err)
	}
	log.Info("config loaded", "config", cfg.Path, "builder_config", cfg.BuilderPath, "diskimages", len(cfg.DiskImages),
		"zuul_images", len(cfg.ZuulImages), "providers", len(cfg.Providers))
	for _, w := range cfg.Warnings {
		log.Warn(w)
	}
	pctx, stopProgress := context.WithCancel(ctx)
	var shown sync.WaitGroup
	defer func() {
		stopProgress()
		shown.Wait()
	}()
	if bars != nil {
		shown.Go(func() { bars.Run(pctx) })
	} else {
		shown.Go(func() { tracker.Log(pctx, log, c.Duration("progress-interval")) })
	}
	if c.Bool("once") {
		if err := b.Once(ctx); err != nil {
			return withCode(exitFailed, &stepsFailed{errs: unjoin(err), err: err})
		}
		return nil
	}
	stopWeb, err := serveWebapp(ctx, log, cfg, webapp.Options{Store: st, Config: b.Config, Health: b.Health,
		Progress: tracker, Metrics: m.Handler(), Logger: log})
	if err != nil {
		return err
	}
	defer stopWeb()
	err = b.Run(ctx)
	log.Info("stopped")
	return err
}

// isTerminal tells whether w is a terminal where bars can be drawn: one with
// a width (a pseudo-terminal nobody sized has none, and would show no bars).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ)
	return err == nil && ws.Col > 0
}

// stepsFailed is the summary of a --once run in which steps failed: errs are
// their errors, err all of them joined.
type stepsFailed struct {
	errs []error
	err  error
}

// Error lists the failed steps a line each: a step's error is one line, its
// control characters escaped, so that nothing Zuul or a cloud said in it
// clears the screen or passes for a line of its own.
func (e *stepsFailed) Error() string {
	lines := []string{e.head() + ":"}
	for _, err := range e.errs {
		lines = append(lines, escape.Controls(err.Error()))
	}
	return strings.Join(lines, "\n")
}

// head counts the steps that failed apart from the due ones not done (a
// diskimage held back after a failed build, say).
func (e *stepsFailed) head() string {
	failed, notDone := 0, 0
	for _, err := range e.errs {
		if builder.IsNotDone(err) {
			notDone++
		} else {
			failed++
		}
	}
	var head []string
	if failed > 0 {
		head = append(head, fmt.Sprintf("%d step(s) failed", failed))
	}
	if notDone > 0 {
		head = append(head, fmt.Sprintf("%d due step(s) not done", notDone))
	}
	return strings.Join(head, ", ")
}
func (e *stepsFailed) Unwrap() error { return e.err }

// unjoin lists the errors an errors.Join made.
func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// writePIDFile writes this process's pid, as nodepool's -p does. It is
// written to a new file of a fresh name beside it, created exclusively, then
// renamed into place: whatever sits at a name known in advance (a symlink to
// another file) is never written through, and readers never see half a pid.
func writePIDFile(path string) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, perm.Dir); err != nil {
		return fmt.Errorf("pid file: %w", err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("pid file: %w", err)
	}
	_, err = tmp.WriteString(strconv.Itoa(os.Getpid()) + "\n")
	if err == nil {
		err = tmp.Chmod(perm.File)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("pid file: %w", err)
	}
	return nil
}

// removePIDFile removes the pid file if it still names this process.
func removePIDFile(path string) {
	data, err := os.ReadFile(path)
	if err == nil && strings.TrimSpace(string(data)) == strconv.Itoa(os.Getpid()) {
		os.Remove(path)
	}
}
