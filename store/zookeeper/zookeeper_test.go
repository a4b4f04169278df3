package zookeeper_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"strings"
	"sync"
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
	storetest.Run(t, func(t *testing.T, now func() time.Time) (*store.Store, storetest.Raw) {
		b := openBackend(t, z, chroot(t), now)
		return storetest.Open(t, store.Options{ImagesDir: t.TempDir(), Now: now, Backend: b})
	}, storetest.Options{Shared: true})
}

// TestNodepoolRequestsAndPauses: nodepool's CLI makes request-build and pause
// nodes empty (kazoo's ensure_path), and they count from their ctime; ours are
// nodes it finds where it looks.
func TestNodepoolRequestsAndPauses(t *testing.T) {
	z := testenv.NewZooKeeper(t, testenv.ZooKeeperOptions{})
	root := chroot(t)
	b := openBackend(t, z, root, time.Now)
	defer b.Close()
	ctx := context.Background()
	before := time.Now().Add(-time.Minute)
	z.Kazoo(t, `
zk.ensure_path("`+root+`/nodepool/images/fedora/request-build")
zk.ensure_path("`+root+`/nodepool/images/fedora/pause")
`)
	deadline := time.Now().Add(30 * time.Second)
	for {
		reqs, _ := b.BuildRequests(ctx)
		paused, _ := b.Paused(ctx)
		if reqs["fedora"].After(before) && paused["fedora"].After(before) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("nodepool's request and pause not seen: %v, %v", reqs, paused)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := b.ClearBuildRequest(ctx, "fedora", time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := b.SetPaused(ctx, "fedora", false); err != nil {
		t.Fatal(err)
	}
	if err := b.RequestBuild(ctx, "debian"); err != nil {
		t.Fatal(err)
	}
	if err := b.SetPaused(ctx, "debian", true); err != nil {
		t.Fatal(err)
	}
	out := z.Kazoo(t, `
for image in ("fedora", "debian"):
    for node in ("request-build", "pause"):
        print(image, node, zk.exists("`+root+`/nodepool/images/%s/%s" % (image, node)) is not None)
`)
	want := "fedora request-build False\nfedora pause False\ndebian request-build True\ndebian pause True\n"
	if out != want {
		t.Fatalf("nodes nodepool sees:\n%s\nwant:\n%s", out, want)
	}
}

// TestSessionExpiry cuts a backend off ZooKeeper (through a proxy) until the
// server expires its session, while another backend changes the records and
// takes the lock it held: its lock is reported lost, and once back it reads
// the changes, registers again, and its cache follows further changes.
func TestSessionExpiry(t *testing.T) {
	z := testenv.NewZooKeeper(t, testenv.ZooKeeperOptions{})
	p := testenv.NewProxy(t, z.Addr)
	root := chroot(t)
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	cut, err := zookeeper.Open(ctx, zookeeper.Options{Servers: []string{p.Addr}, Chroot: root, Timeout: 2 * time.Second,
		Hostname: "cut-off", Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer cut.Close()
	other := openBackend(t, z, root, time.Now)
	defer other.Close()
	a, err := store.Open(ctx, store.Options{ImagesDir: t.TempDir(), Backend: cut})
	if err != nil {
		t.Fatal(err)
	}
	o, err := store.Open(ctx, store.Options{ImagesDir: t.TempDir(), Backend: other})
	if err != nil {
		t.Fatal(err)
	}
	old, err := a.CreateBuild(ctx, store.Build{Image: "debian", Source: store.SourceZuul})
	if err != nil {
		t.Fatal(err)
	}
	held, err := a.TryLock(ctx, store.LockKey{Image: "debian"})
	if err != nil {
		t.Fatal(err)
	}
	if !cut.Connected() {
		t.Error("Connected is false with a session")
	}

	p.Down()
	// The lock is free once the server expired the session.
	deadline := time.Now().Add(30 * time.Second)
	for {
		h, err := o.TryLock(ctx, store.LockKey{Image: "debian"})
		if err == nil {
			h.Release()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cut-off backend's lock was never freed: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	select {
	case <-held.Lost():
	case <-time.After(30 * time.Second):
		t.Fatal("the lock of an expired session was not reported lost")
	}
	if cut.Connected() {
		t.Error("Connected is true while cut off")
	}
	cur, err := o.Build(ctx, old.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Write(ctx, store.DeleteBuild(cur)); err != nil {
		t.Fatal(err)
	}
	made, err := o.CreateBuild(ctx, store.Build{Image: "debian", Source: store.SourceDIB})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Up(); err != nil {
		t.Fatal(err)
	}

	seen := func(what string, ok func([]store.Build) bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			bs, err := a.Builds(ctx, store.BuildFilter{Image: "debian"})
			if err == nil && ok(bs) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: builds seen after the new session: %+v, %v", what, bs, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	seen("changes made while cut off", func(bs []store.Build) bool { return len(bs) == 1 && bs[0].ID == made.ID })
	if !cut.Connected() {
		t.Error("Connected is false after the new session")
	}
	later, err := o.CreateBuild(ctx, store.Build{Image: "debian", Source: store.SourceDIB})
	if err != nil {
		t.Fatal(err)
	}
	seen("a change after the new session", func(bs []store.Build) bool { return len(bs) == 2 && bs[0].ID == later.ID })
	out := z.Kazoo(t, `print(len([c for c in zk.get_children("`+root+`/nodepool/components/builder") if c.startswith("cut-off")]))`)
	if out != "1\n" {
		t.Fatalf("registrations of the cut-off builder after the new session: %q, want 1", out)
	}
}

// afterClose is a log writer that counts what is written to it once the
// backend logging to it has been closed.
type afterClose struct {
	mu     sync.Mutex
	closed bool
	late   []string
}

func (w *afterClose) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		w.late = append(w.late, string(p))
	}
	return len(p), nil
}

// TestNoLogAfterClose: the ZooKeeper client's goroutines end a moment after
// Close returns, and say so in the log; a command that reads what it logged
// once its store is closed (the tests' in-process runs do) must find nothing
// written after that.
func TestNoLogAfterClose(t *testing.T) {
	z := testenv.NewZooKeeper(t, testenv.ZooKeeperOptions{})
	root := chroot(t)
	var late []string
	for range 3 {
		w := &afterClose{}
		b, err := zookeeper.Open(context.Background(), zookeeper.Options{Servers: []string{z.Addr}, Chroot: root,
			Logger: slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))})
		if err != nil {
			t.Fatal(err)
		}
		b.Close()
		w.mu.Lock()
		w.closed = true
		w.mu.Unlock()
		// The client's loops end within its one-second close wait; give
		// them that long to write, were they still able to.
		deadline := time.Now().Add(2 * time.Second)
		for time.Now().Before(deadline) {
			w.mu.Lock()
			n := len(w.late)
			w.mu.Unlock()
			if n > 0 {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		w.mu.Lock()
		late = append(late, w.late...)
		w.mu.Unlock()
	}
	if len(late) > 0 {
		t.Fatalf("logged after Close returned:\n%s", strings.Join(late, ""))
	}
}

// TestSnapshotSetsNoWatches: a backend opened as a snapshot (for a listing)
// reads the records and leaves no watch on the server, while one that follows
// changes watches them. The server registers a watch before it answers the
// read that sets it, so once Open has returned, `wchp` shows every one.
func TestSnapshotSetsNoWatches(t *testing.T) {
	ctx := context.Background()
	z := testenv.NewZooKeeper(t, testenv.ZooKeeperOptions{})
	root := chroot(t)
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	st, _ := openStore(t, z, root, t.TempDir(), log)
	if _, err := readyBuild(ctx, st, "debian", 1); err != nil {
		t.Fatal(err)
	}
	// watching is the sessions wchc lists with a watch under root: a line
	// for each session, then one for each path it watches.
	watching := func() map[string]bool {
		t.Helper()
		out, err := z.FourLetterWord(ctx, "wchc")
		if err != nil {
			t.Fatal(err)
		}
		sessions, session := map[string]bool{}, ""
		for line := range strings.Lines(out) {
			if p, ok := strings.CutPrefix(line, "\t"); ok {
				if strings.HasPrefix(p, root+"/") {
					sessions[session] = true
				}
				continue
			}
			session = strings.TrimSpace(line)
		}
		return sessions
	}
	// The writer's own writes fire the watches of the nodes above them,
	// which it sets again as it reads those nodes again: wait for that.
	before := watching()
	for deadline := time.Now().Add(10 * time.Second); len(before) == 0; before = watching() {
		if time.Now().After(deadline) {
			t.Fatal("wchc shows no watch of a backend that follows changes; the check below would prove nothing")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, snapshot := range []bool{true, false} {
		b, err := zookeeper.Open(ctx, zookeeper.Options{Servers: []string{z.Addr}, Chroot: root, Snapshot: snapshot, Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		s, err := store.Open(ctx, store.Options{ImagesDir: t.TempDir(), Access: store.ReadOnly, Backend: b})
		if err != nil {
			b.Close()
			t.Fatal(err)
		}
		bs, err := s.Builds(ctx, store.BuildFilter{Image: "debian"})
		if err != nil || len(bs) != 1 {
			t.Errorf("snapshot %v: builds of debian %+v, %v; want the one", snapshot, bs, err)
		}
		added := 0
		for session := range watching() {
			if !before[session] {
				added++
			}
		}
		s.Close()
		switch {
		case snapshot && added != 0:
			t.Error("a snapshot left watches on the server")
		case !snapshot && added != 1:
			t.Errorf("%d new sessions watch records after a backend that follows changes opened; want 1", added)
		}
	}
}

// TestCursorWrittenElsewhereIsChecked: a poll cursor is read from the znode
// each time, and anyone who may write znodes may write one. A cursor another
// client wrote that names a build id with a path in it, or an outcome the
// poller does not know, is refused with the zuul-image named and what to run;
// a good one another client wrote reads as written.
func TestCursorWrittenElsewhereIsChecked(t *testing.T) {
	z := testenv.NewZooKeeper(t, testenv.ZooKeeperOptions{})
	root := chroot(t)
	b := openBackend(t, z, root, time.Now)
	defer b.Close()
	z.Kazoo(t, `
import json
for image, cur in (
        ("good", {"zuul_id": 7, "zuul_uuid": "0123456789abcdef0123456789abcdef", "outcome": "ready",
                  "time": 1700000000.0, "build_id": "0123456789abcdef0123456789abcdef"}),
        ("path", {"zuul_id": 7, "zuul_uuid": "../../../etc", "outcome": "ready", "time": 1700000000.0,
                  "build_id": "../x"}),
        ("outcome", {"zuul_id": 7, "zuul_uuid": "0123456789abcdef0123456789abcdef", "outcome": "pwned",
                     "time": 1700000000.0})):
    zk.create("`+root+`/nodepool-builder/cursors/" + image, json.dumps(cur).encode(), makepath=True)
`)
	ctx := t.Context()
	good, err := b.Cursor(ctx, "good")
	if err != nil || good.ZuulID != 7 || good.Outcome != "ready" || good.Build != "0123456789abcdef0123456789abcdef" {
		t.Fatalf("good cursor: %+v, %v", good, err)
	}
	for image, field := range map[string]string{"path": "build_id", "outcome": "outcome"} {
		_, err := b.Cursor(ctx, image)
		if !errors.Is(err, store.ErrRefusedRecord) || !strings.Contains(err.Error(), field) ||
			!strings.Contains(err.Error(), "zuul-cursor-reset "+image) {
			t.Errorf("cursor of %s: %v; want it refused for its %s, naming zuul-cursor-reset", image, err, field)
		}
	}
}
