package reconnect

import (
	"testing"
	"time"
)

// TestWaits: within a streak the wait stays in the upper half of a bound that
// doubles from Min and stops at Max; a connection that lasted StableAfter
// starts a new streak at Min, a shorter one does not.
func TestWaits(t *testing.T) {
	s := Streak{Min: 500 * time.Millisecond, Max: 10 * time.Second, StableAfter: time.Minute, LogEvery: time.Hour}
	check := func(failures int) {
		t.Helper()
		upper := min(s.Max, s.Min<<min(failures, 30))
		for range 50 {
			probe := s
			d, _ := probe.Failed(0)
			if d < upper/2 || d > upper {
				t.Fatalf("wait after %d failures = %v, want within [%v, %v]", failures, d, upper/2, upper)
			}
		}
	}
	for failures := range 40 {
		check(failures)
		s.Failed(0)
	}
	if s.Failures() != 40 {
		t.Fatalf("failures = %d, want 40", s.Failures())
	}
	s.Failed(time.Second) // up, but not for long: the streak goes on
	if s.Failures() != 41 {
		t.Fatalf("after a short connection: failures = %d, want 41", s.Failures())
	}
	s.Failed(time.Minute)
	if s.Failures() != 1 {
		t.Fatalf("after a stable connection: failures = %d, want a new streak", s.Failures())
	}
	check(1)
}

// TestLogs: the first failure of a streak is logged, the next ones only once
// LogEvery has passed since the last one logged.
func TestLogs(t *testing.T) {
	s := Streak{Min: time.Millisecond, Max: time.Millisecond, StableAfter: time.Minute, LogEvery: time.Hour}
	if _, logIt := s.Failed(0); !logIt {
		t.Fatal("the first failure is not logged")
	}
	if _, logIt := s.Failed(0); logIt {
		t.Fatal("the second failure within LogEvery is logged")
	}
	s.lastLog = s.lastLog.Add(-time.Hour)
	if _, logIt := s.Failed(0); !logIt {
		t.Fatal("a failure LogEvery after the last logged one is not logged")
	}
	if _, logIt := s.Failed(time.Minute); !logIt {
		t.Fatal("the first failure of a new streak is not logged")
	}
}
