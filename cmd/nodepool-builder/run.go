package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/nodepool-builder/nodepool-builder/builder"
	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/internal/escape"
	"github.com/nodepool-builder/nodepool-builder/progress"
	"github.com/nodepool-builder/nodepool-builder/service"
	"github.com/nodepool-builder/nodepool-builder/store"
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
	show := func(ctx context.Context) { tracker.Log(ctx, log, c.Duration("progress-interval")) }
	if bars != nil {
		show = bars.Run
	}
	err = service.Run(c.Context, service.Options{
		Config:        cfg,
		Logger:        log,
		Version:       version(),
		PIDFile:       c.String("pid-file"),
		Once:          c.Bool("once"),
		UploadWorkers: c.Int("upload-workers"),
		BuildWorkers:  c.Int("build-workers"),
		Progress:      tracker,
		ShowProgress:  show,
	})
	return withServiceCode(err)
}

// withServiceCode gives an error of service.Run its exit code: the codes the builder has
// always given.
func withServiceCode(err error) error {
	var steps *service.StepsError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &steps):
		return withCode(exitFailed, &stepsFailed{errs: unjoin(steps.Err), err: steps.Err})
	case errors.Is(err, store.ErrLocked):
		return withCode(exitLocked, err)
	case errors.Is(err, config.ErrUnusable), errors.Is(err, store.ErrOtherBuilder), errors.Is(err, store.ErrForeignImagesDir):
		return withCode(exitUsage, err)
	}
	return withCode(exitFailed, err)
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
func (e *stepsFailed) record() (string, []any) { return e.head(), []any{"errors", errorTexts(e.errs)} }

func (e *stepsFailed) Unwrap() error { return e.err }

// errorTexts is the text of each error.
func errorTexts(errs []error) []string {
	texts := make([]string, 0, len(errs))
	for _, e := range errs {
		texts = append(texts, e.Error())
	}
	return texts
}

// unjoin lists the errors an errors.Join made.
func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}
