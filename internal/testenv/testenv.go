// Package testenv starts the real parts tests run against (ZooKeeper, Glance, Keystone, gearmand,
// mosquitto, binaries, proxies) in one line each, and fails rather than skips when CI demands them.
package testenv

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// RequireBinary returns the path of the named program. When it is not installed the test
// is skipped, or fails when CI=true, because CI must exercise every real part.
func RequireBinary(t testing.TB, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	Unavailable(t, "%s not installed; run `make deps-test`", name)
	return ""
}

// NewGlance starts a standalone Glance for the test and stops it when the test ends.
// It skips (or fails under CI) when Glance is not installed.
func NewGlance(t testing.TB) *Glance {
	t.Helper()
	RequireBinary(t, "glance-api")
	RequireBinary(t, "glance-manage")
	// Starting takes a few seconds; the bound only keeps a wedged Glance from hanging the run.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g, stop, err := StartGlance(ctx, t.TempDir(), nil)
	if err != nil {
		t.Fatalf("start glance: %v", err)
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("stop glance: %v", err)
		}
	})
	return g
}

// ToolSum returns the digest a checksum command (sha256sum, md5sum) prints for
// path: an independent check of the digests the product computes.
func ToolSum(t testing.TB, tool, path string) string {
	t.Helper()
	out, err := exec.Command(RequireBinary(t, tool), path).Output()
	if err != nil {
		t.Fatalf("%s %s: %v", tool, path, err)
	}
	sum, _, _ := strings.Cut(string(out), " ")
	return sum
}

// Unavailable skips the test because something it needs from the machine (a device,
// a filesystem feature, root) is missing, or fails it when CI=true: CI runs every test.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf(format+" (CI runs every test)", args...)
	} else {
		t.Skipf(format, args...)
	}
}
