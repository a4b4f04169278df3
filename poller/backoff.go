package poller

import (
	"sync"
	"time"
)

// Backoff remembers, per image, how long fetching waits after the images-dir
// ran out of space: the wait doubles with each failure, from a minute to an
// hour, and ends with the first fetch that does not run out.
type Backoff struct {
	mu   sync.Mutex
	next map[string]time.Time
	wait map[string]time.Duration
}

// Bounds of the wait after a fetch ran out of space.
const (
	firstSpaceWait = time.Minute
	maxSpaceWait   = time.Hour
)

// NewBackoff returns a Backoff with nothing waiting.
func NewBackoff() *Backoff {
	return &Backoff{next: map[string]time.Time{}, wait: map[string]time.Duration{}}
}

func (b *Backoff) until(image string) time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.next[image]
}

// fail records a failure at now and returns the wait until the next try.
func (b *Backoff) fail(image string, now time.Time) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	w := b.wait[image] * 2
	w = max(firstSpaceWait, min(w, maxSpaceWait))
	b.wait[image], b.next[image] = w, now.Add(w)
	return w
}

func (b *Backoff) clear(image string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.next, image)
	delete(b.wait, image)
}
