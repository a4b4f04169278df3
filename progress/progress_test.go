package progress

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// clock is a tracker clock a test moves by hand.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func TestRateETAAndSummary(t *testing.T) {
	c := &clock{time.Unix(1_000_000, 0)}
	tr := NewTracker()
	tr.now = c.now
	k := tr.Start(Download, "img-0000000001.qcow2", 100<<20)
	c.t = c.t.Add(10 * time.Second)
	k.Add(10 << 20)
	s := tr.Running()[0]
	if s.Rate != 1<<20 {
		t.Errorf("rate after 10 MiB in 10 s = %v, want 1 MiB/s", s.Rate)
	}
	if eta, ok := s.ETA(); !ok || eta != 90*time.Second {
		t.Errorf("eta = %v %v, want 1m30s", eta, ok)
	}
	if got, want := s.Summary(), "10.0 MiB of 100.0 MiB (10%), 1.0 MiB/s, 1m30s left"; got != want {
		t.Errorf("summary = %q, want %q", got, want)
	}
	// Past the window the rate is that of the last 30 s, not the average.
	for range 40 {
		c.t = c.t.Add(time.Second)
		k.Add(2 << 20)
		tr.Running()
	}
	if s := tr.Running()[0]; s.Rate < 1.9*(1<<20) || s.Rate > 2.1*(1<<20) {
		t.Errorf("rate over the last 30 s = %v, want about 2 MiB/s", s.Rate)
	}
	k.End()
	if n := len(tr.Running()); n != 0 {
		t.Errorf("%d tasks after End, want 0", n)
	}
}

func TestBuildWithoutBytes(t *testing.T) {
	c := &clock{time.Unix(1_000_000, 0)}
	tr := NewTracker()
	tr.now = c.now
	k := tr.Start(Build, "debian-0000000003", 0)
	k.SetNote("running 10-install-packages")
	c.t = c.t.Add(12 * time.Minute)
	s := tr.Running()[0]
	if _, ok := s.ETA(); ok {
		t.Error("a build without a total has an ETA")
	}
	if got, want := s.Summary(), "running 12m0s: running 10-install-packages"; got != want {
		t.Errorf("summary = %q, want %q", got, want)
	}
}

func TestNilTrackerDoesNothing(t *testing.T) {
	var tr *Tracker
	k := tr.Start(Upload, "x", 1)
	k.Add(1)
	k.Set(1)
	k.SetTotal(2)
	k.SetNote("n")
	k.End()
	if tr.Running() != nil {
		t.Error("a nil tracker has tasks")
	}
}

func TestBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 3 << 29: "1.5 GiB", 5 << 40: "5.0 TiB"} {
		if got := Bytes(n); got != want {
			t.Errorf("Bytes(%d) = %q, want %q", n, got, want)
		}
	}
}

// syncBuffer is a log sink safe for the logging goroutine and the test.
type syncBuffer struct {
	ch chan string
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.ch <- string(p)
	return len(p), nil
}

func TestLogReportsLongTasksOnly(t *testing.T) {
	tr := NewTracker()
	long := tr.Start(Download, "long-0000000001.raw", 1<<30)
	long.started = long.started.Add(-time.Minute)
	long.Add(300 << 20)
	short := tr.Start(Upload, "short", 10)
	defer short.End()
	out := &syncBuffer{ch: make(chan string, 16)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go tr.Log(ctx, slog.New(slog.NewTextHandler(out, nil)), 20*time.Millisecond)
	select {
	case line := <-out.ch:
		for _, want := range []string{"download progress", "subject=long-0000000001.raw", "done=314572800", "total=1073741824", "eta="} {
			if !strings.Contains(line, want) {
				t.Errorf("progress line %q lacks %q", line, want)
			}
		}
		if strings.Contains(line, "short") {
			t.Errorf("a task younger than the interval was logged: %q", line)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no progress line within 5 s")
	}
}

// TestLogFirstLineOneIntervalAfterStart: a task that starts while the logger
// waits gets its first line one interval after its own start, whatever the
// logger's phase, and then one every interval.
func TestLogFirstLineOneIntervalAfterStart(t *testing.T) {
	const every = time.Hour
	tr := NewTracker()
	out := &syncBuffer{ch: make(chan string, 16)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go tr.Log(ctx, slog.New(slog.NewTextHandler(out, nil)), every)

	// Started an interval ago but for 200 ms: its first line is due in 200 ms,
	// long before the logger's own first hour is up.
	k := tr.startAt(Download, "img-0000000001.raw", 1<<20, time.Now().Add(-every+200*time.Millisecond))
	defer k.End()
	select {
	case line := <-out.ch:
		if !strings.Contains(line, "subject=img-0000000001.raw") || !strings.Contains(line, "elapsed=1h0m0s") {
			t.Errorf("first progress line = %q; want the task at one interval", line)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no progress line one interval after the task started")
	}
	select {
	case line := <-out.ch:
		t.Fatalf("a second line before the task's second interval: %q", line)
	default:
	}
}

// TestLogEveryInterval: a task is logged once for each interval it reaches,
// at its own cadence.
func TestLogEveryInterval(t *testing.T) {
	const every = time.Hour
	tr := NewTracker()
	// Nearly two intervals old: logged at once for its first, and again 1.6 s
	// later for its second.
	k := tr.startAt(Build, "img-0000000002", 0, time.Now().Add(-2*every+1600*time.Millisecond))
	defer k.End()
	out := &syncBuffer{ch: make(chan string, 16)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go tr.Log(ctx, slog.New(slog.NewTextHandler(out, nil)), every)
	for i, want := range []string{"elapsed=1h59m5", "elapsed=2h0m0s"} {
		select {
		case line := <-out.ch:
			if !strings.Contains(line, want) {
				t.Errorf("line %d = %q; want %s", i+1, line, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("line %d: none within 10 s", i+1)
		}
	}
}

// TestDueForgetsEndedTasks: the logger's memory of a task goes with it.
func TestDueForgetsEndedTasks(t *testing.T) {
	tr := NewTracker()
	k := tr.startAt(Upload, "u", 10, time.Now().Add(-3*time.Minute))
	logged := map[uint64]int64{}
	lines, next := tr.due(logged, time.Minute)
	if len(lines) != 1 || logged[k.id] != 3 {
		t.Fatalf("due = %v, logged %v; want the task once, at its third interval", lines, logged)
	}
	if want := k.started.Add(4 * time.Minute); !next.Equal(want) {
		t.Errorf("next = %v; want %v, the task's fourth interval", next, want)
	}
	if lines, _ := tr.due(logged, time.Minute); len(lines) != 0 {
		t.Errorf("due again within the same interval: %v", lines)
	}
	k.End()
	if _, next := tr.due(logged, time.Minute); !next.IsZero() || len(logged) != 0 {
		t.Errorf("after the task ended: next %v, logged %v; want nothing", next, logged)
	}
}
