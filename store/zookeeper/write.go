package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"path"
	"sort"
	"strings"

	"github.com/z-division/go-zookeeper/zk"

	"github.com/nodepool-builder/nodepool-builder/store"
)

// step is one change of a Write as ZooKeeper operations, with what to do once
// the whole multi succeeded.
type step struct {
	ops  []any
	done func(res []zk.MultiResponse) // res holds this step's responses
}

// Write applies the changes in one multi: every record's znode is written
// against the version it was read at, so the write fails, whole, with
// store.ErrConflict when any changed meanwhile. An upload made by the write gets
// its sequence id from ZooKeeper; its extra node follows in a second request.
func (b *Backend) Write(ctx context.Context, changes ...store.Change) error {
	var steps []step
	var after []func() error
	for _, ch := range changes {
		st, later, err := b.plan(ch)
		if err != nil {
			return err
		}
		steps = append(steps, st)
		if later != nil {
			after = append(after, later)
		}
	}
	var ops []any
	for _, s := range steps {
		ops = append(ops, s.ops...)
	}
	if len(ops) == 0 {
		return nil
	}
	// Under a lock, the write holds only while the lock does: its node, an
	// ephemeral one of the session that took it, is checked in the same
	// multi. A client that learns late that its session expired may
	// meanwhile send what it queued on a new session.
	checks, err := b.lockChecks(ctx)
	if err != nil {
		return err
	}
	res, err := b.multi(append(checks, ops...)...)
	if err != nil {
		for _, r := range res[:min(len(checks), len(res))] {
			if r.Error != nil {
				return fmt.Errorf("write to ZooKeeper: %w (%w)", store.ErrLockLost, r.Error)
			}
		}
		return b.writeError(err, res)
	}
	res = res[len(checks):]
	i := 0
	for _, s := range steps {
		s.done(res[i : i+len(s.ops)])
		i += len(s.ops)
	}
	var errs []error
	for _, f := range after {
		errs = append(errs, f())
	}
	return errors.Join(errs...)
}

// lockChecks are the operations that check that the locks ctx was made under
// (store.UnderLock) are still held; an error when one is known lost.
func (b *Backend) lockChecks(ctx context.Context) ([]any, error) {
	var checks []any
	for _, h := range store.HeldLocks(ctx) {
		zh, ok := h.(*zkHeld)
		if !ok || zh.set != b.locks || zh.released.Load() {
			continue
		}
		select {
		case <-zh.lostCh:
			return nil, fmt.Errorf("write to ZooKeeper: %w", store.ErrLockLost)
		default:
		}
		checks = append(checks, &zk.CheckVersionRequest{Path: zh.node, Version: -1})
	}
	return checks, nil
}

// writeError turns a failed multi into an error; a version that moved, a node
// gone or one that is there already is a conflict.
func (b *Backend) writeError(err error, res []zk.MultiResponse) error {
	conflicts := []error{zk.ErrBadVersion, zk.ErrNoNode, zk.ErrNodeExists, zk.ErrNotEmpty}
	for _, c := range conflicts {
		if errors.Is(err, c) {
			return fmt.Errorf("write to ZooKeeper: %w: %w", store.ErrConflict, err)
		}
	}
	for _, r := range res {
		for _, c := range conflicts {
			if errors.Is(r.Error, c) {
				return fmt.Errorf("write to ZooKeeper: %w: %w", store.ErrConflict, r.Error)
			}
		}
	}
	return fmt.Errorf("write to ZooKeeper: %w", err)
}

// plan turns one change into operations.
func (b *Backend) plan(ch store.Change) (step, func() error, error) {
	switch {
	case ch.Build() != nil && ch.Deletes():
		return b.planDeleteBuild(*ch.Build())
	case ch.Build() != nil:
		return b.planPutBuild(ch.Build())
	case ch.Upload() != nil && ch.Deletes():
		return b.planDeleteUpload(*ch.Upload())
	case ch.Upload() != nil:
		return b.planPutUpload(ch.Upload())
	case ch.Cursor() != nil:
		return b.planCursor(*ch.Cursor())
	}
	return step{}, nil, errors.New("write to ZooKeeper: unknown change")
}

