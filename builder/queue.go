package builder

import (
	"context"
	"sync"

	"github.com/nodepool-builder/nodepool-builder/uploader"
)

// queue holds upload jobs by key (a build to a provider): a key is queued or
// running at most once, so a plan made while its job waits or runs adds nothing.
// Jobs start in the order they were queued, at most limit() at once.
type queue struct {
	mu      sync.Mutex
	pending []uploader.Job
	queued  map[string]bool
	running map[string]*running
	changed chan struct{} // a job was added or finished, or the limit changed
}

// running is a job a worker is on.
type running struct {
	job    uploader.Job
	cancel context.CancelFunc
}

func newQueue() *queue {
	return &queue{queued: map[string]bool{}, running: map[string]*running{}, changed: make(chan struct{}, 1)}
}

func (q *queue) signal() {
	select {
	case q.changed <- struct{}{}:
	default:
	}
}

// add queues a job unless its key is queued or running; it reports whether it did.
func (q *queue) add(j uploader.Job) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	k := j.Key()
	if q.queued[k] || q.running[k] != nil {
		return false
	}
	q.queued[k] = true
	q.pending = append(q.pending, j)
	q.signal()
	return true
}

// take waits until a job is queued and fewer than limit() run, then moves the
// job to running under a context derived from ctx; the caller runs it and calls
// done. It returns false when ctx ends first, or, with untilIdle, once nothing is
// queued or running. One dispatcher calls it.
func (q *queue) take(ctx context.Context, limit func() int, untilIdle bool) (uploader.Job, context.Context, bool) {
	for {
		q.mu.Lock()
		if len(q.pending) > 0 && len(q.running) < limit() {
			j := q.pending[0]
			q.pending = q.pending[1:]
			delete(q.queued, j.Key())
			jctx, cancel := context.WithCancel(ctx)
			q.running[j.Key()] = &running{job: j, cancel: cancel}
			q.mu.Unlock()
			return j, jctx, true
		}
		idle := len(q.pending) == 0 && len(q.running) == 0
		q.mu.Unlock()
		if untilIdle && idle {
			return uploader.Job{}, nil, false
		}
		select {
		case <-ctx.Done():
			return uploader.Job{}, nil, false
		case <-q.changed:
		}
	}
}

// done ends a running job.
func (q *queue) done(j uploader.Job) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if r := q.running[j.Key()]; r != nil {
		r.cancel()
		delete(q.running, j.Key())
	}
	q.signal()
}

// onBuild tells whether a job of the build is queued or running.
func (q *queue) onBuild(buildID string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, r := range q.running {
		if r.job.Build.ID == buildID {
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

// cancel stops the running jobs for which drop is true and drops such queued jobs.
func (q *queue) cancel(drop func(uploader.Job) bool) []uploader.Job {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []uploader.Job
	for _, r := range q.running {
		if drop(r.job) {
			r.cancel()
			out = append(out, r.job)
		}
	}
	kept := q.pending[:0]
	for _, j := range q.pending {
		if drop(j) {
			delete(q.queued, j.Key())
			out = append(out, j)
			continue
		}
		kept = append(kept, j)
	}
	q.pending = kept
	return out
}

// busyImages is the set of images a source step of this process is on: their
// building records, partial downloads and conversions have an owner.
type busyImages struct {
	mu     sync.Mutex
	images map[string]int
}

func (b *busyImages) enter(image string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.images == nil {
		b.images = map[string]int{}
	}
	b.images[image]++
}

func (b *busyImages) leave(image string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.images[image]--; b.images[image] <= 0 {
		delete(b.images, image)
	}
}

func (b *busyImages) has(image string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.images[image] > 0
}
