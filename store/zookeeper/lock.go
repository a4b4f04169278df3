package zookeeper

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"sort"
	"strings"
	"sync"

	"github.com/go-zookeeper/zk"

	"github.com/nodepool-builder/nodepool-builder/store"
)

// Locks follow kazoo's Lock recipe, which nodepool uses, so that a Python
// builder and ours exclude each other: a contender is an ephemeral sequential
// child of the lock node named <uuid4 hex>__lock__<sequence>, and the lowest
// sequence holds the lock. Taking one without waiting, as the builders do:
// a contender that is not first withdraws at once.

// lockSet tracks the locks this process holds, to report them lost when the
// session that holds them expires.
type lockSet struct {
	b    *Backend
	mu   sync.Mutex
	held map[*zkHeld]bool
}

func newLockSet(b *Backend) *lockSet { return &lockSet{b: b, held: map[*zkHeld]bool{}} }

// lost closes the Lost channel of every lock held: the session that held them
// expired, and with it their ephemeral nodes.
func (s *lockSet) lost() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for h := range s.held {
		h.lostOnce.Do(func() { close(h.lostCh) })
		delete(s.held, h)
	}
}

// zkHeld is a lock this process holds.
type zkHeld struct {
	set      *lockSet
	node     string // our contender node
	lostCh   chan struct{}
	lostOnce sync.Once
	release  sync.Once
}

func (h *zkHeld) Lost() <-chan struct{} { return h.lostCh }

func (h *zkHeld) Release() {
	h.release.Do(func() {
		h.set.mu.Lock()
		delete(h.set.held, h)
		h.set.mu.Unlock()
		if err := h.set.b.delete(h.node, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
			// The node goes with the session anyway.
			h.set.b.log.Warn("could not release a lock; it goes when the session ends", "lock", h.node, "error", err)
		}
	})
}

// lockSuffixes are the kinds of contender kazoo names (exclusive and read locks).
var lockSuffixes = []string{"__lock__", "__rlock__"}

// lockSequence is the sort key of a contender: its sequence, or, for a name
// kazoo does not make, "~", which sorts after every digit (as kazoo sorts it).
func lockSequence(name string) string {
	for _, s := range lockSuffixes {
		if i := strings.Index(name, s); i >= 0 {
			return name[i+len(s):]
		}
	}
	return "~"
}

// TryLock takes the lock nodepool takes for key, without waiting. The record
// a build, upload or upload-number lock belongs to must exist: its lock node is
// made below it, never the record itself.
func (b *Backend) TryLock(_ context.Context, key store.LockKey) (store.Held, error) {
	lp := lockPath(key)
	if err := b.prepareLock(key, lp); err != nil {
		return nil, err
	}
	var id [16]byte
	rand.Read(id[:])
	node, err := b.create(lp+"/"+hex.EncodeToString(id[:])+"__lock__", nil, zk.FlagEphemeral|zk.FlagSequence)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", key, err)
	}
	kids, _, err := b.children(lp)
	if err != nil {
		b.delete(node, -1)
		return nil, fmt.Errorf("lock %s: %w", key, err)
	}
	sort.Slice(kids, func(i, j int) bool { return lockSequence(kids[i]) < lockSequence(kids[j]) })
	if len(kids) == 0 || kids[0] != path.Base(node) {
		if err := b.delete(node, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
			b.log.Warn("could not withdraw from a lock; it goes when the session ends", "lock", node, "error", err)
		}
		return nil, fmt.Errorf("lock %s: %w", key, store.ErrHeld)
	}
	h := &zkHeld{set: b.locks, node: node, lostCh: make(chan struct{})}
	b.locks.mu.Lock()
	b.locks.held[h] = true
	b.locks.mu.Unlock()
	return h, nil
}

// prepareLock makes the lock node and the nodes between it and the record it
// belongs to, which must exist.
func (b *Backend) prepareLock(key store.LockKey, lp string) error {
	if key.BuildID == "" {
		return b.ensure(lp)
	}
	anchor := buildPath(key.Image, key.BuildID)
	if key.UploadID != "" {
		anchor = uploadPath(key.Image, key.BuildID, key.Provider, key.UploadID)
	}
	if ok, _, err := b.exists(anchor); err != nil {
		return fmt.Errorf("lock %s: %w", key, err)
	} else if !ok {
		return fmt.Errorf("lock %s: %w", key, store.ErrNotFound)
	}
	// Made one by one below the record: were it deleted meanwhile, a create
	// fails instead of bringing its path back.
	for p := anchor; p != lp; {
		next := lp[:len(p)+1+strings.IndexByte(lp[len(p)+1:]+"/", '/')]
		if _, err := b.create(next, nil, 0); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			if errors.Is(err, zk.ErrNoNode) {
				return fmt.Errorf("lock %s: %w", key, store.ErrNotFound)
			}
			return fmt.Errorf("lock %s: %w", key, err)
		}
		p = next
	}
	return nil
}
