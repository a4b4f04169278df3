package store

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/nodepool-builder/nodepool-builder/internal/fsync"
	"github.com/nodepool-builder/nodepool-builder/internal/partial"
	"github.com/nodepool-builder/nodepool-builder/internal/perm"
)

// A BuildWriter makes the files of one build into the store, as a content
// store takes in content: begin (the record, building), make each file where
// the writer says (Temp, Download, or Output for a tool that names its files
// itself), add it once the source verified it (moved into place, synced, its
// checksum sidecars beside it), then commit (ready, with its files, in one
// write) or abort (failed, the files removed). A file the source refuses is
// discarded through the writer. The store owns every name: a source writes
// nowhere else.
//
// The record always goes before the files: a build that crashes while begun
// is a building record with no holder, which recovery settles and whose files
// (named after it, whether the record lists them or not) the tidy-up removes;
// one that crashes in an abort is a failed record with files, which the
// tidy-up removes too.
type BuildWriter struct {
	s     *Store
	build Build
	// made is where the file of each format handed out and not added yet is
	// made.
	made map[string]made
	// unwritten: files were added since the record was last written.
	unwritten bool
}

// made is where a format's file is made before Add moves it into place.
type made struct {
	path string
	// sidecars: the tool that made it wrote checksum sidecars beside it,
	// which name it.
	sidecars bool
}

// BeginBuild records a new build of this builder, building, and returns its
// writer; b names the image and carries what the source knows of it (its
// source, the Zuul build, the request).
func (s *Store) BeginBuild(ctx context.Context, b Build) (*BuildWriter, error) {
	rec, err := s.CreateBuild(ctx, b)
	if err != nil {
		return nil, err
	}
	// Marked once the record exists, before any file: a marker without a
	// record is a build whose record another program deleted.
	if err := s.markOwned(rec.Image, rec.ID); err != nil {
		return nil, err
	}
	return s.WriterOf(rec), nil
}

// WriterOf is a writer of a build already recorded, as read: to add files that
// became needed after it was made, or to abort one left building.
func (s *Store) WriterOf(b Build) *BuildWriter {
	return &BuildWriter{s: s, build: b, made: map[string]made{}}
}

// Build is the record as last written, with the files added since.
func (w *BuildWriter) Build() Build { return w.build }

// Path is where Add puts the build's file of format; an error for a format
// that names no file of the images-dir.
func (w *BuildWriter) Path(format string) (string, error) {
	return w.s.FilePath(w.build.Image, w.build.ID, format)
}

// Temp is where a source makes the build's file of format (a conversion's
// output) before Add moves it into place: in the partial directory, which it
// creates. The name is the Zuul build's for a build fetched from Zuul, which
// stays the same across the builds a restart begins, so that a download
// resumes; the build's own otherwise.
func (w *BuildWriter) Temp(format string) (string, error) {
	p, err := w.s.tempPath(w.build, format)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(p), perm.Dir); err != nil {
		return "", fmt.Errorf("create partial directory: %w", err)
	}
	w.made[format] = made{path: p}
	return p, nil
}

// Download names the files of a download of the build's file of format: it
// ends at Temp(format), and keeps what it fetched so far beside it.
func (w *BuildWriter) Download(format string) (partial.Files, error) {
	p, err := w.Temp(format)
	if err != nil {
		return partial.Files{}, err
	}
	return partial.Of(p), nil
}

// Base is the path of the build's files without their suffix, for a tool that
// names its files itself: DIB's -o, from which it writes <base>.<suffix> and
// its manifest directory <base>.d.
func (w *BuildWriter) Base() (string, error) {
	return w.s.BuildPath(w.build.Image, w.build.ID)
}

// Output is a format's file as a tool given Base wrote it.
type Output struct {
	Path string
	// SHA256 and MD5 are read from the sidecars the tool wrote beside the file
	// (DIB's --checksum); empty when it wrote none.
	SHA256, MD5 string
	Size        int64
}

