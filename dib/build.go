package dib

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/diskimage"
	"github.com/nodepool-builder/nodepool-builder/internal/perm"
	"github.com/nodepool-builder/nodepool-builder/metrics"
	"github.com/nodepool-builder/nodepool-builder/progress"
	"github.com/nodepool-builder/nodepool-builder/qemuimg"
	"github.com/nodepool-builder/nodepool-builder/source"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// build is the DIB source's job: one DIB build, what Due found, and how the
// run went.
type build struct {
	src     *Source
	img     *config.DiskImage
	look    source.Look
	formats []string
	logFile string
	began   time.Time
	res     runResult
}

// Recheck is Due under the image's build lock.
func (d *build) Recheck(ctx context.Context) (source.Work, error) {
	return d.src.due(ctx, d.img.Name, d.look, true)
}

// Make runs DIB for the build w makes, to completion, and records the files
// it made: every format must have its file; checksums come from the sidecars
// DIB wrote with --checksum. The build is recorded (building) before DIB
// starts, so listings show it while it runs. Its log is
// <build-log-dir>/<image>-<build_id>.log.
func (d *build) Make(ctx context.Context, w *store.BuildWriter) error {
	b, rec := d.src, w.Build()
	d.began = time.Now()
	d.logFile = diskimage.LogPath(b.opts.Config.BuildLogDir, rec.Image, rec.ID)
	b.log.Info("building image", "image", rec.Image, "build_id", rec.ID, "formats", d.formats, "log", d.logFile)
	if d.res = b.run(ctx, d.img, w, d.formats, d.logFile); d.res.err != nil {
		return d.res.err
	}
	return b.finish(ctx, w, d.formats, d.logFile)
}

// Cursor: a DIB build moves no poll cursor.
func (d *build) Cursor(store.Build, error) *store.Cursor { return nil }

// Done is told how a build ended. A manual build request made before the
// build started is settled by it, whatever its outcome, unless ctx ended the
// build: then the request stays for the next run. A build whose outcome could
// not be recorded keeps its request and its log, for recovery to settle.
func (d *build) Done(ctx context.Context, end source.End) error {
	b, image, rec := d.src, d.img.Name, end.Build
	m := metrics.DIBBuild{Image: image, Ran: d.res.ran, ExitCode: d.res.exitCode, TimedOut: d.res.timedOut,
		Duration: time.Since(d.began), Err: end.Err}
	if !end.Recorded {
		b.opts.Metrics.DIBBuilt(m)
		return nil
	}
	b.log.Info("image build finished", "image", image, "build_id", rec.ID, "state", rec.State,
		"duration", time.Since(d.began).Round(time.Second), "log", d.logFile)
	m.Files = b.filePaths(rec)
	b.opts.Metrics.DIBBuilt(m)
	// Housekeeping: its failures do not undo a ready build, but are reported.
	var after []error
	if !d.res.cancelled {
		if err := b.opts.Store.ClearBuildRequest(ctx, image, rec.Created); err != nil {
			after = append(after, err)
		}
	}
	if err := b.pruneLogs(image); err != nil {
		after = append(after, err)
	}
	return errors.Join(after...)
}

// runResult is how a build process went: err says why the build failed.
type runResult struct {
	err       error
	cancelled bool // ctx ended the build
	ran       bool // the process started; exitCode is its exit code
	exitCode  int
	timedOut  bool
}