func (b *Backend) planPutBuild(bd *store.Build) (step, func() error, error) {
	if bd.ID == "" || bd.Image == "" || strings.Contains(bd.ID, "/") || strings.Contains(bd.Image, "/") {
		return step{}, nil, fmt.Errorf("write build %q of %q: not a valid id and image", bd.ID, bd.Image)
	}
	data, extra, err := encodeBuild(*bd)
	if err != nil {
		return step{}, nil, err
	}
	p := buildPath(bd.Image, bd.ID)
	xp := p + "/" + extraNode
	if bd.Version == 0 {
		if err := b.ensure(buildsPath(bd.Image)); err != nil {
			return step{}, nil, err
		}
		return step{
			ops: []any{
				&zk.CreateRequest{Path: p, Data: data, Acl: zk.WorldACL(zk.PermAll)},
				&zk.CreateRequest{Path: xp, Data: extra, Acl: zk.WorldACL(zk.PermAll)},
			},
			done: func([]zk.MultiResponse) {
				bd.Version = 1
				b.cache.put(written{p, data, zk.Stat{Ctime: b.now().UnixMilli()}}, written{xp, extra, zk.Stat{}})
			},
		}, nil, nil
	}
	return b.planUpdate(p, data, extra, &bd.Version), nil, nil
}

// planUpdate writes a record's znode against its version, and its extra node,
// which it creates for a record a Python builder made. version is the store's
// (the znode's plus one), updated once the write is done.
func (b *Backend) planUpdate(p string, data, extra []byte, version *int64) step {
	xp := p + "/" + extraNode
	ops := []any{&zk.SetDataRequest{Path: p, Data: data, Version: int32(*version - 1)}}
	if _, ok := b.cache.get(xp); ok {
		ops = append(ops, &zk.SetDataRequest{Path: xp, Data: extra, Version: -1})
	} else {
		ops = append(ops, &zk.CreateRequest{Path: xp, Data: extra, Acl: zk.WorldACL(zk.PermAll)})
	}
	return step{
		ops: ops,
		done: func(res []zk.MultiResponse) {
			// Both nodes at once: a reader that saw the new version with the
			// old extra node would pass the version check with old fields.
			put := []written{{xp, extra, zk.Stat{}}}
			if s := res[1].Stat; s != nil {
				put[0].stat = *s
			}
			if s := res[0].Stat; s != nil {
				*version = int64(s.Version) + 1
				put = append(put, written{p, data, *s})
			} else {
				*version++
			}
			b.cache.put(put...)
		},
	}
}

// planDelete removes a record's znode with what lies below it (our extra
// node, lock nodes, empty provider nodes), against its version.
func (b *Backend) planDelete(p string, below []string, version int64) step {
	ops := []any{&zk.CheckVersionRequest{Path: p, Version: int32(version - 1)}}
	for _, q := range below {
		ops = append(ops, &zk.DeleteRequest{Path: q, Version: -1})
	}
	ops = append(ops, &zk.DeleteRequest{Path: p, Version: int32(version - 1)})
	return step{ops: ops, done: func([]zk.MultiResponse) { b.cache.drop(p) }}
}

// planDeleteBuild removes a build's znode with what lies below it, against
// its version; uploads below it make the delete fail, as nodepool's
// deleteBuild refuses then too.
func (b *Backend) planDeleteBuild(bd store.Build) (step, func() error, error) {
	p := buildPath(bd.Image, bd.ID)
	below, err := b.subtree(p)
	if err != nil {
		return step{}, nil, err
	}
	for _, q := range below {
		if classify(q) == kindUpload {
			return step{}, nil, fmt.Errorf("delete build %s: %w: it still has uploads", bd.Name(), store.ErrConflict)
		}
	}
	return b.planDelete(p, below, bd.Version), nil, nil
}

