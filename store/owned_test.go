package store

import (
	"context"
	"errors"
	"os"
	"slices"
	"testing"
	"time"
)

// begin makes a ready build of image through the build writer, with a raw file.
func begin(t *testing.T, s *Store, image string) Build {
	t.Helper()
	ctx := context.Background()
	w, err := s.BeginBuild(ctx, Build{Image: image, Source: SourceDIB})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(mustPath(w.Temp("raw")), []byte("disk"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := w.Add(File{Format: "raw", SHA256: "s", MD5: "m", Size: 4}); err != nil {
		t.Fatal(err)
	}
	b, err := w.Commit(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestOwnedBuilds: a build this builder made is marked until a builder of ours
// releases or fails it; one whose record goes otherwise, or that another
// program marked deleting before it went, is lost: settled once, its files
// removed. A failed build and a released one are not.
func TestOwnedBuilds(t *testing.T) {
	ctx := context.Background()
	s := openTest(t, t.TempDir())

	released := begin(t, s, "released")
	rb, err := s.ReleaseBuild(ctx, released.ID, "an operator's dib-image-delete")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.ForgetBuild(rb); err != nil {
		t.Fatal(err)
	}
	if err := s.backend.Write(ctx, DeleteBuild(rb)); err != nil {
		t.Fatal(err)
	}

	w, err := s.BeginBuild(ctx, Build{Image: "failed", Source: SourceDIB})
	if err != nil {
		t.Fatal(err)
	}
	if !s.Owns("failed", w.Build().ID) {
		t.Error("a build begun is not marked")
	}
	if _, err := w.Abort(ctx, "elements failed", nil); err != nil {
		t.Fatal(err)
	}

	gone := begin(t, s, "gone")
	if err := s.backend.Write(ctx, DeleteBuild(gone)); err != nil {
		t.Fatal(err)
	}
	marked := begin(t, s, "marked")
	marked.SetState(Deleting, s.now()) // as nodepool's cleanup writes it: no reason
	if err := s.backend.Write(ctx, PutBuild(&marked)); err != nil {
		t.Fatal(err)
	}
	if err := s.ForgetBuild(marked); err != nil {
		t.Fatal(err)
	}
	if err := s.backend.Write(ctx, DeleteBuild(marked)); err != nil {
		t.Fatal(err)
	}
	kept := begin(t, s, "kept")

	lost, err := s.SettleLost(ctx, time.Now(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range lost {
		names = append(names, l.Image)
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"gone", "marked"}) {
		t.Errorf("lost = %v, want gone and marked", names)
	}
	for _, b := range []Build{gone, marked} {
		if _, err := os.Stat(mustPath(s.FilePath(b.Image, b.ID, "raw"))); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("file of lost build %s: %v, want it removed", b.Name(), err)
		}
		if s.Owns(b.Image, b.ID) {
			t.Errorf("lost build %s is still marked", b.Name())
		}
	}
	if _, err := os.Stat(mustPath(s.FilePath(kept.Image, kept.ID, "raw"))); err != nil || !s.Owns(kept.Image, kept.ID) {
		t.Errorf("build %s with its record: %v, marked %v; want its file and mark kept", kept.Name(), err, s.Owns(kept.Image, kept.ID))
	}
	if again, err := s.SettleLost(ctx, time.Now(), nil); err != nil || len(again) != 0 {
		t.Errorf("SettleLost again = %+v, %v; want nothing", again, err)
	}
}

// TestMarkOwnedBuilds: ready builds of this builder made before marks were
// kept are marked at start; others' builds and builds not ready are not.
func TestMarkOwnedBuilds(t *testing.T) {
	ctx := context.Background()
	s := openTest(t, t.TempDir())
	ready, err := s.CreateBuild(ctx, Build{Image: "old", Source: SourceDIB})
	if err != nil {
		t.Fatal(err)
	}
	if err := setBuildState(ctx, s, &ready, Ready, ""); err != nil {
		t.Fatal(err)
	}
	failed, err := s.CreateBuild(ctx, Build{Image: "old", Source: SourceDIB})
	if err != nil {
		t.Fatal(err)
	}
	if err := setBuildState(ctx, s, &failed, Failed, "why"); err != nil {
		t.Fatal(err)
	}
	other := Build{ID: NewBuildID(), Image: "old", Source: SourceDIB, State: Ready, BuilderID: "another", StateTime: s.now()}
	if err := s.backend.Write(ctx, PutBuild(&other)); err != nil {
		t.Fatal(err)
	}
	if err := s.MarkOwnedBuilds(ctx); err != nil {
		t.Fatal(err)
	}
	if !s.Owns("old", ready.ID) || s.Owns("old", failed.ID) || s.Owns("old", other.ID) {
		t.Errorf("marked: ready %v, failed %v, another's %v; want the ready build of ours alone",
			s.Owns("old", ready.ID), s.Owns("old", failed.ID), s.Owns("old", other.ID))
	}
}
