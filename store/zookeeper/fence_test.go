package zookeeper_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/store/storetest"
)

// TestWriteUnderLockNeedsTheLock: a write made under a lock (store.UnderLock)
// fails, writing nothing, once the lock's node is gone, though the client has
// not yet learnt it: a session that expired while its process was stopped
// takes the node with it, and the client then sends what it queued on a new
// session. Writes not made under the lock are not held back.
func TestWriteUnderLockNeedsTheLock(t *testing.T) {
	z := testenv.NewZooKeeper(t, testenv.ZooKeeperOptions{})
	root := chroot(t)
	b := openBackend(t, z, root, time.Now)
	ctx := context.Background()
	s, err := store.Open(ctx, store.Options{ImagesDir: t.TempDir(), Backend: b})
	if err != nil {
		b.Close()
		t.Fatal(err)
	}
	defer s.Close()
	raw := storetest.Raw{Backend: b, Now: s.Now}
	bd, err := s.CreateBuild(ctx, store.Build{Image: "debian", Source: store.SourceDIB})
	if err != nil {
		t.Fatal(err)
	}
	held, err := s.TryLock(ctx, store.LockKey{Image: "debian"})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	lctx, cancel := store.UnderLock(ctx, held)
	defer cancel()

	// Held: the write goes through.
	if err := raw.SetBuildState(context.WithoutCancel(lctx), &bd, store.Building, "pid known"); err != nil {
		t.Fatalf("write under a held lock: %v", err)
	}
	// The lock's node goes, as with its session.
	z.Kazoo(t, `
lock = "`+root+`/nodepool/images/debian/builds/lock"
for c in zk.get_children(lock):
    zk.delete(lock + "/" + c)
`)
	ready := bd
	err = raw.SetBuildState(context.WithoutCancel(lctx), &ready, store.Ready, "")
	if !errors.Is(err, store.ErrLockLost) {
		t.Fatalf("write under a lock whose node is gone = %v, want store.ErrLockLost", err)
	}
	got, err := s.Build(ctx, bd.ID)
	if err != nil || got.State != store.Building || got.Version != bd.Version {
		t.Fatalf("build after the refused write = %+v, %v; want it unchanged", got, err)
	}
	// Without the lock in the context, the same write is made.
	if err := raw.SetBuildState(ctx, &ready, store.Ready, ""); err != nil {
		t.Fatalf("write outside the lock: %v", err)
	}
	// A lock released is no longer checked: what is written after it is not
	// written under it.
	again, err := s.TryLock(ctx, store.LockKey{Image: "debian"})
	if err != nil {
		t.Fatal(err)
	}
	actx, acancel := store.UnderLock(ctx, again)
	defer acancel()
	again.Release()
	if err := raw.SetBuildState(actx, &ready, store.Deleting, ""); err != nil {
		t.Fatalf("write after the lock's release: %v", err)
	}
}

// TestBuildRequestReadAfresh: BuildRequest reads the request-build node from
// ZooKeeper itself, so a request another client cleared a moment ago is gone
// for it at once, whatever the cache has seen.
func TestBuildRequestReadAfresh(t *testing.T) {
	z := testenv.NewZooKeeper(t, testenv.ZooKeeperOptions{})
	root := chroot(t)
	b := openBackend(t, z, root, time.Now)
	defer b.Close()
	ctx := context.Background()
	if err := b.RequestBuild(ctx, "debian"); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := b.BuildRequest(ctx, "debian"); err != nil || !ok {
		t.Fatalf("request after RequestBuild: %v, %v; want it", ok, err)
	}
	z.Kazoo(t, `zk.delete("`+root+`/nodepool/images/debian/request-build")`)
	if _, ok, err := b.BuildRequest(ctx, "debian"); err != nil || ok {
		t.Fatalf("request another client deleted: %v, %v; want none", ok, err)
	}
}
