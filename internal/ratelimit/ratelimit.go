// Package ratelimit bounds what outside input may make the builder do for one
// key (a zuul-image, for the polls of Zuul that MQTT reports and gearman jobs
// ask for): a token bucket per key, whose refused asks are held as one and
// given when a token is back.
package ratelimit

import (
	"math"
	"time"
)

// Limiter bounds the asks for each key with a token bucket: burst asks at
// once, then one more every interval. An ask that finds the bucket empty is
// held, and given when a token is back: during a flood the key is still served
// soon after the last ask, only not for each. A Limiter is not safe for
// concurrent use.
type Limiter struct {
	burst    float64
	interval time.Duration
	buckets  map[string]*bucket
}

type bucket struct {
	tokens float64
	at     time.Time // when tokens was counted
	held   bool      // an ask waits for a token
}

// New returns a Limiter of burst asks at once, then one every interval.
func New(burst int, interval time.Duration) *Limiter {
	return &Limiter{burst: float64(burst), interval: interval, buckets: map[string]*bucket{}}
}

// refill counts the tokens of b at now.
func (l *Limiter) refill(b *bucket, now time.Time) {
	if elapsed := now.Sub(b.at); elapsed > 0 {
		b.tokens = min(l.burst, b.tokens+float64(elapsed)/float64(l.interval))
		b.at = now
	}
}

// Allow takes a token for an ask for key at now and tells whether there was
// one; when there was not, the ask is held for Release.
func (l *Limiter) Allow(key string, now time.Time) bool {
	b, ok := l.buckets[key]
	if !ok {
		b = &bucket{tokens: l.burst, at: now}
		l.buckets[key] = b
	}
	l.refill(b, now)
	if b.tokens >= 1 && !b.held {
		b.tokens--
		return true
	}
	b.held = true
	return false
}

// Release returns the keys whose held ask has its token by now, taking it,
// and when the next held ask will have one (zero when none is held). Keys
// whose bucket is full again and hold nothing are forgotten, so that keys gone
// from the config do not stay.
func (l *Limiter) Release(now time.Time) (keys []string, next time.Time) {
	for key, b := range l.buckets {
		l.refill(b, now)
		switch {
		case b.held && b.tokens >= 1:
			b.tokens--
			b.held = false
			keys = append(keys, key)
		case b.held:
			at := now.Add(time.Duration(math.Ceil((1 - b.tokens) * float64(l.interval))))
			if next.IsZero() || at.Before(next) {
				next = at
			}
		case b.tokens >= l.burst:
			delete(l.buckets, key)
		}
	}
	return keys, next
}
