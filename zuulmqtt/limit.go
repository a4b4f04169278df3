package zuulmqtt

import (
	"math"
	"time"
)

// limiter bounds the hints for each image with a token bucket: burst hints at
// once, then one more every interval. A hint that finds the bucket empty is
// held, and given when a token is back: during a flood of reports the image is
// still polled soon after the last one, only not for each.
type limiter struct {
	burst    float64
	interval time.Duration
	buckets  map[string]*bucket
}

type bucket struct {
	tokens float64
	at     time.Time // when tokens was counted
	held   bool      // a hint waits for a token
}

func newLimiter(burst int, interval time.Duration) *limiter {
	return &limiter{burst: float64(burst), interval: interval, buckets: map[string]*bucket{}}
}

// refill counts the tokens of b at now.
func (l *limiter) refill(b *bucket, now time.Time) {
	if elapsed := now.Sub(b.at); elapsed > 0 {
		b.tokens = min(l.burst, b.tokens+float64(elapsed)/float64(l.interval))
		b.at = now
	}
}

// allow takes a token for a hint for image at now and tells whether there was
// one; when there was not, the hint is held for release.
func (l *limiter) allow(image string, now time.Time) bool {
	b, ok := l.buckets[image]
	if !ok {
		b = &bucket{tokens: l.burst, at: now}
		l.buckets[image] = b
	}
	l.refill(b, now)
	if b.tokens >= 1 && !b.held {
		b.tokens--
		return true
	}
	b.held = true
	return false
}

// release returns the images whose held hint has its token by now, taking
// it, and when the next held hint will have one (zero when none is held).
// Images whose bucket is full again and hold nothing are forgotten, so that
// images gone from the config do not stay.
func (l *limiter) release(now time.Time) (images []string, next time.Time) {
	for image, b := range l.buckets {
		l.refill(b, now)
		switch {
		case b.held && b.tokens >= 1:
			b.tokens--
			b.held = false
			images = append(images, image)
		case b.held:
			at := now.Add(time.Duration(math.Ceil((1 - b.tokens) * float64(l.interval))))
			if next.IsZero() || at.Before(next) {
				next = at
			}
		case b.tokens >= l.burst:
			delete(l.buckets, image)
		}
	}
	return images, next
}
