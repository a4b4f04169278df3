package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// localLocks are the locks of one process.
type localLocks struct {
	mu   sync.Mutex
	held map[LockKey]bool
}

func (l *localLocks) try(key LockKey) (Held, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held[key] {
		return nil, fmt.Errorf("lock %s: %w", key, ErrHeld)
	}
	if l.held == nil {
		l.held = map[LockKey]bool{}
	}
	l.held[key] = true
	return &localHeld{l: l, key: key}, nil
}

// localHeld is a lock of this process, released once.
type localHeld struct {
	l    *localLocks
	key  LockKey
	once sync.Once
}

func (h *localHeld) Release() {
	h.once.Do(func() {
		h.l.mu.Lock()
		defer h.l.mu.Unlock()
		delete(h.l.held, h.key)
	})
}

// Lost is never closed: a lock of this process goes with the process.
func (h *localHeld) Lost() <-chan struct{} { return nil }

// UnderLock returns a context that ends when ctx does or when the lock is lost,
// for work that must stop before it writes again without the lock.
//
// The context carries the lock: a backend whose locks can go (ZooKeeper) makes
// every write on it, or on a context made from it, conditional on the lock still
// being held, so that work that learns late of the loss writes nothing.
func UnderLock(ctx context.Context, h Held) (context.Context, context.CancelFunc) {
	held := append(append([]Held(nil), HeldLocks(ctx)...), h)
	ctx = context.WithValue(ctx, heldKey{}, held)
	ctx, cancel := context.WithCancelCause(ctx)
	if lost := h.Lost(); lost != nil {
		go func() {
			select {
			case <-lost:
				cancel(ErrLockLost)
			case <-ctx.Done():
			}
		}()
	}
	return ctx, func() { cancel(context.Canceled) }
}

// Hold takes the lock of key without waiting, as TryLock does (ErrHeld when
// another holder has it), and returns a context under it (see UnderLock) and
// the function that lets the lock go, to call once the work under it is done.
func (s *Store) Hold(ctx context.Context, key LockKey) (context.Context, func(), error) {
	held, err := s.TryLock(ctx, key)
	if err != nil {
		return ctx, nil, err
	}
	lctx, cancel := UnderLock(ctx, held)
	return lctx, func() {
		cancel()
		held.Release()
	}, nil
}

type heldKey struct{}

// HeldLocks are the locks ctx was made under by UnderLock, outermost first.
func HeldLocks(ctx context.Context) []Held {
	h, _ := ctx.Value(heldKey{}).([]Held)
	return h
}

// ErrLockLost is the cause of a context UnderLock ended because its lock went.
var ErrLockLost = errors.New("lock lost with the ZooKeeper session")

// LockLost tells whether ctx, from UnderLock, ended because its lock went:
// then nothing more may be written for the work done under it.
func LockLost(ctx context.Context) bool { return errors.Is(context.Cause(ctx), ErrLockLost) }

// FreshRequests is a Backend whose BuildRequests may lag behind the state (a
// cache that follows ZooKeeper's watches), and that reads one request afresh.
type FreshRequests interface {
	// BuildRequest reads an image's build request from the state itself.
	BuildRequest(ctx context.Context, image string) (time.Time, bool, error)
}

// BuildRequest reads an image's build request from the state itself, not from
// a cache that may not yet have seen another builder clear it: work that took
// the image's lock decides on it so.
func (s *Store) BuildRequest(ctx context.Context, image string) (time.Time, bool, error) {
	if f, ok := s.backend.(FreshRequests); ok {
		return f.BuildRequest(ctx, image)
	}
	reqs, err := s.BuildRequests(ctx)
	if err != nil {
		return time.Time{}, false, err
	}
	at, ok := reqs[image]
	return at, ok, nil
}
