package service

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/nodepool-builder/nodepool-builder/internal/fsync"
	"github.com/nodepool-builder/nodepool-builder/internal/perm"
)

// writePIDFile writes this process's pid, as nodepool's -p does. It is
// written to a new file of a fresh name beside it, created exclusively, then
// renamed into place: whatever sits at a name known in advance (a symlink to
// another file) is never written through, and readers never see half a pid.
func writePIDFile(path string) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, perm.Dir); err != nil {
		return fmt.Errorf("pid file: %w", err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("pid file: %w", err)
	}
	if err := fsync.WriteFile(tmp, path, []byte(strconv.Itoa(os.Getpid())+"\n")); err != nil {
		return fmt.Errorf("pid file: %w", err)
	}
	return nil
}

// removePIDFile removes the pid file if it still names this process.
func removePIDFile(path string) {
	data, err := os.ReadFile(path)
	if err == nil && strings.TrimSpace(string(data)) == strconv.Itoa(os.Getpid()) {
		os.Remove(path)
	}
}
