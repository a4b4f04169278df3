package source

import (
	"context"
	"sync"
)

// busyImages is the set of images a source step of this process is on: their
// building records, partial downloads and conversions have an owner. One step
// runs on an image at a time.
type busyImages struct {
	mu     sync.Mutex
	images map[string]chan struct{} // closed when the step leaves
}

// tryEnter marks the image busy unless it is; it reports whether it did.
func (b *busyImages) tryEnter(image string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, busy := b.images[image]; busy {
		return false
	}
	if b.images == nil {
		b.images = map[string]chan struct{}{}
	}
	b.images[image] = make(chan struct{})
	return true
}

// enter waits until the image is not busy and marks it busy, or fails when ctx
// ends first.
func (b *busyImages) enter(ctx context.Context, image string) error {
	for {
		b.mu.Lock()
		left, busy := b.images[image]
		b.mu.Unlock()
		if !busy {
			if b.tryEnter(image) {
				return nil
			}
			continue
		}
		select {
		case <-left:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (b *busyImages) leave(image string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if left, ok := b.images[image]; ok {
		close(left)
		delete(b.images, image)
	}
}

func (b *busyImages) has(image string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, busy := b.images[image]
	return busy
}
