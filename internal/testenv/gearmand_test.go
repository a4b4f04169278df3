package testenv

import (
	"bytes"
	"context"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// TestGearmandStartKillRestart runs a job through the server with the gearman command,
// then kills and restarts it on the same port.
func TestGearmandStartKillRestart(t *testing.T) {
	g := NewGearmand(t)
	gearman := RequireBinary(t, "gearman")
	RequireBinary(t, "gearadmin")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// A worker from the gearman command (it runs `tr` per job) and a client.
	worker := g.Command(ctx, gearman, "-w", "-f", "upper", "--", "tr", "a-z", "A-Z")
	if err := worker.Start(); err != nil {
		t.Fatalf("start gearman worker: %v", err)
	}
	t.Cleanup(func() {
		worker.Process.Kill()
		worker.Wait()
	})
	waitWorkers(ctx, t, g, "upper", 1)
	out, err := g.Command(ctx, gearman, "-f", "upper", "hello").CombinedOutput()
	if err != nil || string(out) != "HELLO" {
		t.Fatalf("gearman -f upper hello = %q, %v; want HELLO", out, err)
	}
	admin, err := g.Command(ctx, "gearadmin", "--status").Output()
	if err != nil || !bytes.Contains(admin, []byte("upper\t0\t0\t1\n")) {
		t.Errorf("gearadmin --status = %q, %v; want a line upper 0 0 1", admin, err)
	}

	// A background job for a function nobody serves waits in the queue, which is in
	// memory only.
	if out, err := g.Command(ctx, gearman, "-b", "-f", "nobody", "x").CombinedOutput(); err != nil {
		t.Fatalf("gearman -b -f nobody: %v: %s", err, out)
	}
	if st, err := g.Status(ctx); err != nil || st["nobody"] != (FunctionStatus{"nobody", 1, 0, 0}) {
		t.Fatalf("status = %v, %v; want nobody with 1 job and 0 workers", st, err)
	}

	addr := g.Addr
	if err := g.Kill(); err != nil {
		t.Fatalf("kill: %v", err)
	}
	if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		conn.Close()
		t.Fatalf("%s still accepts connections after Kill", addr)
	}
	if err := g.Start(ctx); err != nil {
		t.Fatalf("start after kill: %v", err)
	}
	if g.Addr != addr {
		t.Fatalf("restarted on %s, want %s", g.Addr, addr)
	}
	// A restarted server lost its queue; the gearman worker reconnects by itself.
	st, err := g.Status(ctx)
	if err != nil {
		t.Fatalf("status after restart: %v", err)
	}
	if _, ok := st["nobody"]; ok {
		t.Errorf("restarted gearmand still lists nobody: %v", st)
	}
	waitWorkers(ctx, t, g, "upper", 1)
	if out, err := g.Command(ctx, gearman, "-f", "upper", "again").CombinedOutput(); err != nil || string(out) != "AGAIN" {
		t.Errorf("after restart gearman -f upper again = %q, %v; want AGAIN", out, err)
	}
	if err := g.Start(ctx); err == nil {
		t.Errorf("Start of a running server succeeded")
	}
	if err := g.Restart(ctx); err != nil {
		t.Fatalf("restart: %v", err)
	}
	if _, err := g.Status(ctx); err != nil {
		t.Errorf("status after Restart: %v", err)
	}
	if log, err := os.ReadFile(g.LogFile); err != nil || !strings.Contains(string(log), "Listening on "+addr) {
		t.Errorf("log %s lacks %q (%v)", g.LogFile, "Listening on "+addr, err)
	}
}

func TestGearmandLeavesNothingRunning(t *testing.T) {
	var dir string
	t.Run("server", func(t *testing.T) {
		g := NewGearmand(t)
		dir = g.Dir
		if pids := processesMentioning(t, dir); len(pids) == 0 {
			t.Errorf("no process mentions %s while the server runs", dir)
		}
	})
	if dir == "" {
		return // the subtest said why no server was started
	}
	if pids := processesMentioning(t, dir); len(pids) > 0 {
		t.Errorf("processes %v of %s still run after the test ended", pids, dir)
	}
}

func TestRequireGearmandMissing(t *testing.T) {
	saved := gearmandPaths
	t.Cleanup(func() { gearmandPaths = saved })
	gearmandPaths = []string{"/nonexistent/gearmand"}
	t.Setenv("PATH", t.TempDir())
	for _, ci := range []string{"true", ""} {
		t.Run("CI="+ci, func(t *testing.T) {
			t.Setenv("CI", ci)
			rec := &recordingTB{TB: t}
			if g := NewGearmand(rec); g != nil {
				t.Fatalf("NewGearmand without gearmand returned a server")
			}
			got, other := rec.skip, rec.fatal
			if ci == "true" {
				got, other = rec.fatal, rec.skip
			}
			if !strings.Contains(got, "gearman-job-server") || !strings.Contains(got, "make deps-test") || other != "" {
				t.Errorf("fatal %q, skip %q: want one message naming gearman-job-server and make deps-test", rec.fatal, rec.skip)
			}
		})
	}
}

// waitWorkers waits until the server lists n workers for the function.
func waitWorkers(ctx context.Context, t *testing.T, g *Gearmand, function string, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		st, err := g.Status(ctx)
		if err == nil && st[function].Workers == n {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("gearmand never listed %d workers for %s (last: %+v, %v)", n, function, st[function], err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
