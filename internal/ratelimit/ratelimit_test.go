package ratelimit

import (
	"reflect"
	"testing"
	"time"
)

// near tells whether a is b, give or take the rounding of counting tokens.
func near(a, b time.Time) bool {
	d := a.Sub(b)
	return -time.Millisecond < d && d < time.Millisecond
}

func TestLimiter(t *testing.T) {
	l := New(2, 30*time.Second)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

	// A flood at one instant: the burst goes through, the rest is held as one hint.
	allowed := 0
	for range 200 {
		if l.Allow("debian", t0) {
			allowed++
		}
	}
	if allowed != 2 {
		t.Fatalf("a flood of 200 let %d hints through, want 2", allowed)
	}
	// Another image has a bucket of its own.
	if !l.Allow("ubuntu", t0) {
		t.Errorf("the first hint for another image was held")
	}
	images, next := l.Release(t0.Add(29 * time.Second))
	if len(images) != 0 || !near(next, t0.Add(30*time.Second)) {
		t.Errorf("release after 29s = %v, next %v; want none until %v", images, next, t0.Add(30*time.Second))
	}
	images, next = l.Release(t0.Add(30 * time.Second))
	if !reflect.DeepEqual(images, []string{"debian"}) || !next.IsZero() {
		t.Errorf("release after 30s = %v, next %v; want [debian], nothing more held", images, next)
	}
	images, _ = l.Release(t0.Add(31 * time.Second))
	if len(images) != 0 {
		t.Errorf("a held hint was given twice: %v", images)
	}
	// Still in the flood: held again, given a token later.
	if l.Allow("debian", t0.Add(40*time.Second)) {
		t.Errorf("a hint 10s after the held one went through")
	}
	if _, next = l.Release(t0.Add(40 * time.Second)); !near(next, t0.Add(60*time.Second)) {
		t.Errorf("next release at %v, want %v", next, t0.Add(60*time.Second))
	}
	// After a quiet while, the first report goes through at once.
	images, _ = l.Release(t0.Add(10 * time.Minute))
	if !reflect.DeepEqual(images, []string{"debian"}) {
		t.Errorf("release after quiet = %v, want the held debian", images)
	}
	l.Release(t0.Add(20 * time.Minute))
	if !l.Allow("debian", t0.Add(20*time.Minute)) {
		t.Errorf("the first hint after quiet was held")
	}
	// Full buckets that hold nothing are forgotten.
	l.Release(t0.Add(time.Hour))
	if len(l.buckets) != 0 {
		t.Errorf("buckets left after an hour of quiet: %v", l.buckets)
	}
}
