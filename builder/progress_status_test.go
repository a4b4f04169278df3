package builder

import (
	"context"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/progress"
	"github.com/nodepool-builder/nodepool-builder/status"
	"github.com/nodepool-builder/nodepool-builder/store"
)

func TestProgressStatusFile(t *testing.T) {
	st, err := store.Open(context.Background(), store.Options{ImagesDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if s, err := status.ReadProgress(st); s != nil || err != nil {
		t.Fatalf("ReadProgress before any daemon = %+v, %v; want nil, nil", s, err)
	}
	tr := progress.NewTracker()
	k := tr.Start(progress.Download, "debian-0000000004.qcow2", 100<<20)
	k.Add(10 << 20)
	b := &Builder{store: st, log: slog.New(slog.NewTextHandler(io.Discard, nil)), opts: Options{Progress: tr}}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { b.writeProgress(ctx) })
	defer func() { cancel(); wg.Wait() }()

	read := func(want func(*status.Progress) bool) *status.Progress {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			s, err := status.ReadProgress(st)
			if err != nil {
				t.Fatal(err)
			}
			if s != nil && want(s) {
				return s
			}
			if time.Now().After(deadline) {
				t.Fatalf("progress status is %+v", s)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	s := read(func(s *status.Progress) bool { return len(s.Tasks) == 1 })
	if task := s.Tasks[0]; task.Subject != "debian-0000000004.qcow2" || task.Done != 10<<20 || task.Total != 100<<20 {
		t.Errorf("task = %+v", task)
	}
	if !s.Running || s.PID != os.Getpid() || s.Stale(time.Now()) {
		t.Errorf("status of a running daemon = %+v, stale: %v", s, s.Stale(time.Now()))
	}
	if !s.Stale(s.Updated.Add(2 * time.Minute)) {
		t.Error("a status not rewritten for 2 minutes is not stale")
	}
	// A change is written within about a second.
	k.End()
	read(func(s *status.Progress) bool { return len(s.Tasks) == 0 && s.Running })
	cancel()
	wg.Wait()
	if s := read(func(*status.Progress) bool { return true }); s.Running || !s.Stale(time.Now()) {
		t.Errorf("status of a stopped daemon = %+v, want stale", s)
	}
}
