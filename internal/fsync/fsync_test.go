package fsync

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
