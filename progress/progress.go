// Package progress keeps what long work runs now and how far it has gone
// (downloads, uploads, builds), for the log, the status page and image-status.
package progress

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Kind is what a task does.
type Kind string

// The kinds of long work.
const (
	Download Kind = "download"
	Upload   Kind = "upload"
	Build    Kind = "build"
)

// rateWindow is how far back the rate of a task is measured.
const rateWindow = 30 * time.Second

// Tracker holds the tasks that run now. A nil *Tracker tracks nothing, and
// the tasks it starts are nil, whose methods do nothing.
type Tracker struct {
	now   func() time.Time
	mu    sync.Mutex
	next  uint64
	tasks map[uint64]*Task
	// started is closed when a task starts, to wake the logger.
	started chan struct{}
}

// NewTracker returns an empty tracker.
func NewTracker() *Tracker {
	return &Tracker{now: time.Now, tasks: map[uint64]*Task{}}
}

// Start registers a task of a kind on a subject (a build's name, an upload's
// key); total is its size in bytes, 0 when not known.
func (t *Tracker) Start(kind Kind, subject string, total int64) *Task {
	if t == nil {
		return nil
	}
	return t.startAt(kind, subject, total, t.now())
}

func (t *Tracker) startAt(kind Kind, subject string, total int64, at time.Time) *Task {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.next++
	k := &Task{t: t, id: t.next, kind: kind, subject: subject, started: at}
	k.total.Store(total)
	t.tasks[k.id] = k
	if t.started != nil {
		close(t.started)
		t.started = nil
	}
	return k
}

// Task is one piece of long work. Its methods may be called from any goroutine.
type Task struct {
	t       *Tracker
	id      uint64
	kind    Kind
	subject string
	started time.Time
	done    atomic.Int64
	total   atomic.Int64

	mu      sync.Mutex
	note    string
	samples []sample // (time, done) now and then, for the rate
}

type sample struct {
	at   time.Time
	done int64
}

// Add counts n more bytes done.
func (k *Task) Add(n int64) {
	if k != nil {
		k.done.Add(n)
	}
}

// Set says how many bytes are done in all.
func (k *Task) Set(n int64) {
	if k != nil {
		k.done.Store(n)
	}
}

// SetTotal says how many bytes there are in all, once it is known.
func (k *Task) SetTotal(n int64) {
	if k != nil {
		k.total.Store(n)
	}
}

// SetNote says what the task does now, for work without a byte count (the
// step a build is at).
func (k *Task) SetNote(note string) {
	if k == nil {
		return
	}
	k.mu.Lock()
	k.note = note
	k.mu.Unlock()
}

// End removes the task: it is done, or failed.
func (k *Task) End() {
	if k == nil {
		return
	}
	k.t.mu.Lock()
	delete(k.t.tasks, k.id)
	k.t.mu.Unlock()
}

// Status is a task as it stands.
type Status struct {
	ID      uint64    `json:"id"`
	Kind    Kind      `json:"kind"`
	Subject string    `json:"subject"`
	Started time.Time `json:"started"`
	// Done and Total are bytes; Total is 0 when not known.
	Done  int64 `json:"done"`
	Total int64 `json:"total"`
	// Rate is bytes per second over the last 30 s, or since the start when
	// the task is younger.
	Rate float64 `json:"bytes_per_second"`
	Note string  `json:"note,omitempty"`
	// Elapsed is how long the task has run when the status was taken.
	Elapsed time.Duration `json:"elapsed_ns"`
}

// Running returns the tasks that run now, oldest first.
func (t *Tracker) Running() []Status {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	tasks := make([]*Task, 0, len(t.tasks))
	for _, k := range t.tasks {
		tasks = append(tasks, k)
	}
	t.mu.Unlock()
	now := t.now()
	out := make([]Status, 0, len(tasks))
	for _, k := range tasks {
		out = append(out, k.status(now))
	}
	slices.SortFunc(out, func(a, b Status) int {
		return cmp.Or(a.Started.Compare(b.Started), cmp.Compare(a.ID, b.ID))
	})
	return out
}

// status takes the task's status at now, and samples its rate.
func (k *Task) status(now time.Time) Status {
	done := k.done.Load()
	k.mu.Lock()
	defer k.mu.Unlock()
	// Keep a sample a second at most, and none older than the window but one,
	// so that the oldest one kept spans it.
	if n := len(k.samples); n == 0 || now.Sub(k.samples[n-1].at) >= time.Second {
		k.samples = append(k.samples, sample{now, done})
	}
	for len(k.samples) > 2 && now.Sub(k.samples[1].at) >= rateWindow {
		k.samples = k.samples[1:]
	}
	s := Status{ID: k.id, Kind: k.kind, Subject: k.subject, Started: k.started, Done: done, Total: k.total.Load(),
		Note: k.note, Elapsed: now.Sub(k.started)}
	from := sample{k.started, 0}
	if now.Sub(k.started) > rateWindow && now.Sub(k.samples[0].at) > 0 {
		from = k.samples[0]
	}
	if d := now.Sub(from.at).Seconds(); d > 0 {
		s.Rate = float64(done-from.done) / d
	}
	return s
}

