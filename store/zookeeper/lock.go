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
	"sync/atomic"
	"time"

	"github.com/z-division/go-zookeeper/zk"

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
	released atomic.Bool // writes after Release are not made under it
}

func (h *zkHeld) Lost() <-chan struct{} { return h.lostCh }

func (h *zkHeld) Release() {
	h.release.Do(func() {
		h.released.Store(true)
		h.set.mu.Lock()
		delete(h.set.held, h)
		h.set.mu.Unlock()
		if err := h.set.b.delete(h.node, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
			h.set.withdrawLater(path.Dir(h.node), path.Base(h.node), err)
		}
	})
}

// withdrawLater deletes, once ZooKeeper answers again, the contender nodes of
// this process under a lock node whose names begin with prefix: a release or
// a take that failed on a lost connection. The session may well survive the
// outage, and with it those nodes: left alone, they would hold the lock for a
// process that believes it does not, until it exits.
func (s *lockSet) withdrawLater(lockNode, prefix string, cause error) {
	s.b.log.Info("lock node left by a lost connection; it is removed once ZooKeeper answers", "lock", lockNode, "error", cause)
	go func() {
		delay := 250 * time.Millisecond
		for {
			select {
			case <-s.b.done:
				return // the session ends, and the nodes with it
			case <-time.After(delay):
			}
			if s.withdraw(lockNode, prefix) {
				return
			}
			delay = min(2*delay, 10*time.Second)
		}
	}()
}

// withdraw deletes this process's contender nodes with the prefix and tells
// whether none is left (or the session that made them is gone).
func (s *lockSet) withdraw(lockNode, prefix string) bool {
	kids, _, err := s.b.children(lockNode)
	if errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrSessionExpired) {
		return true
	}
	if err != nil {
		return false
	}
	done := true
	for _, k := range kids {
		if !strings.HasPrefix(k, prefix) {
			continue
		}
		if err := s.b.delete(lockNode+"/"+k, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
			done = false
		}
	}
	return done
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
	prefix := hex.EncodeToString(id[:]) + "__lock__"
	node, err := b.create(lp+"/"+prefix, nil, zk.FlagEphemeral|zk.FlagSequence)
	if err != nil {
		if !errors.Is(err, zk.ErrNoNode) {
			// The node may have been made before the answer was lost; its name
			// is known by the prefix, as kazoo finds its own.
			b.locks.withdrawLater(lp, prefix, err)
		}
		return nil, fmt.Errorf("lock %s: %w", key, err)
	}
	kids, _, err := b.children(lp)
	if err != nil {
		if err := b.delete(node, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
			b.locks.withdrawLater(lp, path.Base(node), err)
		}
		return nil, fmt.Errorf("lock %s: %w", key, err)
	}
	sort.Slice(kids, func(i, j int) bool { return lockSequence(kids[i]) < lockSequence(kids[j]) })
	if len(kids) == 0 || kids[0] != path.Base(node) {
		if err := b.delete(node, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
			b.locks.withdrawLater(lp, path.Base(node), err)
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
