package perm

import (
	"os"
	"path/filepath"
	"testing"
)

func TestCreateIgnoresUmaskGrants(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	f, err := Create(path)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm()&0o007 != 0 || fi.Mode().Perm()&^File != 0 {
		t.Errorf("Create made mode %v, want at most %v", fi.Mode().Perm(), File)
	}
}

func TestTighten(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		mode, want os.FileMode
	}{
		{0o755, 0o750},
		{0o644, 0o640},
		{0o600, 0o600}, // never loosened
		{0o640, 0o640},
	} {
		path := filepath.Join(dir, c.mode.String())
		if err := os.WriteFile(path, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, c.mode); err != nil {
			t.Fatal(err)
		}
		if err := Tighten(path); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != c.want {
			t.Errorf("Tighten of mode %v made %v, want %v", c.mode, fi.Mode().Perm(), c.want)
		}
	}
	if err := Tighten(filepath.Join(dir, "missing")); err != nil {
		t.Errorf("Tighten of a missing file: %v", err)
	}
}
