package dib

import (
	"context"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// orphan starts a process group that looks like a DIB run writing to out, as a
// builder that died would have left it.
func orphan(t *testing.T, out string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sh", "-c", "sleep 60 & wait", "disk-image-create", "-o", out)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); cmd.Wait() })
	return cmd
}

func TestAbandonStopsOrphanedDIB(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	b := New(Options{Store: f.st, Config: &config.Config{ImagesDir: f.images}, KillGrace: time.Second})

	rec, err := f.st.CreateBuild(ctx, store.Build{Image: "debian", Source: store.SourceDIB})
	if err != nil {
		t.Fatal(err)
	}
	left := orphan(t, mustPath(f.st.BuildPath("debian", rec.ID)))
	rec.PID = left.Process.Pid

	// A process whose pid was recorded for another build is not ours to kill.
	other, _ := f.st.CreateBuild(ctx, store.Build{Image: "other", Source: store.SourceDIB})
	stranger := orphan(t, "/somewhere/else")
	other.PID = stranger.Process.Pid

	for _, bd := range []store.Build{rec, other} {
		if err := b.Abandon(ctx, bd); err != nil {
			t.Fatal(err)
		}
	}
	if groupAlive(left.Process.Pid) {
		t.Fatal("the orphaned DIB process group still runs")
	}
	if !groupAlive(stranger.Process.Pid) {
		t.Fatal("a process that does not run the build was killed")
	}
}

// TestAbandonFindsAnUnrecordedDIB: a builder killed between starting DIB and
// recording its pid left a build with none; the process group that writes the
// build's output is found by its command line and stopped, and no other.
func TestAbandonFindsAnUnrecordedDIB(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	b := New(Options{Store: f.st, Config: &config.Config{ImagesDir: f.images}, KillGrace: time.Second})
	rec, err := f.st.CreateBuild(ctx, store.Build{Image: "debian", Source: store.SourceDIB})
	if err != nil {
		t.Fatal(err)
	}
	left := orphan(t, mustPath(f.st.BuildPath("debian", rec.ID)))
	stranger := orphan(t, mustPath(f.st.BuildPath("debian", "0123456789abcdef0123456789abcdef")))
	if err := b.Abandon(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if groupAlive(left.Process.Pid) {
		t.Fatal("the orphaned DIB process group of the build with no pid still runs")
	}
	if !groupAlive(stranger.Process.Pid) {
		t.Fatal("the DIB process of another build was killed")
	}
}
