package service

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestPIDFileIgnoresPlantedSymlink: a symlink at the name the pid file was
// once written through points at a file of someone else's; writing the pid
// file leaves that file as it was, and the pid file holds the pid.
func TestPIDFileIgnoresPlantedSymlink(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("precious\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	pidFile := filepath.Join(dir, "run", "nodepool-builder.pid")
	if err := os.MkdirAll(filepath.Dir(pidFile), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, pidFile+".tmp"); err != nil {
		t.Fatal(err)
	}
	if err := writePIDFile(pidFile); err != nil {
		t.Fatal(err)
	}
	if data, err := os.ReadFile(victim); err != nil || string(data) != "precious\n" {
		t.Errorf("the symlink's target holds %q, %v after the pid file was written; want it untouched", data, err)
	}
	if data, err := os.ReadFile(pidFile); err != nil || strings.TrimSpace(string(data)) != strconv.Itoa(os.Getpid()) {
		t.Errorf("pid file holds %q, %v; want %d", data, err, os.Getpid())
	}
	if fi, err := os.Lstat(pidFile); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("pid file is %v, %v; want a regular file", fi, err)
	}
	// Nothing is left beside it but the planted link.
	entries, err := os.ReadDir(filepath.Dir(pidFile))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 2 {
		t.Errorf("files beside the pid file: %v; want the pid file and the link", entries)
	}
}
