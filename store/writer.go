package store

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
)

// A BuildWriter makes the files of one build into the store, as a content
// store takes in content: begin (the record, building), add each file once the
// source verified it (checksum sidecars beside it, then the record), then
// commit (ready) or abort (failed, the files removed). The store owns the
// layout: a source writes a format's file where Path says and nowhere else.
//
// The record always goes before the files: a build that crashes while begun
// is a building record with no holder, which recovery settles and whose files
// the tidy-up removes; one that crashes in an abort is a failed record with
// files, which the tidy-up removes too.
type BuildWriter struct {
	s     *Store
	build Build
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
	return &BuildWriter{s: s, build: rec}, nil
}

// WriterOf is a writer of a build already recorded, as read: to add files that
// became needed after it was made, or to abort one left building.
func (s *Store) WriterOf(b Build) *BuildWriter {
	return &BuildWriter{s: s, build: b}
}

// Build is the record as last written.
func (w *BuildWriter) Build() Build { return w.build }

// Path is where the build's file of format goes; an error for a format that
// names no file of the images-dir.
func (w *BuildWriter) Path(format string) (string, error) {
	return w.s.FilePath(w.build.Image, w.build.ID, format)
}

// Base is the path of the build's files without their suffix, for a tool that
// names its files itself (DIB's output, its manifest directory).
func (w *BuildWriter) Base() (string, error) {
	return w.s.BuildPath(w.build.Image, w.build.ID)
}

// Add records files of the build that the source verified, each present at
// Path(f.Format): their checksum sidecars are written beside them, then the
// record, in one compare-and-set on its version. Present is set.
func (w *BuildWriter) Add(ctx context.Context, files ...File) error {
	next := own(w.build)
	var formats []string
	for _, f := range files {
		p, err := w.Path(f.Format)
		if err != nil {
			return err
		}
		if err := WriteSidecars(p, f.SHA256, f.MD5); err != nil {
			return err
		}
		f.Present = true
		next.SetFile(f)
		formats = append(formats, f.Format)
	}
	if err := w.s.backend.Write(ctx, PutBuild(&next)); err != nil {
		return fmt.Errorf("record %s file of %s: %w", strings.Join(formats, ", "), w.build.Name(), err)
	}
	w.build = next
	return nil
}

// Update writes a change of the record the source makes while it makes the
// build (the pid of its process, a format refused), compare-and-set.
func (w *BuildWriter) Update(ctx context.Context, change func(*Build)) error {
	next := own(w.build)
	change(&next)
	if err := w.s.backend.Write(ctx, PutBuild(&next)); err != nil {
		return fmt.Errorf("update build %s: %w", w.build.Name(), err)
	}
	w.build = next
	return nil
}

// Commit writes the build ready, and the poll cursor that moves with it, when
// not nil, in the same write. A file the record names must be present.
func (w *BuildWriter) Commit(ctx context.Context, cur *Cursor) (Build, error) {
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
	next := w.build
	next.SetState(Ready, w.s.now())
	next.Reason = ""
	if err := w.s.backend.Write(ctx, withCursor(PutBuild(&next), cur)...); err != nil {
		return w.build, fmt.Errorf("set build %s %s: %w", w.build.Name(), Ready, err)
	}
	w.build = next
	return next, nil
}

// Abort writes the build failed with reason, and the poll cursor that records
// the failure, when not nil, in the same write, then removes its files. The
// write is made even when ctx is done: an aborted build is settled at once,
// not left to recovery.
func (w *BuildWriter) Abort(ctx context.Context, reason string, cur *Cursor) (Build, error) {
	ctx = context.WithoutCancel(ctx)
	next := w.build
	next.SetState(Failed, w.s.now())
	next.Reason = reason
	if err := w.s.backend.Write(ctx, withCursor(PutBuild(&next), cur)...); err != nil {
		return w.build, fmt.Errorf("set build %s %s: %w", w.build.Name(), Failed, err)
	}
	w.build = next
	if err := w.s.RemoveBuildFiles(next.Image, next.ID); err != nil {
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
