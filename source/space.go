package source

import (
	"sync"
	"time"
)

// spaceBackoff remembers, per image, how long its work waits after the
// images-dir ran out of space: the wait doubles with each failure, from a
// minute to an hour, and ends with the first step that does not run out.
type spaceBackoff struct {
	mu   sync.Mutex
	next map[string]time.Time
	wait map[string]time.Duration
}

// Bounds of the wait after a step ran out of space.
const (
	firstSpaceWait = time.Minute
	maxSpaceWait   = time.Hour
)

func newSpaceBackoff() *spaceBackoff {
	return &spaceBackoff{next: map[string]time.Time{}, wait: map[string]time.Duration{}}
}

func (b *spaceBackoff) until(image string) time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.next[image]
}

// fail records a failure at now and returns the wait until the next try.
func (b *spaceBackoff) fail(image string, now time.Time) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	w := b.wait[image] * 2
	w = max(firstSpaceWait, min(w, maxSpaceWait))
	b.wait[image], b.next[image] = w, now.Add(w)
	return w
}

func (b *spaceBackoff) clear(image string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.next, image)
	delete(b.wait, image)
}
