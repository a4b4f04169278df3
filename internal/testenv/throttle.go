package testenv

import (
	"sync"
	"time"
)

// The directions of a link: what the client sends to the target, and what
// comes back.
const (
	dirToTarget = iota
	dirFromTarget
)

// SetLinkRate caps the proxy at about n bytes per second in each direction for
// all its connections together, as one network link would; 0 lifts the cap.
// Each direction has one token bucket that every connection takes from: a
// client that opens several connections gets no more than one would.
// SetRate's cap of each connection still applies on top.
func (p *Proxy) SetLinkRate(n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n <= 0 {
		p.link = [2]*bucket{}
		return
	}
	p.link = [2]*bucket{newBucket(n), newBucket(n)}
}

// bucket is a token bucket of bytes. Its tokens may go below zero: they are
// then bytes granted to callers that wait for the bucket to refill, in the
// order they asked, so that the connections of a link share it evenly.
type bucket struct {
	mu     sync.Mutex
	rate   float64 // bytes per second
	burst  float64
	tokens float64
	at     time.Time // when tokens was counted
}

// newBucket returns a bucket of rate bytes per second, full. Its burst is 50 ms
// of data, and at least a buffer of the proxy's, so that a sleep longer than
// asked is made up for by the next bytes rather than lost.
func newBucket(rate int64) *bucket {
	burst := max(float64(rate)/20, 32<<10)
	return &bucket{rate: float64(rate), burst: burst, tokens: burst, at: time.Now()}
}

// take waits until n bytes may pass. A nil bucket lets everything pass.
func (b *bucket) take(n int) {
	if b == nil {
		return
	}
	b.mu.Lock()
	now := time.Now()
	b.tokens = min(b.burst, b.tokens+now.Sub(b.at).Seconds()*b.rate)
	b.at = now
	b.tokens -= float64(n)
	wait := time.Duration(-b.tokens / b.rate * float64(time.Second))
	b.mu.Unlock()
	if wait > 0 {
		// The limiter's pace, not a wait for an event.
		time.Sleep(wait)
	}
}
