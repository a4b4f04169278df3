package dib

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

const (
	id1 = "0123456789abcdef0123456789abcdef"
	id2 = "11111111111111111111111111111111"
	id3 = "22222222222222222222222222222222"
)

func TestIsImageLog(t *testing.T) {
	tests := []struct {
		name, image string
		want        bool
	}{
		{"fedora-" + id1 + ".log", "fedora", true},
		{"fedora-40-" + id1 + ".log", "fedora", false},
		{"fedora-40-" + id1 + ".log", "fedora-40", true},
		{"fedora-" + id1 + ".log", "fedora-40", false},
		{"fedora-" + id1[:31] + ".log", "fedora", false},
		{"fedora-" + id1 + ".log.1", "fedora", false},
		{"fedora-" + strings.ToUpper(id1) + ".log", "fedora", true},
		{"fedora-zz23456789abcdef0123456789abcdef.log", "fedora", false},
	}
	for _, tt := range tests {
		if got := isImageLog(tt.name, tt.image); got != tt.want {
			t.Errorf("isImageLog(%q, %q) = %v, want %v", tt.name, tt.image, got, tt.want)
		}
	}
}

// writeLogs creates logs in dir, each a minute older than the one before.
func writeLogs(t *testing.T, dir string, names ...string) {
	t.Helper()
	now := time.Now()
	for i, n := range names {
		p := filepath.Join(dir, n)
		if err := os.WriteFile(p, []byte("log\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		mt := now.Add(-time.Duration(i+1) * time.Minute)
		if err := os.Chtimes(p, mt, mt); err != nil {
			t.Fatal(err)
		}
	}
}

func listDir(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	slices.Sort(names)
	return names
}

func TestPruneLogs(t *testing.T) {
	// Newest first; the ids sort the other way, so name order would keep the wrong ones.
	fedora := []string{"fedora-" + id1 + ".log", "fedora-" + id2 + ".log", "fedora-" + id3 + ".log"}
	other := []string{"fedora-40-" + id1 + ".log", "fedora-40-" + id2 + ".log", "fedora-40-" + id3 + ".log", "fedora.yaml"}
	tests := []struct {
		keep int
		want []string // fedora logs left
	}{
		{keep: -1, want: fedora},
		{keep: 5, want: fedora},
		{keep: 2, want: fedora[:2]},
		{keep: 1, want: fedora[:1]},
		{keep: 0, want: nil},
	}
	for _, tt := range tests {
		dir := t.TempDir()
		writeLogs(t, dir, fedora...)
		writeLogs(t, dir, other...)
		if _, err := pruneLogs(dir, "fedora", tt.keep); err != nil {
			t.Fatalf("keep %d: %v", tt.keep, err)
		}
		want := append(slices.Clone(tt.want), other...)
		slices.Sort(want)
		if got := listDir(t, dir); !slices.Equal(got, want) {
			t.Errorf("keep %d: left\n %q\nwant\n %q", tt.keep, got, want)
		}
	}
}

func TestPruneLogsMissingDir(t *testing.T) {
	if _, err := pruneLogs(filepath.Join(t.TempDir(), "absent"), "fedora", 1); err != nil {
		t.Fatalf("a log dir that does not exist yet has nothing to prune: %v", err)
	}
}