// Output finds the file of format that a tool given Base wrote as
// <base>.<suffix>, for the source to check before Add moves it into place.
// What the tool wrote (the file, its sidecars, <base>.d) is made this user's
// and group's only: a tool writes as its umask says, most often readable by
// everyone.
func (w *BuildWriter) Output(format, suffix string) (Output, error) {
	base, err := w.Base()
	if err != nil {
		return Output{}, err
	}
	if !safePart(suffix) {
		return Output{}, fmt.Errorf("suffix %q of the %s file of %s names no file of the images-dir", suffix, format, w.build.Name())
	}
	p := base + "." + suffix
	info, err := os.Lstat(p)
	if err != nil {
		return Output{}, fmt.Errorf("left no %s file: %w", format, err)
	}
	if !info.Mode().IsRegular() {
		return Output{}, fmt.Errorf("%s is not a regular file", p)
	}
	for _, t := range []string{p, p + sha256Ext, p + md5Ext, base + manifestExt} {
		if err := perm.TightenTree(t); err != nil {
			return Output{}, fmt.Errorf("%s file of %s: %w", format, w.build.Name(), err)
		}
	}
	out := Output{Path: p, Size: info.Size()}
	if out.SHA256, err = ReadSidecar(p + sha256Ext); err != nil {
		return Output{}, err
	}
	if out.MD5, err = ReadSidecar(p + md5Ext); err != nil {
		return Output{}, err
	}
	w.made[format] = made{path: p, sidecars: true}
	return out, nil
}

// Add moves the files the source verified from where the writer said to make
// them into place (Path), makes them durable, writes their checksum sidecars
// beside them and keeps them, present, for the record: the write that
// commits the build records them. Nothing is written to the state.
func (w *BuildWriter) Add(files ...File) error {
	for _, f := range files {
		if err := w.place(f); err != nil {
			return fmt.Errorf("add the %s file of %s: %w", f.Format, w.build.Name(), err)
		}
		next := own(w.build)
		f.Present = true
		next.SetFile(f)
		w.build = next
		w.unwritten = true
		delete(w.made, f.Format)
	}
	if len(files) == 0 {
		return nil
	}
	return fsync.Dir(w.s.dir)
}

// AddAtURL keeps, for the record, a format of a Zuul build that is not
// downloaded: the clouds that need it fetch its artifact at f.URL
// themselves, and f declares what the artifact holds. It is recorded not
// present, as a file removed after its uploads is, so no upload reads it and
// the build still counts as having the format. f.URL must be the artifact's
// whole address and hold no secret: it is stored and handed to the clouds.
func (w *BuildWriter) AddAtURL(f File) error {
	if f.URL == "" {
		return fmt.Errorf("add the %s format of %s at its URL: no URL", f.Format, w.build.Name())
	}
	next := own(w.build)
	f.Present = false
	next.SetFile(f)
	w.build = next
	w.unwritten = true
	return nil
}

// place moves the file of f's format into place, with its sidecars.
func (w *BuildWriter) place(f File) error {
	from, ok := w.made[f.Format]
	if !ok {
		return errors.New("not made where the build writer said")
	}
	to, err := w.Path(f.Format)
	if err != nil {
		return err
	}
	if err := perm.Tighten(from.path); err != nil {
		return err
	}
	if err := fsync.File(from.path); err != nil {
		return err
	}
	if from.path != to {
		if err := os.Rename(from.path, to); err != nil {
			return fmt.Errorf("move into place: %w", err)
		}
		// The tool's sidecars name the file it wrote, which is gone.
		if err := removeSidecars(from); err != nil {
			return err
		}
	}
	return writeSidecars(to, f.SHA256, f.MD5)
}

// Discard removes the file of format made where the writer said, which the
// source refused (a checksum, an unsafe or too large image): it is not added.
func (w *BuildWriter) Discard(format string) error {
	from, ok := w.made[format]
	if !ok {
		return nil
	}
	delete(w.made, format)
	if err := os.Remove(from.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("discard the %s file of %s: %w", format, w.build.Name(), err)
	}
	return removeSidecars(from)
}

