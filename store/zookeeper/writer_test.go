package zookeeper_test

import (
	"context"
	"log/slog"
	"os"
	"slices"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// TestBuildFilesCostNoWriteOfTheirOwn: the files of a build are recorded in
// the write that makes it ready, so that a build of any number of formats
// costs ZooKeeper the write that begins it and the one that commits it, as
// counted on the wire.
func TestBuildFilesCostNoWriteOfTheirOwn(t *testing.T) {
	z := testenv.NewZooKeeper(t, testenv.ZooKeeperOptions{})
	st, wire := openStore(t, z, chroot(t), t.TempDir(), slog.New(slog.DiscardHandler))
	ctx := context.Background()
	writes := func() int64 { return wire.Requests() - wire.Reads() }

	w, err := st.BeginBuild(ctx, store.Build{Image: "debian", Source: store.SourceZuul, Zuul: store.ZuulRef{UUID: "ab12", ID: 7}})
	if err != nil {
		t.Fatal(err)
	}
	begun := writes()
	formats := []string{"qcow2", "raw", "vhd"}
	for _, format := range formats {
		tmp, err := w.Temp(format)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(tmp, []byte(format), 0o640); err != nil {
			t.Fatal(err)
		}
		if err := w.Add(store.File{Format: format, SHA256: "s", MD5: "m", Size: int64(len(format))}); err != nil {
			t.Fatal(err)
		}
	}
	if n := writes() - begun; n != 0 {
		t.Fatalf("adding %d files sent %d write requests; want none", len(formats), n)
	}
	ready, err := w.Commit(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n := writes() - begun; n != 1 {
		t.Fatalf("the commit of a build of %d formats sent %d write requests; want 1", len(formats), n)
	}
	b, err := st.Build(ctx, ready.ID)
	if err != nil || b.State != store.Ready || !slices.Equal(b.Formats(), formats) {
		t.Fatalf("the build committed reads %+v, %v; want ready with %v", b, err, formats)
	}
}
