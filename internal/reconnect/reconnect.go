// Package reconnect is the policy of a long-lived connection that keeps
// coming back: how long to wait before the next try, and which failures to
// log, so that a server that stays away neither floods the log nor is
// hammered, and builders that lost it together do not all come back at once.
package reconnect

import (
	"math/rand/v2"
	"time"
)

// Streak follows the failures of one connection. A streak starts with the
// first failure after a connection that lasted StableAfter (or at the start);
// within it the wait doubles from Min up to Max, with jitter over its upper
// half, and the first failure is logged, then one every LogEvery.
type Streak struct {
	Min, Max    time.Duration
	StableAfter time.Duration
	LogEvery    time.Duration

	failures int
	lastLog  time.Time
}

// The builder's connections start a new streak after one that lasted a
// minute, and log a streak that goes on every five minutes.
const (
	DefaultStableAfter = time.Minute
	DefaultLogEvery    = 5 * time.Minute
)

// New is a Streak whose wait goes from min up to max, with the builder's
// StableAfter and LogEvery.
func New(min, max time.Duration) *Streak {
	return &Streak{Min: min, Max: max, StableAfter: DefaultStableAfter, LogEvery: DefaultLogEvery}
}

// Failed records a failed or lost connection; lasted is how long it was up,
// zero when it never was. It returns the wait before the next try and whether
// this failure is to be logged.
func (s *Streak) Failed(lasted time.Duration) (wait time.Duration, logIt bool) {
	if lasted >= s.StableAfter && lasted > 0 {
		s.failures = 0
	}
	d := s.Max
	if s.failures < 30 {
		d = min(s.Max, s.Min<<s.failures)
	}
	s.failures++
	now := time.Now()
	if s.failures == 1 || now.Sub(s.lastLog) >= s.LogEvery {
		s.lastLog, logIt = now, true
	}
	return d/2 + rand.N(d/2+1), logIt
}

// Failures is the number of failures in the streak, 0 when none is running.
func (s *Streak) Failures() int { return s.failures }
