package progress

import (
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
)

// waitOutput waits until out holds every one of want.
func waitOutput(t *testing.T, out *testenv.Buffer, want ...string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		missing := ""
		for _, w := range want {
			if !strings.Contains(out.String(), w) {
				missing = w
			}
		}
		if missing == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("output lacks %q:\n%s", missing, out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestBarsFollowTheTasks(t *testing.T) {
	tr := NewTracker()
	var out testenv.Buffer
	b := NewBars(tr, &out)
	b.every = 20 * time.Millisecond
	b.start()
	stopped := false
	defer func() {
		if !stopped {
			b.stop()
		}
	}()

	dl := tr.Start(Download, "debian-0000000004.qcow2", 4<<20)
	dl.Add(1 << 20)
	bd := tr.Start(Build, "fedora-0000000002", 0)
	bd.SetNote("install.d/10-apt")
	b.reconcile()
	if len(b.rows) != 2 {
		t.Fatalf("%d bars for 2 tasks", len(b.rows))
	}
	waitOutput(t, &out, "download debian-0000000004.qcow2", "1.0 MiB of 4.0 MiB (25%)",
		"build fedora-0000000002", "install.d/10-apt")

	// Log lines go above the bars while they are drawn.
	if _, err := b.Write([]byte("a log line\n")); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, &out, "a log line\n")

	dl.End()
	up := tr.Start(Upload, "debian-0000000004 to cloud-a", 4<<20)
	b.reconcile()
	if _, ok := b.rows[dl.id]; ok || len(b.rows) != 2 {
		t.Errorf("bars after one task ended and another started: %d, the ended one kept: %v", len(b.rows), ok)
	}
	waitOutput(t, &out, "upload debian-0000000004 to cloud-a")
	up.End()
	bd.End()
	b.reconcile()
	if len(b.rows) != 0 {
		t.Errorf("%d bars when no task runs", len(b.rows))
	}

	b.stop()
	stopped = true
	// Once the bars are gone, lines go straight out.
	if _, err := b.Write([]byte("after the bars\n")); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(out.String(), "after the bars\n") {
		t.Errorf("a line written after the bars is not the last output:\n%q", out.String())
	}
}