// removeSidecars removes the sidecars a tool wrote beside the file it made.
func removeSidecars(m made) error {
	if !m.sidecars {
		return nil
	}
	for _, ext := range []string{sha256Ext, md5Ext} {
		if err := os.Remove(m.path + ext); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove %s: %w", m.path+ext, err)
		}
	}
	return nil
}

// SetPID records the pid of the process the source runs to make the build
// (DIB's), which recovery stops if a builder that is gone left it running:
// compare-and-set, with the files added so far.
func (w *BuildWriter) SetPID(ctx context.Context, pid int) error {
	return w.update(ctx, func(b *Build) { b.PID = pid })
}

// Refuse records that the build's file of format was refused for good, and
// why, so that it is not fetched again: compare-and-set, with the files added
// so far.
func (w *BuildWriter) Refuse(ctx context.Context, format, reason string) error {
	return w.update(ctx, func(b *Build) { b.Refuse(format, reason) })
}

// update writes a change of the record the source makes while it makes the
// build, compare-and-set, with the files added so far.
func (w *BuildWriter) update(ctx context.Context, change func(*Build)) error {
	next := own(w.build)
	change(&next)
	if err := w.s.backend.Write(ctx, PutBuild(&next)); err != nil {
		return fmt.Errorf("update build %s: %w", w.build.Name(), err)
	}
	w.build, w.unwritten = next, false
	return nil
}

// Commit writes the build ready with the files added, and the poll cursor
// that moves with it, when not nil, in one compare-and-set on its version. A
// build ready already (files added to it through WriterOf) stays as it was
// but for the files added, written only when there are some or a cursor is
// given. A file the record names must be present. An error wrapping
// ErrConflict says that nothing was written; with another error, whether the
// write was made is unknown.
func (w *BuildWriter) Commit(ctx context.Context, cur *Cursor) (Build, error) {
	if w.build.State == Ready && !w.unwritten && cur == nil {
		return w.build, nil
	}
	for _, f := range w.build.Files {
		if !f.Present {
			continue
		}
		p, err := w.Path(f.Format)
		if err != nil {
			return w.build, fmt.Errorf("commit build %s: %w", w.build.Name(), err)
		}
		if _, err := os.Stat(p); err != nil {
			return w.build, fmt.Errorf("commit build %s: its %s file: %w", w.build.Name(), f.Format, err)
		}
	}
	next := own(w.build)
	if next.State != Ready {
		next.SetState(Ready, w.s.now())
		next.Reason = ""
	}
	if err := w.s.backend.Write(ctx, withCursor(PutBuild(&next), cur)...); err != nil {
		return w.build, fmt.Errorf("set build %s %s: %w", w.build.Name(), Ready, err)
	}
	w.build, w.unwritten = next, false
	return next, nil
}

// Abort writes the build failed with reason, and the poll cursor that records
// the failure, when not nil, in the same write, then removes its files. The
// write is made even when ctx is done: an aborted build is settled at once,
// not left to recovery.
func (w *BuildWriter) Abort(ctx context.Context, reason string, cur *Cursor) (Build, error) {
	ctx = context.WithoutCancel(ctx)
	next := own(w.build)
	next.SetState(Failed, w.s.now())
	next.Reason = reason
	if err := w.s.backend.Write(ctx, withCursor(PutBuild(&next), cur)...); err != nil {
		return w.build, fmt.Errorf("set build %s %s: %w", w.build.Name(), Failed, err)
	}
	w.build, w.unwritten = next, false
	if err := w.s.removeBuildFiles(next.Image, next.ID); err != nil {
		return next, err
	}
	return next, w.s.unmarkOwned(next.Image, next.ID)
}

// withCursor is the write of a build's change and, when cur is not nil, of the
// cursor that lands with it.
func withCursor(build Change, cur *Cursor) []Change {
	if cur == nil {
		return []Change{build}
	}
	return []Change{build, PutCursor(*cur)}
}

// own is b with Files and Refused of its own: a change of it that is not
// written leaves the writer's record as it was.
func own(b Build) Build {
	b.Files = slices.Clone(b.Files)
	b.Refused = maps.Clone(b.Refused)
	return b
}
