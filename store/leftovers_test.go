package store

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestTempFilesAreLeftovers: a temporary file made by writeFileAtomic's maker, or by
// a conversion of an earlier version, for a file of one of this builder's builds, is one that
// RemoveLeftovers removes once it is old, and only then: the names made and the names
// recognised are one.
func TestTempFilesAreLeftovers(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := openTest(t, dir)
	b, err := s.CreateBuild(ctx, Build{Image: "debian", Source: SourceZuul, Zuul: ZuulRef{UUID: "aa11"}})
	if err != nil {
		t.Fatal(err)
	}
	raw := mustPath(s.FilePath(b.Image, b.ID, "raw"))
	makers := map[string]func() (*os.File, error){
		"conversion":     func() (*os.File, error) { return createTemp(raw, tempConvert) },
		"atomic write":   func() (*os.File, error) { return createTemp(raw+".sha256", tempWrite) },
		"builder's file": func() (*os.File, error) { return createTemp(filepath.Join(dir, "builder_id.txt"), tempWrite) },
	}
	old := time.Now().Add(-time.Hour)
	var made []string
	for what, create := range makers {
		f, err := create()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		f.Close()
		if filepath.Dir(f.Name()) != dir || !tempName.MatchString(filepath.Base(f.Name())) {
			t.Errorf("%s: temporary file %s is not a name tempName knows in %s", what, f.Name(), dir)
		}
		made = append(made, f.Name())
	}
	// Still being written: kept.
	removed, err := s.RemoveLeftovers(ctx, Leftovers{Before: old})
	if err != nil || len(removed) != 0 {
		t.Fatalf("RemoveLeftovers of new files removed %v, %v; want nothing", removed, err)
	}
	for _, name := range made {
		if err := os.Chtimes(name, old, old); err != nil {
			t.Fatal(err)
		}
	}
	removed, err = s.RemoveLeftovers(ctx, Leftovers{Before: time.Now().Add(-time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(made)
	slices.Sort(removed)
	if !slices.Equal(removed, made) {
		t.Errorf("RemoveLeftovers removed %v, want the temporary files %v", removed, made)
	}
}
