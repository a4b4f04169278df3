package builder

import (
	"context"
	"sync"

	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/uploader"
)

// queue holds planned uploads by key (a build to a provider): a key is queued or
// running at most once, so a plan made while its upload waits or runs adds
// nothing. Uploads start in the order they were queued, at most limit() at once.
type queue struct {
	mu      sync.Mutex
	pending []uploader.Planned
	queued  map[string]bool
	running map[string]*running
	changed chan struct{} // an upload was added or finished, or the limit changed
	// waiters hear how the upload of a key ended.
	waiters map[string][]chan<- outcome
}

// outcome is how a planned upload ended: the upload it made, or why not.
type outcome struct {
	upload store.Upload
	err    error
}

// running is a planned upload a worker is on.
type running struct {
	planned uploader.Planned
	cancel  context.CancelFunc
}

func newQueue() *queue {
	return &queue{queued: map[string]bool{}, running: map[string]*running{}, changed: make(chan struct{}, 1),
		waiters: map[string][]chan<- outcome{}}
}

func (q *queue) signal() {
	select {
	case q.changed <- struct{}{}:
	default:
	}
}

// add queues a planned upload unless its key is queued or running; it reports whether it did.
func (q *queue) add(j uploader.Planned) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.addLocked(j)
}

// addWait queues a planned upload like add, and returns a channel that hears
// how the upload of its key ended: this one, or the one queued or running already.
func (q *queue) addWait(j uploader.Planned) (<-chan outcome, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	ch := make(chan outcome, 1)
	q.waiters[j.Key()] = append(q.waiters[j.Key()], ch)
	return ch, q.addLocked(j)
}

func (q *queue) addLocked(j uploader.Planned) bool {
	k := j.Key()
	if q.queued[k] || q.running[k] != nil {
		return false
	}
	q.queued[k] = true
	q.pending = append(q.pending, j)
	q.signal()
	return true
}

// take waits until an upload is queued and fewer than limit() run, then moves
// it to running under a context derived from ctx; the caller runs it and calls
// done. It returns false when ctx ends first, or, with untilIdle, once nothing is
// queued or running. One dispatcher calls it.
func (q *queue) take(ctx context.Context, limit func() int, untilIdle bool) (uploader.Planned, context.Context, bool) {
	for {
		q.mu.Lock()
		if len(q.pending) > 0 && len(q.running) < limit() {
			j := q.pending[0]
			q.pending = q.pending[1:]
			delete(q.queued, j.Key())
			jctx, cancel := context.WithCancel(ctx)
			q.running[j.Key()] = &running{planned: j, cancel: cancel}
			q.mu.Unlock()
			return j, jctx, true
		}
		idle := len(q.pending) == 0 && len(q.running) == 0
		q.mu.Unlock()
		if untilIdle && idle {
			return uploader.Planned{}, nil, false
		}
		select {
		case <-ctx.Done():
			return uploader.Planned{}, nil, false
		case <-q.changed:
		}
	}
}

// done ends a running upload, telling its waiters how it went.
func (q *queue) done(j uploader.Planned, up store.Upload, err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if r := q.running[j.Key()]; r != nil {
		r.cancel()
		delete(q.running, j.Key())
	}
	q.tell(j.Key(), outcome{upload: up, err: err})
	q.signal()
}

// tell hands an outcome to the waiters of a key.
func (q *queue) tell(key string, o outcome) {
	for _, ch := range q.waiters[key] {
		ch <- o // buffered, and each hears once
	}
	delete(q.waiters, key)
}

// onBuild tells whether an upload of the build is queued or running.
func (q *queue) onBuild(buildID string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, r := range q.running {
		if r.planned.Build.ID == buildID {
			return true
		}
	}
	for _, j := range q.pending {
		if j.Build.ID == buildID {
			return true
		}
	}
	return false
}

// cancel stops the running uploads for which drop is true and drops such
// queued ones.
func (q *queue) cancel(drop func(uploader.Planned) bool) []uploader.Planned {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []uploader.Planned
	for _, r := range q.running {
		if drop(r.planned) {
			r.cancel()
			out = append(out, r.planned)
		}
	}
	kept := q.pending[:0]
	for _, j := range q.pending {
		if drop(j) {
			delete(q.queued, j.Key())
			q.tell(j.Key(), outcome{err: uploader.ErrDropped})
			out = append(out, j)
			continue
		}
		kept = append(kept, j)
	}
	q.pending = kept
	return out
}
