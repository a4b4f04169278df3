package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/nodepool-builder/nodepool-builder/internal/perm"
)

// ErrLocked means another builder process holds the images-dir.
var ErrLocked = errors.New("images-dir is locked by another builder")

// Lock is the exclusive hold of one builder process on an images-dir.
type Lock struct {
	f *os.File
}

// LockDir takes the images-dir lock without waiting. It fails with an error
// wrapping ErrLocked when another process holds it, naming that process when known.
func LockDir(imagesDir string) (*Lock, error) {
	if err := os.MkdirAll(imagesDir, perm.Dir); err != nil {
		return nil, fmt.Errorf("create images-dir: %w", err)
	}
	path := filepath.Join(imagesDir, "builder.lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, perm.File)
	if err != nil {
		return nil, fmt.Errorf("open lock file: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			who := strings.TrimSpace(string(holder))
			if who != "" {
				who = " (pid " + who + ")"
			}
			return nil, fmt.Errorf("%w%s: %s; stop that builder or point this one at another images-dir", ErrLocked, who, path)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	// The pid is informational: the flock is what excludes.
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &Lock{f: f}, nil
}

// Unlock releases the lock.
func (l *Lock) Unlock() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Close() // closing the descriptor drops the flock
	l.f = nil
	return err
}
