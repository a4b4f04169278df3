package zookeeper

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/z-division/go-zookeeper/zk"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// TestCacheRecordIsWhole: a cached record never has a version newer than the
// extra node read with it. A writer that read such a record would pass the
// version check with fields from before the change it raced, and undo them.
func TestCacheRecordIsWhole(t *testing.T) {
	z := testenv.NewZooKeeper(t, testenv.ZooKeeperOptions{})
	var rnd [4]byte
	rand.Read(rnd[:])
	root := "/test-cache-" + hex.EncodeToString(rnd[:])
	open := func() *Backend {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		b, err := Open(ctx, Options{Servers: []string{z.Addr}, Chroot: root,
			Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		return b
	}
	ctx := context.Background()
	ours, theirs := open(), open()

	bd := store.Build{ID: "0000000001", Image: "debian", State: store.Ready, Source: store.SourceZuul, Created: time.Now()}
	if err := ours.Write(ctx, store.PutBuild(&bd)); err != nil {
		t.Fatal(err)
	}
	u := store.Upload{BuildID: bd.ID, Image: bd.Image, Provider: "cloud-a", State: store.Failed, Attempts: 1}
	if err := ours.Write(ctx, store.PutUpload(&u)); err != nil {
		t.Fatal(err)
	}
	up := uploadPath(u.Image, u.BuildID, u.Provider, u.ID)
	last := u.Version // the latest write of either backend
	// theirsCountAnAttempt has the other builder count one more attempt of the
	// upload, then a cache the test steps read the upload's node again.
	theirsCountAnAttempt := func(t *testing.T, c *cache) store.Upload {
		t.Helper()
		cur := readUpload(t, theirs, u.ID, last)
		cur.Attempts++
		if err := theirs.Write(ctx, store.PutUpload(&cur)); err != nil {
			t.Fatal(err)
		}
		last = cur.Version
		if _, err := c.refresh(up); err != nil {
			t.Fatal(err)
		}
		return cur
	}

	t.Run("WatchOfTheRecordAlone", func(t *testing.T) {
		// A cache whose steps the test takes one at a time: read everything,
		// then another builder changes the record, then ZooKeeper's event for
		// the record node is handled before the one for its extra node.
		c := newCache(ours)
		for _, p := range []string{bd.Image, "debian/builds"} {
			if _, err := c.refresh(imageRoot + "/" + p); err != nil {
				t.Fatal(err)
			}
		}
		for _, p := range []string{buildPath(bd.Image, bd.ID), up, up + "/" + extraNode} {
			if _, err := c.refresh(p); err != nil {
				t.Fatal(err)
			}
		}
		cur := theirsCountAnAttempt(t, c)
		got := viewUpload(t, c.records(), u.ID)
		if got.Version != cur.Version || got.Attempts != cur.Attempts {
			t.Fatalf("after the record's event: version %d, attempts %d; want %d, %d (the extra node read with it)",
				got.Version, got.Attempts, cur.Version, cur.Attempts)
		}
	})

	t.Run("LateReadDecodesNothingOlder", func(t *testing.T) {
		// A record is decoded by the read that brought it, outside the
		// cache's lock: a read that comes back after the cache learnt of a
		// later state must not put its older record in the view.
		c := newCache(ours)
		for _, p := range []string{imageRoot + "/" + bd.Image, imageRoot + "/debian/builds", buildPath(bd.Image, bd.ID), up} {
			if _, err := c.refresh(p); err != nil {
				t.Fatal(err)
			}
		}
		n, _ := c.get(up)
		x, _ := c.get(up + "/" + extraNode)
		early, earlyX := *n, *x
		before := viewUpload(t, c.records(), u.ID)
		cur := theirsCountAnAttempt(t, c)
		// The early read's answer, as refresh would keep it.
		c.mu.Lock()
		c.keep(up, early.data, &early.stat, []string{extraNode}, earlyX.data, &earlyX.stat)
		c.decoded(up, &early.stat, &earlyX.stat, nil, &record[store.Upload]{rec: before, ok: true})
		c.mu.Unlock()
		got := viewUpload(t, c.records(), u.ID)
		if got.Version != cur.Version || got.Attempts != cur.Attempts {
			t.Fatalf("after a late read: version %d, attempts %d; want %d, %d (the later state the cache holds)",
				got.Version, got.Attempts, cur.Version, cur.Attempts)
		}
	})

	t.Run("LateWriteDoesNotGoBack", func(t *testing.T) {
		// Two writes of this process; the first records itself in the cache
		// after the second did.
		first := readUpload(t, ours, u.ID, last)
		first.Attempts++
		if err := ours.Write(ctx, store.PutUpload(&first)); err != nil {
			t.Fatal(err)
		}
		n, _ := ours.cache.get(up)
		x, _ := ours.cache.get(up + "/" + extraNode)
		early, earlyX := *n, *x
		second := first
		second.Attempts++
		if err := ours.Write(ctx, store.PutUpload(&second)); err != nil {
			t.Fatal(err)
		}
		ours.cache.put(written{up, early.data, early.stat}, written{up + "/" + extraNode, earlyX.data, earlyX.stat})
		got := readUpload(t, ours, u.ID, 0)
		if got.Version != second.Version || got.Attempts != second.Attempts {
			t.Fatalf("after two writes: version %d, attempts %d; want %d, %d", got.Version, got.Attempts, second.Version, second.Attempts)
		}
	})
}

// readUpload reads an upload from b's cache once it has at least the version
// given: another backend learns of a write by a watch, a moment later.
func readUpload(t *testing.T, b *Backend, id string, version int64) store.Upload {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ups, err := b.Uploads(context.Background(), store.UploadFilter{})
		if err != nil {
			t.Fatal(err)
		}
		for _, u := range ups {
			if u.ID == id && u.Version >= version {
				return u
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("upload %s at version %d not cached: %+v", id, version, ups)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func viewUpload(t *testing.T, v *view, id string) store.Upload {
	t.Helper()
	for _, u := range v.uploads {
		if u.ID == id {
			return u
		}
	}
	t.Fatalf("upload %s not in the view", id)
	return store.Upload{}
}

// TestCacheFollowsExtraNodeMadeLater: the cache reads an upload without
// listing its children, so an upload read before its extra node exists (as
// a Python builder made it) must still learn of the extra node when it comes.
func TestCacheFollowsExtraNodeMadeLater(t *testing.T) {
	z := testenv.NewZooKeeper(t, testenv.ZooKeeperOptions{})
	var rnd [4]byte
	rand.Read(rnd[:])
	root := "/test-cache-" + hex.EncodeToString(rnd[:])
	open := func() *Backend {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		b, err := Open(ctx, Options{Servers: []string{z.Addr}, Chroot: root,
			Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		return b
	}
	ctx := context.Background()
	ours := open()
	bd := store.Build{ID: "0000000001", Image: "debian", State: store.Ready, Source: store.SourceZuul, Created: time.Now()}
	if err := ours.Write(ctx, store.PutBuild(&bd)); err != nil {
		t.Fatal(err)
	}
	u := store.Upload{BuildID: bd.ID, Image: bd.Image, Provider: "cloud-a", State: store.Failed, Attempts: 2}
	if err := ours.Write(ctx, store.PutUpload(&u)); err != nil {
		t.Fatal(err)
	}
	xp := uploadPath(u.Image, u.BuildID, u.Provider, u.ID) + "/" + extraNode
	extra, _, err := ours.get(xp)
	if err != nil {
		t.Fatal(err)
	}
	if err := ours.delete(xp, -1); err != nil {
		t.Fatal(err)
	}
	theirs := open()
	if got := readUpload(t, theirs, u.ID, u.Version); got.Attempts != 0 {
		t.Fatalf("upload without its extra node read with %d attempts, want 0", got.Attempts)
	}
	// The extra node alone comes back: the upload's node does not change.
	if _, err := ours.create(xp, extra, 0); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := readUpload(t, theirs, u.ID, u.Version)
		if got.Attempts == u.Attempts {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("30s after its extra node was made, the upload reads %d attempts, want %d", got.Attempts, u.Attempts)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestCacheListingOlderThanAWrite: a listing of a node's children made before
// this process created a child, and kept after the write recorded it, does not
// drop the new child: the write that follows must see its extra node, or it
// tries to create it again and fails as if the record changed meanwhile.
func TestCacheListingOlderThanAWrite(t *testing.T) {
	z := testenv.NewZooKeeper(t, testenv.ZooKeeperOptions{})
	var rnd [4]byte
	rand.Read(rnd[:])
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := Open(ctx, Options{Servers: []string{z.Addr}, Chroot: "/test-cache-" + hex.EncodeToString(rnd[:]),
		Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	first := store.Build{ID: "0000000001", Image: "debian", State: store.Ready, Source: store.SourceZuul, Created: time.Now()}
	if err := b.Write(ctx, store.PutBuild(&first)); err != nil {
		t.Fatal(err)
	}
	// A cache the test steps: the image's builds listed while only the first
	// build is there...
	c := newCache(b)
	builds := imageRoot + "/debian/builds"
	for _, p := range []string{imageRoot + "/debian", builds} {
		if _, err := c.refresh(p); err != nil {
			t.Fatal(err)
		}
	}
	n, _ := c.get(builds)
	listed := *n
	// ...then this process makes a second build, and its write goes into the
	// cache...
	p := buildPath("debian", "0000000002")
	c.put(written{p, []byte("{}"), zk.Stat{}}, written{p + "/" + extraNode, []byte("{}"), zk.Stat{}})
	// ...before the answer to that listing is kept.
	c.mu.Lock()
	c.keep(builds, nil, &listed.stat, slices.Clone(listed.children[:1]), nil, nil)
	c.mu.Unlock()
	for _, q := range []string{p, p + "/" + extraNode} {
		if _, ok := c.get(q); !ok {
			t.Errorf("%s, written by this process, was dropped by a listing older than the write", q)
		}
	}
	// Its own read settles it: a node gone when it is read goes.
	if _, err := c.refresh(p); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.get(p); ok {
		t.Errorf("%s, never made in ZooKeeper, stayed in the cache after its own read", p)
	}
}

// TestNodeReads: refresh reads the data of a node only where the cache keeps
// something of it, and lists a node only where it follows children.
func TestNodeReads(t *testing.T) {
	for _, tc := range []struct {
		k         kind
		get, list bool
	}{
		{kindRoot, false, true},
		{kindImage, false, true},
		{kindFlag, true, false},
		{kindBuilds, false, true},
		{kindBuild, true, true},
		{kindBuildExtra, true, false},
		{kindProviders, false, true},
		{kindUploads, false, true},
		{kindUpload, true, false},
		{kindUploadExtra, true, false},
	} {
		get, list := nodeReads(tc.k)
		if get != tc.get || list != tc.list {
			t.Errorf("nodeReads(%d) = get %v, list %v; want get %v, list %v", tc.k, get, list, tc.get, tc.list)
		}
	}
}