func (b *Backend) planPutUpload(u *store.Upload) (step, func() error, error) {
	if u.BuildID == "" || u.Provider == "" || u.Image == "" {
		return step{}, nil, fmt.Errorf("write upload %s: build, provider and image are required", u)
	}
	data, extra, err := encodeUpload(*u)
	if err != nil {
		return step{}, nil, err
	}
	if u.Version == 0 {
		if u.ID != "" {
			return step{}, nil, fmt.Errorf("create upload %s: the store assigns upload ids", u)
		}
		dir := uploadsPath(u.Image, u.BuildID, u.Provider)
		// The build must be there: its providers path is made below it only.
		if ok, _, err := b.exists(buildPath(u.Image, u.BuildID)); err != nil {
			return step{}, nil, err
		} else if !ok {
			return step{}, nil, fmt.Errorf("create upload of build %s to %s: %w: the build is gone", u.BuildID, u.Provider, store.ErrConflict)
		}
		if err := b.ensure(dir); err != nil {
			return step{}, nil, err
		}
		var created string
		later := func() error {
			// The extra node of a sequence node can only follow it: its name is
			// known once the multi made it. A record without one reads as no
			// attempts and no error, which is what a new upload has.
			if created == "" {
				return nil
			}
			xp := created + "/" + extraNode
			if _, err := b.create(xp, extra, 0); err != nil && !errors.Is(err, zk.ErrNodeExists) {
				return fmt.Errorf("record the attempts of upload %s: %w", u, err)
			}
			b.cache.put(written{xp, extra, zk.Stat{}})
			return nil
		}
		return step{
			ops: []any{&zk.CreateRequest{Path: dir + "/", Data: data, Acl: zk.WorldACL(zk.PermAll), Flags: zk.FlagSequence}},
			done: func(res []zk.MultiResponse) {
				created = res[0].String
				u.ID, u.Version = path.Base(created), 1
				b.cache.put(written{created, data, zk.Stat{Ctime: b.now().UnixMilli()}})
			},
		}, later, nil
	}
	return b.planUpdate(uploadPath(u.Image, u.BuildID, u.Provider, u.ID), data, extra, &u.Version), nil, nil
}

func (b *Backend) planDeleteUpload(u store.Upload) (step, func() error, error) {
	p := uploadPath(u.Image, u.BuildID, u.Provider, u.ID)
	below, err := b.subtree(p)
	if err != nil {
		return step{}, nil, err
	}
	return b.planDelete(p, below, u.Version), nil, nil
}

func (b *Backend) planCursor(c store.Cursor) (step, func() error, error) {
	data, err := encodeCursor(c)
	if err != nil {
		return step{}, nil, err
	}
	p := cursorPath(c.Image)
	ok, _, err := b.exists(p)
	if err != nil {
		return step{}, nil, err
	}
	if ok {
		return step{ops: []any{&zk.SetDataRequest{Path: p, Data: data, Version: -1}}, done: func([]zk.MultiResponse) {}}, nil, nil
	}
	return step{ops: []any{&zk.CreateRequest{Path: p, Data: data, Acl: zk.WorldACL(zk.PermAll)}}, done: func([]zk.MultiResponse) {}}, nil, nil
}

// subtree lists the znodes below p, deepest first, so they can be deleted in
// that order.
func (b *Backend) subtree(p string) ([]string, error) {
	var out []string
	var walk func(q string) error
	walk = func(q string) error {
		kids, _, err := b.children(q)
		if errors.Is(err, zk.ErrNoNode) {
			return nil
		}
		if err != nil {
			return err
		}
		for _, k := range kids {
			cq := q + "/" + k
			if err := walk(cq); err != nil {
				return err
			}
			out = append(out, cq)
		}
		return nil
	}
	if err := walk(p); err != nil {
		return nil, fmt.Errorf("list %s: %w", p, err)
	}
	// Deepest first: a child comes before its parent.
	sort.SliceStable(out, func(i, j int) bool { return strings.Count(out[i], "/") > strings.Count(out[j], "/") })
	return out, nil
}
