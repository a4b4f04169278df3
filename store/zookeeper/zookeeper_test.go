package zookeeper_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/store/storetest"
	"github.com/nodepool-builder/nodepool-builder/store/zookeeper"
)

// chroot is a path of the test's own: the tests of one run share a server, and
// a rerun of the package must not find an earlier run's records.
func chroot(t *testing.T) string {
	return "/" + runPrefix + "/" + strings.ReplaceAll(t.Name(), "/", "-")
}

var runPrefix = func() string {
	var b [4]byte
	rand.Read(b[:])
	return "test-" + hex.EncodeToString(b[:])
}()

// openBackend connects to z under the chroot.
func openBackend(t *testing.T, z *testenv.ZooKeeper, chroot string, now func() time.Time) *zookeeper.Backend {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := zookeeper.Open(ctx, zookeeper.Options{Servers: []string{z.Addr}, Chroot: chroot, Now: now,
		Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestZooKeeperConformance(t *testing.T) {
	z := testenv.NewZooKeeper(t, testenv.ZooKeeperOptions{})
	storetest.Run(t, func(t *testing.T, now func() time.Time) *store.Store {
		b := openBackend(t, z, chroot(t), now)
		s, err := store.Open(context.Background(), store.Options{ImagesDir: t.TempDir(), Now: now, Backend: b})
		if err != nil {
			b.Close()
			t.Fatal(err)
		}
		return s
	}, storetest.Options{Shared: true})
}
