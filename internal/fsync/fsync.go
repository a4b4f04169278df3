// Package fsync makes what was written to a file, or a rename in a directory,
// durable: the last step of every write that ends in a rename into place.
package fsync

import (
	"fmt"
	"os"
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
