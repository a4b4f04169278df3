package builder

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/store/storetest"
	"github.com/nodepool-builder/nodepool-builder/store/zookeeper"
)

// TestDaemonPassReadsOnlyWhatChanged: with the state in a real ZooKeeper, a
// daemon's passes over an unchanged state read no znode (the records come
// from the cache its watches keep fresh), and a change another builder makes
// costs the reads of the nodes it touched, not of the tree.
func TestDaemonPassReadsOnlyWhatChanged(t *testing.T) {
	z := testenv.NewZooKeeper(t, testenv.ZooKeeperOptions{})
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	open := func(dir string) (*store.Store, storetest.Raw, *testenv.ZooKeeperCounter) {
		t.Helper()
		wire := testenv.NewZooKeeperCounter(t, z)
		zb, err := zookeeper.Open(ctx, zookeeper.Options{Servers: []string{wire.Addr}, Chroot: "/passes", Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		st, raw := storetest.Open(t, store.Options{ImagesDir: dir, Backend: zb})
		t.Cleanup(func() { st.Close() })
		return st, raw, wire
	}
	var ours *store.Store
	var oursRaw storetest.Raw
	var zb *testenv.ZooKeeperCounter
	r := newRig(t, twoImages, func(o *Options) {
		ours, oursRaw, zb = open(o.Config.ImagesDir)
		o.Store = ours
	})
	r.st, r.raw = ours, oursRaw
	r.build("img-a")
	r.build("img-b")
	r.run()
	testenv.WaitFor(t, 30*time.Second, "both uploads ready", func() bool {
		return len(r.uploads(store.UploadFilter{State: store.Ready})) == 2
	})
	// passes waits until both loops that go over the records made n more.
	passes := func(n int) {
		t.Helper()
		p := r.b.Passes()
		plan, life := p["plan uploads"].Count, p["lifecycle"].Count
		testenv.WaitFor(t, 30*time.Second, "the daemon's passes", func() bool {
			p := r.b.Passes()
			return p["plan uploads"].Count >= plan+n && p["lifecycle"].Count >= life+n
		})
	}
	passes(3) // what follows the uploads (their files dropped, say) is done
	before := zb.Reads()
	passes(5)
	if n := zb.Reads() - before; n != 0 {
		t.Fatalf("5 passes of each loop over an unchanged state read %d znodes, want none", n)
	}

	// Another builder writes one upload again: its node and extra node change.
	theirs, theirRaw, _ := open(t.TempDir())
	ups, err := theirs.Uploads(ctx, store.UploadFilter{Image: "img-a", State: store.Ready})
	if err != nil || len(ups) != 1 {
		t.Fatalf("their view of img-a's uploads: %+v, %v", ups, err)
	}
	before = zb.Reads()
	if err := theirRaw.Write(ctx, store.PutUpload(&ups[0])); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the change to reach the daemon's cache", func() bool {
		got := r.uploads(store.UploadFilter{Image: "img-a", State: store.Ready})
		return len(got) == 1 && got[0].Version == ups[0].Version
	})
	passes(3)
	// The upload's node on its watch's event, read with its extra node, and
	// the extra node on its own event: 3 reads, of a tree of more than 20
	// nodes.
	if n := zb.Reads() - before; n > 3 {
		t.Fatalf("a change of one upload by another builder cost the daemon %d znode reads, want at most 3", n)
	}
}
