package store

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/partial"
)

// buildFilesOnDisk makes every file a build can have, as the builder and DIB
// name them: formats (DIB's squashfs as ".squash"), sidecars, DIB's manifest
// directory with a file in it, and in the partial directory a conversion's
// output and the files of a download in progress. It returns their paths.
func buildFilesOnDisk(t *testing.T, s *Store, image, id string) []string {
	t.Helper()
	base := mustPath(s.BuildPath(image, id))
	tmp := filepath.Join(s.partialDir(), BuildName(image, id)+".raw")
	files := []string{base + ".qcow2", base + ".qcow2.sha256", base + ".qcow2.md5", base + ".squash", base + ".d", tmp}
	for _, suffix := range partial.Suffixes {
		files = append(files, tmp+suffix)
	}
	if err := os.MkdirAll(s.partialDir(), 0o750); err != nil {
		t.Fatal(err)
	}
	for _, p := range files {
		if filepath.Ext(p) == ".d" {
			if err := os.MkdirAll(p, 0o750); err != nil {
				t.Fatal(err)
			}
			p = filepath.Join(p, "packages")
		}
		if err := os.WriteFile(p, []byte("x"), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	return files
}

// TestRemoveBuildFilesMatchesWholeNames: the files of build img1-22 (a
// record of image img1 with id 22, as an older nodepool numbered builds) go,
// and none of build img1-22.04-<id>, another image's whose names begin
// "img1-22.", nor a file that has only the shape of a build's.
func TestRemoveBuildFilesMatchesWholeNames(t *testing.T) {
	s := openTest(t, t.TempDir())
	gone := buildFilesOnDisk(t, s, "img1", "22")
	kept := buildFilesOnDisk(t, s, "img1-22.04", "0123456789abcdef0123456789abcdef")
	for _, name := range []string{"img1-22.notes.txt", "img1-22.qcow2-old"} {
		p := filepath.Join(s.Dir(), name)
		if err := os.WriteFile(p, []byte("x"), 0o640); err != nil {
			t.Fatal(err)
		}
		kept = append(kept, p)
	}
	// The shape of build gearman-status's file, and the daemon's own.
	if err := s.WriteStatus("gearman", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	kept = append(kept, s.StatusPath("gearman"))
	if err := s.removeBuildFiles("img1", "22"); err != nil {
		t.Fatal(err)
	}
	if err := s.removeBuildFiles("gearman", "status"); err != nil {
		t.Fatal(err)
	}
	for _, p := range gone {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s of build img1-22 is left (%v)", filepath.Base(p), err)
		}
	}
	for _, p := range kept {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("removing build img1-22 removed %s: %v", p, err)
		}
	}
}

// TestRemovePartialsMatchesWholeNames: the partial downloads of image fedora
// are told from those of image "fedora-zuul-ab.c", whose names begin with
// "fedora-zuul-" and a hex word.
func TestRemovePartialsMatchesWholeNames(t *testing.T) {
	s := openTest(t, t.TempDir())
	if err := os.MkdirAll(s.partialDir(), 0o750); err != nil {
		t.Fatal(err)
	}
	own := zuulPartialName("fedora", "ab", "raw") + partial.Download
	other := zuulPartialName("fedora-zuul-ab.c", "cd", "raw") + partial.Download
	for _, n := range []string{own, other} {
		if err := os.WriteFile(filepath.Join(s.partialDir(), n), []byte("x"), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.RemovePartials("fedora", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(s.partialDir(), own)); !os.IsNotExist(err) {
		t.Errorf("fedora's partial download %s is left (%v)", own, err)
	}
	if _, err := os.Stat(filepath.Join(s.partialDir(), other)); err != nil {
		t.Errorf("removing fedora's partial downloads removed %s: %v", other, err)
	}
}

// TestLeftoversMatchWholeNames: a temporary file of a name that begins with
// one of this builder's builds', but is another build's (image
// "debian-<id>.x", id 22), is not this builder's to remove.
func TestLeftoversMatchWholeNames(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := openTest(t, dir)
	b, err := s.CreateBuild(ctx, Build{Image: "debian", Source: SourceDIB})
	if err != nil {
		t.Fatal(err)
	}
	ours, err := createTemp(mustPath(s.FilePath(b.Image, b.ID, "qcow2"))+sha256Ext, tempWrite)
	if err != nil {
		t.Fatal(err)
	}
	other, err := createTemp(mustPath(s.FilePath(b.Name()+".x", "22", "qcow2"))+sha256Ext, tempWrite)
	if err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	for _, f := range []*os.File{ours, other} {
		f.Close()
		if err := os.Chtimes(f.Name(), old, old); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := s.RemoveLeftovers(ctx, Leftovers{Before: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{ours.Name()}; !slices.Equal(removed, want) {
		t.Errorf("RemoveLeftovers removed %v, want %v alone", removed, want)
	}
}