// run runs disk-image-create for the build w makes with its output in logFile,
// and kills it when build-timeout passes or ctx ends.
func (b *Source) run(ctx context.Context, img *config.DiskImage, w *store.BuildWriter, formats []string, logFile string) runResult {
	cfg, rec := b.opts.Config, w.Build()
	base, err := w.Base()
	if err != nil {
		return runResult{err: err}
	}
	inv, err := command(img, formats, base, cfg.ElementsDir, os.Environ())
	if err != nil {
		return runResult{err: err}
	}
	if err := os.MkdirAll(filepath.Dir(logFile), perm.Dir); err != nil {
		return runResult{err: fmt.Errorf("create build log dir: %w", err)}
	}
	// Build logs show the elements, env-vars and paths of the builds.
	if err := perm.Tighten(filepath.Dir(logFile)); err != nil {
		return runResult{err: fmt.Errorf("build log dir: %w", err)}
	}
	f, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, perm.File)
	if err != nil {
		return runResult{err: fmt.Errorf("create build log: %w", err)}
	}
	defer f.Close()
	fmt.Fprintf(f, "Building %s at %s: %s\n", rec.Name(), b.opts.Now().UTC().Format(time.RFC3339), quoteCommand(inv.Args))
	if len(inv.Held) > 0 {
		fmt.Fprintf(f, "Not passed from the builder's environment (a diskimage's env-vars may set them): %s\n", strings.Join(inv.Held, " "))
	}

	prog := filepath.Base(inv.Args[0])
	p, err := start(inv, f)
	if err != nil {
		// As a shell reports it: 127 for a program that is not there, 126 otherwise.
		code := 126
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ENOENT) {
			code = 127
		}
		fmt.Fprintf(f, "%v\nExit code: %d\n", err, code)
		return runResult{err: fmt.Errorf("%w; log: %s", err, logFile)}
	}
	if err := w.SetPID(ctx, p.pid()); err != nil {
		b.log.Warn("cannot record the pid of a build", "build", rec.Name(), "pid", p.pid(), "err", err)
	}
	task := b.opts.Progress.Start(progress.Build, rec.Name(), 0)
	defer task.End()
	stopSteps := followSteps(logFile, task)
	o, stopErr := p.wait(ctx, img.BuildTimeout, b.opts.KillGrace)
	stopSteps()
	switch {
	case o.TimedOut:
		fmt.Fprintf(f, "Build timed out after %s (build-timeout); killed its process group\n", img.BuildTimeout)
	case o.Cancelled:
		fmt.Fprintf(f, "Build cancelled: the builder is stopping; killed its process group\n")
	}
	if stopErr != nil {
		fmt.Fprintf(f, "%v\n", stopErr)
	}
	fmt.Fprintf(f, "Exit code: %d\n", o.ExitCode)
	if err := f.Close(); err != nil {
		return runResult{err: fmt.Errorf("write build log %s: %w", logFile, err)}
	}

	res := runResult{ran: true, exitCode: o.ExitCode, timedOut: o.TimedOut}
	switch {
	case o.TimedOut:
		res.err = fmt.Errorf("timed out after %s (build-timeout) and was killed; log: %s", img.BuildTimeout, logFile)
	case o.Cancelled:
		res.err = fmt.Errorf("%s: DIB was cancelled (%w) and killed; log: %s", source.InterruptedReason, context.Cause(ctx), logFile)
		res.cancelled = true
	case o.ExitCode != 0:
		res.err = fmt.Errorf("%s exited with code %d; log: %s", prog, o.ExitCode, logFile)
	}
	if stopErr != nil {
		res.err = errors.Join(res.err, stopErr)
	}
	return res
}

// finish adds the files DIB made to the build; the runner's commit records
// them.
func (b *Source) finish(ctx context.Context, w *store.BuildWriter, formats []string, logFile string) error {
	wctx := context.WithoutCancel(ctx)
	var files []store.File
	for _, format := range formats {
		f, err := b.collect(wctx, w, format)
		if err != nil {
			return fmt.Errorf("%w; log: %s", err, logFile)
		}
		files = append(files, f)
	}
	return w.Add(files...)
}

// collect checks the file DIB wrote for one format and reads its size and
// checksums: from the sidecars DIB wrote beside it (--checksum), else
// computed.
func (b *Source) collect(ctx context.Context, w *store.BuildWriter, format string) (store.File, error) {
	out, err := w.Output(format, fileSuffix(format))
	if err != nil {
		return store.File{}, fmt.Errorf("DIB exited 0 but %w", err)
	}
	// As for a fetched image: the format claimed, and no file outside it referenced.
	if _, err := qemuimg.Inspect(ctx, b.opts.QemuImg, out.Path, format); err != nil {
		return store.File{}, fmt.Errorf("DIB's %s output: %w", format, err)
	}
	sha, md := out.SHA256, out.MD5
	if sha == "" || md == "" {
		b.log.Warn("DIB wrote no checksum files; computing them", "file", out.Path)
		if sha, md, _, err = store.HashFile(ctx, out.Path); err != nil {
			return store.File{}, err
		}
	}
	return store.File{Format: format, SHA256: sha, MD5: md, Size: out.Size}, nil
}

// filePaths are, by format, the paths of a ready build's files; nil for
// another build.
func (b *Source) filePaths(built store.Build) map[string]string {
	if built.State != store.Ready {
		return nil
	}
	paths := map[string]string{}
	for _, f := range built.Files {
		if p, err := b.opts.Store.FilePath(built.Image, built.ID, f.Format); err == nil {
			paths[f.Format] = p
		}
	}
	return paths
}

// pruneLogs keeps the newest build-log-retention logs of image. nodepool keeps
// at least one, the log of the build that just ran.
func (b *Source) pruneLogs(image string) error {
	keep := b.opts.Config.BuildLogRetention
	if keep >= 0 {
		keep = max(keep, 1)
	}
	removed, err := pruneLogs(b.opts.Config.BuildLogDir, image, keep)
	for _, p := range removed {
		b.log.Debug("removed old build log", "image", image, "log", p)
	}
	return err
}
