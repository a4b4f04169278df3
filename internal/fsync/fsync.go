// Package fsync makes what was written to a file, or a rename in a directory,
// durable: the last step of every write that ends in a rename into place.
package fsync

import (
	"fmt"
	"os"

	"github.com/nodepool-builder/nodepool-builder/internal/perm"
)

// File flushes the file at path to its disk.
func File(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("open %s for fsync: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("fsync %s: %w", path, err)
	}
	return f.Close()
}

// Dir flushes directory dir, so that the names created, renamed or removed in it
// last across a crash.
func Dir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open directory %s for fsync: %w", dir, err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("fsync directory %s: %w", dir, err)
	}
	return nil
}

// WriteFile writes data to tmp, a new file beside path that the caller made
// under a name of its choosing, flushes it, makes it perm.File and renames it
// to path: readers never see half a file, and whatever sits at path (a
// symlink to another file) is never written through. tmp is closed, and
// removed unless it became path.
func WriteFile(tmp *os.File, path string, data []byte) error {
	defer os.Remove(tmp.Name())
	_, err := tmp.Write(data)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), perm.File)
	}
	if err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
