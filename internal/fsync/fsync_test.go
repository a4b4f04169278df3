package fsync

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/internal/perm"
)

func TestFileAndDir(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "img.raw")
	if err := os.WriteFile(path, []byte("disk"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := File(path); err != nil {
		t.Errorf("File: %v", err)
	}
	if err := Dir(dir); err != nil {
		t.Errorf("Dir: %v", err)
	}
}

// TestErrorsNamePath: a failure says which file or directory, for the operator.
func TestErrorsNamePath(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "gone")
	for name, err := range map[string]error{"File": File(missing), "Dir": Dir(missing)} {
		if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), missing) {
			t.Errorf("%s of a missing path = %v, want os.ErrNotExist naming %s", name, err, missing)
		}
	}
}

// TestWriteFile: the data lands at path with the builder's mode; a symlink
// there is replaced, not written through; no temporary file is left, when
// the rename fails either.
func TestWriteFile(t *testing.T) {
	dir := t.TempDir()
	other := filepath.Join(dir, "other")
	if err := os.WriteFile(other, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "pid")
	if err := os.Symlink(other, path); err != nil {
		t.Fatal(err)
	}
	tmp, err := os.CreateTemp(dir, ".pid.tmp*")
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(tmp, path, []byte("42\n")); err != nil {
		t.Fatal(err)
	}
	if data, err := os.ReadFile(path); err != nil || string(data) != "42\n" {
		t.Errorf("%s holds %q, %v; want 42", path, data, err)
	}
	if data, _ := os.ReadFile(other); string(data) != "keep" {
		t.Errorf("the symlink's target was written through: %q", data)
	}
	if fi, err := os.Lstat(path); err != nil {
		t.Error(err)
	} else if fi.Mode() != perm.File {
		t.Errorf("%s: mode %v; want a regular file of mode %v", path, fi.Mode(), perm.File)
	}

	tmp, err = os.CreateTemp(dir, ".pid.tmp*")
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(tmp, filepath.Join(dir, "missing", "pid"), []byte("42\n")); err == nil {
		t.Error("a rename into a missing directory succeeded")
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".pid.tmp") {
			t.Errorf("temporary file %s left", e.Name())
		}
	}
}