// Percent is how much of the task is done, when its total is known.
func (s Status) Percent() (float64, bool) {
	if s.Total <= 0 {
		return 0, false
	}
	return min(float64(s.Done)*100/float64(s.Total), 100), true
}

// ETA is how long the task should take yet at its current rate, when that
// can be told.
func (s Status) ETA() (time.Duration, bool) {
	if s.Total <= 0 || s.Rate <= 0 {
		return 0, false
	}
	left := max(s.Total-s.Done, 0)
	return time.Duration(float64(left) / s.Rate * float64(time.Second)).Round(time.Second), true
}

// Summary tells how far the task has gone in a few words, e.g.
// "1.2 GiB of 4.0 GiB (30%), 85 MiB/s, 34s left" or, for a build,
// "running 12m0s: <note>".
func (s Status) Summary() string {
	if s.Done == 0 && s.Total == 0 {
		out := "running " + s.Elapsed.Round(time.Second).String()
		if s.Note != "" {
			out += ": " + s.Note
		}
		return out
	}
	out := Bytes(s.Done)
	if pct, ok := s.Percent(); ok {
		out += fmt.Sprintf(" of %s (%.0f%%)", Bytes(s.Total), pct)
	}
	out += ", " + Bytes(int64(s.Rate)) + "/s"
	if eta, ok := s.ETA(); ok {
		out += ", " + eta.String() + " left"
	}
	return out
}

// Bytes formats a byte count in binary units: "512 B", "1.5 MiB".
func Bytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// Log writes a line for each running task until ctx ends: the daemon's and a
// non-terminal's view of long work. Each task keeps its own cadence: its first
// line comes one interval after it starts, then one every interval, so short
// work leaves no progress lines and long work is seen from its first interval.
func (t *Tracker) Log(ctx context.Context, log *slog.Logger, every time.Duration) {
	if t == nil || every <= 0 {
		return
	}
	logged := map[uint64]int64{} // task id: the intervals it was logged for
	timer := time.NewTimer(every)
	defer timer.Stop()
	for {
		started := t.startedSignal()
		lines, next := t.due(logged, every)
		for _, s := range lines {
			logLine(log, s)
		}
		wait := every
		if !next.IsZero() {
			wait = max(next.Sub(t.now()), 0)
		}
		timer.Reset(wait) // a stale tick is dropped by Reset since Go 1.23
		select {
		case <-ctx.Done():
			return
		case <-started:
		case <-timer.C:
		}
	}
}

// due returns the running tasks that have reached an interval they were not
// logged for yet, noting it in logged, and the time the next one is due (zero
// when no task runs). Tasks that ended are forgotten.
func (t *Tracker) due(logged map[uint64]int64, every time.Duration) ([]Status, time.Time) {
	running := t.Running()
	var lines []Status
	var next time.Time
	seen := make(map[uint64]bool, len(running))
	for _, s := range running {
		seen[s.ID] = true
		if n := int64(s.Elapsed / every); n > logged[s.ID] {
			logged[s.ID] = n
			lines = append(lines, s)
		}
		at := s.Started.Add(time.Duration(logged[s.ID]+1) * every)
		if next.IsZero() || at.Before(next) {
			next = at
		}
	}
	for id := range logged {
		if !seen[id] {
			delete(logged, id)
		}
	}
	return lines, next
}

// startedSignal returns a channel that is closed when the next task starts.
func (t *Tracker) startedSignal() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.started == nil {
		t.started = make(chan struct{})
	}
	return t.started
}

func logLine(log *slog.Logger, s Status) {
	attrs := []any{"kind", string(s.Kind), "subject", s.Subject, "done", s.Done,
		"elapsed", s.Elapsed.Round(time.Second).String()}
	if s.Total > 0 {
		attrs = append(attrs, "total", s.Total)
	}
	if s.Done > 0 {
		attrs = append(attrs, "bytes_per_second", int64(s.Rate))
	}
	if eta, ok := s.ETA(); ok {
		attrs = append(attrs, "eta", eta.String())
	}
	if s.Note != "" {
		attrs = append(attrs, "at", s.Note)
	}
	log.Info(string(s.Kind)+" progress: "+s.Summary(), attrs...)
}
