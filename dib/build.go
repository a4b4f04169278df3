package dib

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/internal/perm"
	"github.com/nodepool-builder/nodepool-builder/metrics"
	"github.com/nodepool-builder/nodepool-builder/progress"
	"github.com/nodepool-builder/nodepool-builder/qemuimg"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// Build runs one DIB build of an image to completion and returns the ready build,
// or an error after recording the build failed and removing its files. The build
// is recorded (building) before DIB starts, so listings show it while it runs.
// Its log is <build-log-dir>/<image>-<build_id>.log. A manual build request made
// before the build started is settled by it, whatever its outcome, unless ctx
// ended the build: then the request stays for the next run. A ready build comes
// with an error only when settling the request or pruning old logs failed.
// A build whose outcome could not be recorded (the write failed, or the image's
// lock was lost) is returned as it was recorded, building, with an error:
// nothing more is written, its files and the request stay, and the builder's
// recovery settles it under the lock.
func (b *Source) Build(ctx context.Context, image string) (store.Build, error) {
	return b.build(ctx, image, "")
}

// build is Build, recording on the build the request that asked for it.
func (b *Source) build(ctx context.Context, image, request string) (store.Build, error) {
	cfg, st := b.opts.Config, b.opts.Store
	img := cfg.DiskImage(image)
	if img == nil {
		return store.Build{}, fmt.Errorf("build %s: %w", image, ErrUnknownImage)
	}
	if !b.claim(image) {
		return store.Build{}, fmt.Errorf("build %s: %w", image, ErrBuilding)
	}
	defer b.release(image)

	formats := buildFormats(cfg, image)
	// The builder's own pid until DIB has one: the record must name a live process.
	w, err := st.BeginBuild(ctx, store.Build{Image: image, Source: store.SourceDIB, PID: os.Getpid(),
		Username: img.Username, PythonPath: img.PythonPath, ShellType: img.ShellType, Request: request})
	if err != nil {
		return store.Build{}, fmt.Errorf("build %s: %w", image, err)
	}
	rec := w.Build()
	began := time.Now()
	logFile := logPath(cfg.BuildLogDir, image, rec.ID)
	b.log.Info("building image", "image", image, "build_id", rec.ID, "formats", formats, "log", logFile)

	res := b.run(ctx, img, w, formats, logFile)
	// The outcome must be recorded even when ctx ended the build, but never
	// once the image's lock is lost: another builder may hold it by now.
	wctx := context.WithoutCancel(ctx)
	var built store.Build
	var unrecorded error // the outcome could not be written: recovery settles the build
	if res.err == nil {
		built, res.err, unrecorded = b.finish(ctx, w, formats, logFile)
	}
	if res.err != nil && unrecorded == nil {
		if store.LockLost(ctx) {
			unrecorded = store.ErrLockLost
		} else {
			// The record first: a build recorded failed is never uploaded from.
			var err error
			if built, err = w.Abort(wctx, res.err.Error()); err != nil {
				res.err = errors.Join(res.err, err)
			}
		}
	}
	if unrecorded != nil {
		// Whether the write took is unknown, or the lock it needed is gone:
		// the record stays as it is for this builder's recovery, which takes
		// the lock again, and the files and the request stay with it. A
		// request is settled only by a build recorded ready.
		built = w.Build()
		b.log.Warn("the build's outcome could not be recorded; the next pass settles it", "image", image,
			"build_id", rec.ID, "err", unrecorded)
		err := fmt.Errorf("build %s: its outcome could not be recorded, the builder settles it on its next pass: %w",
			rec.Name(), errors.Join(res.err, unrecorded))
		b.opts.Metrics.DIBBuilt(metrics.DIBBuild{Image: image, Ran: res.ran, ExitCode: res.exitCode, TimedOut: res.timedOut,
			Duration: time.Since(began), Err: err})
		return built, err
	}
	state := store.Ready
	if res.err != nil {
		state = store.Failed
	}
	b.log.Info("image build finished", "image", image, "build_id", rec.ID, "state", state,
		"duration", time.Since(began).Round(time.Second), "log", logFile)
	b.opts.Metrics.DIBBuilt(metrics.DIBBuild{Image: image, Ran: res.ran, ExitCode: res.exitCode, TimedOut: res.timedOut,
		Duration: time.Since(began), Err: res.err, Files: b.filePaths(built)})

	// Housekeeping: its failures do not undo a ready build, but are reported.
	var after []error
	if !res.cancelled {
		if err := st.ClearBuildRequest(wctx, image, rec.Created); err != nil {
			after = append(after, err)
		}
	}
	if err := b.pruneLogs(image); err != nil {
		after = append(after, err)
	}
	if res.err != nil {
		return built, fmt.Errorf("build %s: %w", rec.Name(), errors.Join(append([]error{res.err}, after...)...))
	}
	if len(after) > 0 {
		return built, fmt.Errorf("build %s is ready, but: %w", rec.Name(), errors.Join(after...))
	}
	return built, nil
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
	inv, err := command(img, formats, w.Base(), cfg.ElementsDir, os.Environ())
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
	if err := w.Update(ctx, func(b *store.Build) { b.PID = p.pid() }); err != nil {
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
		res.err = fmt.Errorf("%s: DIB was cancelled (%w) and killed; log: %s", InterruptedReason, context.Cause(ctx), logFile)
		res.cancelled = true
	case o.ExitCode != 0:
		res.err = fmt.Errorf("%s exited with code %d; log: %s", prog, o.ExitCode, logFile)
	}
	if stopErr != nil {
		res.err = errors.Join(res.err, stopErr)
	}
	return res
}

