package storetest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/store"
)

// writeFile makes a format's file where the writer says, and returns the
// File a source that verified it would add.
func writeFile(t *testing.T, w *store.BuildWriter, format string) store.File {
	t.Helper()
	data := []byte(w.Build().Name() + " " + format)
	tmp, err := w.Temp(format)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return store.File{Format: format, SHA256: strings.Repeat("a", 64), MD5: strings.Repeat("b", 32), Size: int64(len(data))}
}

// pathOf is where w's Add puts a format's file.
func pathOf(t *testing.T, w *store.BuildWriter, format string) string {
	t.Helper()
	p, err := w.Path(format)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// filesOf lists the names in s's images-dir of build b's files.
func filesOf(t *testing.T, s opened, b store.Build) []string {
	t.Helper()
	entries, err := os.ReadDir(s.Dir())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		// After the build's name and a dot, a '-' begins another image's
		// build: "debian-<id>.04-<id>.qcow2" is image "debian-<id>.04"'s.
		if rest, ok := strings.CutPrefix(e.Name(), b.Name()+"."); ok && !strings.Contains(rest, "-") {
			out = append(out, e.Name())
		}
	}
	return out
}

// testBuildWriterCommit: a build made through a writer is recorded building at
// once, each file added is moved into place with its sidecars beside it and
// kept, and commit records them and makes the build ready together with the
// changes given, in one write.
func testBuildWriterCommit(t *testing.T, open Opener) {
	ctx := context.Background()
	s := openStore(t, open, NewClock())
	w, err := s.BeginBuild(ctx, store.Build{Image: "debian", Source: store.SourceZuul, Zuul: store.ZuulRef{UUID: "a1", ID: 4}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Build(ctx, w.Build().ID)
	if err != nil || b.State != store.Building || b.BuilderID != s.BuilderID() || b.Zuul.UUID != "a1" {
		t.Fatalf("a begun build reads %+v, %v; want building, of this builder", b, err)
	}
	if dir := filepath.Dir(pathOf(t, w, "qcow2")); dir != s.Dir() {
		t.Fatalf("a file's path %s is not in the images-dir %s", pathOf(t, w, "qcow2"), s.Dir())
	}
	f := writeFile(t, w, "qcow2")
	if tmp, _ := w.Temp("qcow2"); filepath.Dir(tmp) == s.Dir() {
		t.Fatalf("a file is made at %s, in the images-dir under a build's name, before it is added", tmp)
	}
	if err := w.Add(f); err != nil {
		t.Fatal(err)
	}
	if info, err := os.Stat(pathOf(t, w, "qcow2")); err != nil || info.Mode().Perm()&0o007 != 0 {
		t.Fatalf("the file added: %v, %v; want it in place, not for other users", info, err)
	}
	for ext, sum := range map[string]string{".sha256": f.SHA256, ".md5": f.MD5} {
		got, err := store.ReadSidecar(pathOf(t, w, "qcow2") + ext)
		if err != nil || got != sum {
			t.Fatalf("sidecar %s = %q, %v; want %q", ext, got, err, sum)
		}
	}
	b, _ = s.Build(ctx, w.Build().ID)
	if len(b.Files) != 0 || b.State != store.Building {
		t.Fatalf("after add: %+v; want no file recorded yet, still building", b)
	}
	if got, ok := w.Build().File("qcow2"); !ok || !got.Present || got.Size != f.Size {
		t.Fatalf("the writer's record after add: %+v; want a present qcow2 file of %d bytes", w.Build(), f.Size)
	}

	// Ready and the cursor in one write: a commit whose build change cannot
	// be written moves no cursor.
	touched := w.Build()
	if err := s.raw.SetBuildState(ctx, &touched, store.Building, "touched"); err != nil {
		t.Fatal(err)
	}
	cur := store.Cursor{Image: "debian", ZuulID: 4, ZuulUUID: "a1", Outcome: "ready", Time: s.Now(), Build: w.Build().ID}
	if _, err := w.Commit(ctx, &cur); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("commit of a changed record: %v, want ErrConflict", err)
	}
	if b, _ := s.Build(ctx, w.Build().ID); b.State != store.Building {
		t.Fatalf("a commit that failed left the build %s", b.State)
	}
	if c, _ := s.Cursor(ctx, "debian"); c.ZuulID != 0 {
		t.Fatalf("a commit that failed moved the cursor: %+v", c)
	}
	w = s.WriterOf(touched)
	ready, err := w.Commit(ctx, &cur)
	if err != nil {
		t.Fatal(err)
	}
	b, _ = s.Build(ctx, ready.ID)
	c, _ := s.Cursor(ctx, "debian")
	if got, ok := b.File("qcow2"); b.State != store.Ready || b.Version != ready.Version || c.Build != ready.ID || !ok || !got.Present || got.Size != f.Size {
		t.Fatalf("after commit: build %+v, cursor %+v; want ready with its qcow2 file, the cursor naming it", b, c)
	}
	if files := filesOf(t, s, ready); len(files) != 3 {
		t.Fatalf("files of a committed build: %q, want the file and its two sidecars", files)
	}

	// A file the record names must be there.
	w2, err := s.BeginBuild(ctx, store.Build{Image: "debian", Source: store.SourceZuul})
	if err != nil {
		t.Fatal(err)
	}
	if err := w2.Add(writeFile(t, w2, "raw")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(pathOf(t, w2, "raw")); err != nil {
		t.Fatal(err)
	}
	if _, err := w2.Commit(ctx, nil); err == nil {
		t.Fatal("a build whose file went was committed")
	}

	// More files for a ready build, through a writer of it: its commit
	// records them and leaves it ready since it was.
	more := s.WriterOf(ready)
	if _, err := more.Commit(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if b, _ := s.Build(ctx, ready.ID); b.Version != ready.Version {
		t.Fatalf("a commit of a ready build with nothing added wrote it: version %d, was %d", b.Version, ready.Version)
	}
	if err := more.Add(writeFile(t, more, "raw")); err != nil {
		t.Fatal(err)
	}
	if _, err := more.Commit(ctx, nil); err != nil {
		t.Fatal(err)
	}
	b, _ = s.Build(ctx, ready.ID)
	if !slices.Equal(b.Formats(), []string{"qcow2", "raw"}) || b.State != store.Ready || !b.StateTime.Equal(ready.StateTime) {
		t.Fatalf("a ready build with a file added: %+v; want both files, ready since %v", b, ready.StateTime)
	}
}

// testBuildWriterAbort: an aborted build is recorded failed with its reason,
// with the changes given in the same write, and then its files go; when the
// record cannot be written, the files stay, so that no record names files
// that are gone.
func testBuildWriterAbort(t *testing.T, open Opener) {
	ctx := context.Background()
	s := openStore(t, open, NewClock())
	w, err := s.BeginBuild(ctx, store.Build{Image: "debian", Source: store.SourceZuul, Zuul: store.ZuulRef{UUID: "a2", ID: 5}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Add(writeFile(t, w, "qcow2")); err != nil {
		t.Fatal(err)
	}
	writeFile(t, w, "raw") // made, not added yet

	// Someone else changed the record: the abort is not written, and the
	// files stay for whoever settles the build.
	other := w.Build()
	if err := s.raw.SetBuildState(ctx, &other, store.Building, "touched"); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Abort(ctx, "why", nil); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("abort of a changed record: %v, want ErrConflict", err)
	}
	if files := filesOf(t, s, other); len(files) != 3 {
		t.Fatalf("an abort that was not recorded removed files: %q left", files)
	}

	w = s.WriterOf(other)
	cur := store.Cursor{Image: "debian", ZuulID: 5, ZuulUUID: "a2", Outcome: "failed", Reason: "why", Time: s.Now()}
	cctx, cancel := context.WithCancel(ctx)
	cancel() // an abort is written even when the work was cancelled
	failed, err := w.Abort(cctx, "why", &cur)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := s.Build(ctx, failed.ID)
	c, _ := s.Cursor(ctx, "debian")
	if b.State != store.Failed || b.Reason != "why" || c.ZuulUUID != "a2" || c.Outcome != "failed" {
		t.Fatalf("after abort: build %+v, cursor %+v; want failed with its reason, the cursor moved", b, c)
	}
	if files := filesOf(t, s, b); len(files) != 0 {
		t.Fatalf("files left by an abort: %q", files)
	}

	// A builder that stopped after adding files left a building record
	// that lists none: recovery aborts it with a writer of that record, and
	// the files go all the same, those made and not added too.
	w, err = s.BeginBuild(ctx, store.Build{Image: "debian", Source: store.SourceDIB})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Add(writeFile(t, w, "qcow2")); err != nil {
		t.Fatal(err)
	}
	half, _ := w.Temp("raw")
	writeFile(t, w, "raw")
	left, err := s.Build(ctx, w.Build().ID)
	if err != nil || len(left.Files) != 0 {
		t.Fatalf("a build with files added and not committed reads %+v, %v; want no file listed", left, err)
	}
	if _, err := s.WriterOf(left).Abort(ctx, "interrupted", nil); err != nil {
		t.Fatal(err)
	}
	if files := filesOf(t, s, left); len(files) != 0 {
		t.Fatalf("files of a build whose record listed none left by its abort: %q", files)
	}
	if _, err := os.Stat(half); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a file made and not added left by the abort of its build: %v", err)
	}
}

// testBuildWriterRecordsAsItGoes: what a source learns while it makes a build
// (the pid of its process, a format refused for good) is written at once,
// compare-and-set, with the files added so far; a write that conflicts
// changes neither the record nor the writer's copy of it.
func testBuildWriterRecordsAsItGoes(t *testing.T, open Opener) {
	ctx := context.Background()
	s := openStore(t, open, NewClock())
	w, err := s.BeginBuild(ctx, store.Build{Image: "debian", Source: store.SourceDIB})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Add(writeFile(t, w, "qcow2")); err != nil {
		t.Fatal(err)
	}
	if err := w.SetPID(ctx, 4242); err != nil {
		t.Fatal(err)
	}
	b, err := s.Build(ctx, w.Build().ID)
	if f, ok := b.File("qcow2"); err != nil || b.PID != 4242 || b.State != store.Building || !ok || !f.Present {
		t.Fatalf("after SetPID: %+v, %v; want the pid and the qcow2 file added so far, still building", b, err)
	}
	if w.Build().Version != b.Version || w.Build().PID != 4242 {
		t.Fatalf("the writer's record after SetPID: %+v; want the one written, version %d", w.Build(), b.Version)
	}
	if err := w.Refuse(ctx, "raw", "sha256 does not match"); err != nil {
		t.Fatal(err)
	}
	b, err = s.Build(ctx, w.Build().ID)
	if err != nil || b.Refused["raw"] != "sha256 does not match" || len(b.Refused) != 1 || b.PID != 4242 {
		t.Fatalf("after Refuse: %+v, %v; want raw refused and the pid kept", b, err)
	}

	// Someone else changed the record: neither change is written, and the
	// writer keeps the record as it last wrote it.
	touched := w.Build()
	if err := s.raw.SetBuildState(ctx, &touched, store.Building, "touched"); err != nil {
		t.Fatal(err)
	}
	was := w.Build()
	if err := w.SetPID(ctx, 99); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("SetPID on a changed record: %v, want ErrConflict", err)
	}
	if err := w.Refuse(ctx, "vhd", "backing file"); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("Refuse on a changed record: %v, want ErrConflict", err)
	}
	b, _ = s.Build(ctx, w.Build().ID)
	if b.PID != 4242 || len(b.Refused) != 1 || b.Reason != "touched" {
		t.Fatalf("the record after conflicting changes: %+v; want it as the other writer left it", b)
	}
	if got := w.Build(); got.PID != was.PID || got.Version != was.Version || len(got.Refused) != 1 {
		t.Fatalf("the writer's record after conflicting changes: %+v; want it as it last wrote it", got)
	}
}
