// Package perm holds the modes of what the builder writes: images, their
// sidecars, build logs, the state, locks and the pid file are for their owner
// and group, never for every user of the host.
package perm

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

const (
	// File is the mode of every file the builder writes.
	File fs.FileMode = 0o640
	// Dir is the mode of every directory the builder makes.
	Dir fs.FileMode = 0o750
)

// Create creates or truncates a file for writing with mode File. os.Create
// would leave the mode to the umask (0666 &^ umask: readable by everyone).
func Create(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, File)
}

// Tighten takes away what other users may do with a file or directory this
// process owns: an older builder left the images-dir and the state readable
// by everyone. It never loosens a mode, and leaves alone what another user
// owns (a directory the operator made, that the builder only writes to).
func Tighten(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || int(st.Uid) != os.Getuid() || fi.Mode()&fs.ModeSymlink != 0 || fi.Mode().Perm()&0o007 == 0 {
		return nil
	}
	if err := os.Chmod(path, fi.Mode().Perm()&^0o007); err != nil {
		return fmt.Errorf("take away other users' access to %s: %w", path, err)
	}
	return nil
}

// TightenTree is Tighten for a directory and everything under it; symlinks
// are not followed.
func TightenTree(root string) error {
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		return Tighten(path)
	})
}