// finish records the files DIB made and marks the build ready. Every format must
// have its file; checksums come from the sidecars DIB wrote with --checksum.
// failed says why the build failed (a record changed meanwhile included);
// unrecorded, that it did not but whether marking it ready took is unknown,
// or it may not be tried: ctx's lock is lost.
func (b *Source) finish(ctx context.Context, w *store.BuildWriter, formats []string, logFile string) (built store.Build, failed, unrecorded error) {
	wctx := context.WithoutCancel(ctx)
	var files []store.File
	for _, format := range formats {
		f, err := b.collect(wctx, w, format)
		if err != nil {
			return w.Build(), fmt.Errorf("%w; log: %s", err, logFile), nil
		}
		files = append(files, f)
	}
	if store.LockLost(ctx) {
		return w.Build(), nil, store.ErrLockLost
	}
	// Not written, for sure, when someone else changed the record.
	written := func(err error) (store.Build, error, error) {
		if errors.Is(err, store.ErrConflict) {
			return w.Build(), err, nil
		}
		return w.Build(), nil, err
	}
	if err := w.Add(wctx, files...); err != nil {
		return written(err)
	}
	ready, err := w.Commit(wctx)
	if err != nil {
		return written(err)
	}
	return ready, nil, nil
}

// collect finds the file DIB wrote for one format, moves it to the store's name
// for it when DIB names it differently, and reads its size and checksums: from
// the sidecars DIB wrote beside it (--checksum), else computed. The build
// writer writes the store's sidecars.
func (b *Source) collect(ctx context.Context, w *store.BuildWriter, format string) (store.File, error) {
	path := w.Path(format)
	out := path // where DIB wrote it
	if suffix := fileSuffix(format); suffix != format {
		out = w.Base() + "." + suffix
	}
	sha, err := store.ReadSidecar(out + ".sha256")
	if err != nil {
		return store.File{}, err
	}
	md, err := store.ReadSidecar(out + ".md5")
	if err != nil {
		return store.File{}, err
	}
	if out != path {
		if err := os.Rename(out, path); err != nil {
			return store.File{}, fmt.Errorf("DIB exited 0 but left no %s file: %w", format, err)
		}
		// DIB's sidecars name the file it wrote, which is gone.
		for _, ext := range []string{".sha256", ".md5"} {
			if err := os.Remove(out + ext); err != nil && !errors.Is(err, os.ErrNotExist) {
				return store.File{}, fmt.Errorf("remove %s: %w", out+ext, err)
			}
		}
	}
	info, err := os.Stat(path)
	if err != nil {
		return store.File{}, fmt.Errorf("DIB exited 0 but left no %s file: %w", format, err)
	}
	if !info.Mode().IsRegular() {
		return store.File{}, fmt.Errorf("DIB exited 0 but %s is not a regular file", path)
	}
	// DIB writes its files as its umask says: readable by everyone, most often.
	for _, p := range []string{path, path + ".sha256", path + ".md5", w.Base() + ".d"} {
		if err := perm.TightenTree(p); err != nil {
			return store.File{}, fmt.Errorf("DIB's %s output: %w", format, err)
		}
	}
	// As for a fetched image: the format claimed, and no file outside it referenced.
	if _, err := qemuimg.Inspect(ctx, b.opts.QemuImg, path, format); err != nil {
		return store.File{}, fmt.Errorf("DIB's %s output: %w", format, err)
	}
	if sha == "" || md == "" {
		b.log.Warn("DIB wrote no checksum files; computing them", "file", path)
		if sha, md, _, err = store.HashFile(ctx, path); err != nil {
			return store.File{}, err
		}
	}
	return store.File{Format: format, SHA256: sha, MD5: md, Size: info.Size(), Present: true}, nil
}

// filePaths are, by format, the paths of a ready build's files; nil for
// another build.
func (b *Source) filePaths(built store.Build) map[string]string {
	if built.State != store.Ready {
		return nil
	}
	paths := map[string]string{}
	for _, f := range built.Files {
		paths[f.Format] = b.opts.Store.FilePath(built.Image, built.ID, f.Format)
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
