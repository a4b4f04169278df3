package main

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/state"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// TestZuulCursorReset: zuul-cursor-reset refuses what is not a zuul-image of
// the config and waits for nobody: while another builder holds the image's
// build lock (in ZooKeeper, shared), it refuses; once it is free, it resets
// the cursor and says what it was.
func TestZuulCursorReset(t *testing.T) {
	z := testenv.NewZooKeeper(t, testenv.ZooKeeperOptions{})
	ctx := t.Context()
	dir := t.TempDir()
	cfgPath := writeFileT(t, filepath.Join(dir, "nodepool.yaml"), "images-dir: "+filepath.Join(dir, "images")+
		"\nbuild-log-dir: "+filepath.Join(dir, "logs")+`
diskimages:
  - name: dib-image
    dib-cmd: /bin/false
zuul-images:
  - name: debian
    api-url: http://zuul.invalid
    project: org/images
    job: build-debian
`+zkKeys(z, zkChroot))
	cfg, err := config.Load(config.Files{Nodepool: cfgPath})
	if err != nil {
		t.Fatal(err)
	}
	// Another builder's session on the same state.
	other, err := state.Open(ctx, cfg, state.Options{Access: store.Create})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	// Its poller found Zuul's newest build behind the cursor.
	was := store.Cursor{Image: "debian", ZuulID: 1 << 62, ZuulUUID: "0123456789abcdef0123456789abcdef", Outcome: "ready",
		Time: other.Now(), BehindID: 41}
	if err := other.MarkZuulBehind(ctx, was, was.BehindID); err != nil {
		t.Fatal(err)
	}

	for _, tt := range []struct {
		args []string
		says string
	}{
		{[]string{"zuul-cursor-reset"}, "needs the name of a zuul-image"},
		{[]string{"zuul-cursor-reset", "fedora"}, `"fedora" is neither a diskimage nor a zuul-image`},
		{[]string{"zuul-cursor-reset", "dib-image"}, "dib-image is a diskimage, not a zuul-image"},
	} {
		if r := runCmd(append([]string{"-c", cfgPath}, tt.args...)...); r.code != exitUsage || !strings.Contains(r.stderr, tt.says) {
			t.Errorf("%s: exit %d, want %d saying %q:\n%s", strings.Join(tt.args, " "), r.code, exitUsage, tt.says, r.stderr)
		}
	}

	held, err := other.TryLock(ctx, store.LockKey{Image: "debian"})
	if err != nil {
		t.Fatal(err)
	}
	r := runCmd("-c", cfgPath, "zuul-cursor-reset", "debian")
	if r.code != exitFailed || !strings.Contains(r.stderr, "build lock is held") {
		t.Errorf("zuul-cursor-reset under another builder's lock: exit %d, want %d saying the lock is held:\n%s%s",
			r.code, exitFailed, r.stdout, r.stderr)
	}
	if c, err := other.Cursor(ctx, "debian"); err != nil || c.ZuulID != was.ZuulID || c.BehindID != was.BehindID {
		t.Fatalf("the cursor changed under another builder's lock: %+v, %v", c, err)
	}
	held.Release()

	r = runCmd("-c", cfgPath, "zuul-cursor-reset", "debian")
	if r.code != exitOK {
		t.Fatalf("zuul-cursor-reset: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	for _, w := range []string{"poll cursor of debian reset", was.ZuulUUID, "id 4611686018427387904",
		"Zuul's newest build (id 41) was behind it", "newest successful build of job build-debian in org/images"} {
		if !strings.Contains(r.stdout, w) {
			t.Errorf("zuul-cursor-reset does not say %q:\n%s", w, r.stdout)
		}
	}
	c, err := other.Cursor(ctx, "debian")
	if err != nil || c.ZuulID != 0 || c.ZuulUUID != "" || c.BehindID != 0 || c.Outcome != "reset" {
		t.Fatalf("cursor after zuul-cursor-reset = %+v, %v; want it reset", c, err)
	}
	// The lock was let go: the other builder can take it.
	if h, err := other.TryLock(ctx, store.LockKey{Image: "debian"}); err != nil {
		t.Fatalf("the image's build lock after zuul-cursor-reset: %v", err)
	} else {
		h.Release()
	}

	// A cursor someone else wrote that the store refuses stops the polls;
	// image-status shows it, and zuul-cursor-reset replaces it.
	z.Kazoo(t, `
import json
zk.set("`+zkChroot+`/nodepool-builder/cursors/debian", json.dumps({"zuul_id": 3, "zuul_uuid": "x",
    "outcome": "ready", "time": 1700000000.0, "build_id": "../../elsewhere"}).encode())
`)
	if _, err := other.Cursor(ctx, "debian"); !errors.Is(err, store.ErrRefusedRecord) {
		t.Fatalf("a cursor with a path for its build id read as %v; want it refused", err)
	}
	r = runCmd("-c", cfgPath, "image-status")
	if r.code != exitOK || !strings.Contains(r.stdout, "poll cursor refused: zuul-cursor-reset debian") {
		t.Errorf("image-status with a refused cursor: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = runCmd("-c", cfgPath, "zuul-cursor-reset", "debian")
	if r.code != exitOK || !strings.Contains(r.stdout, "the one it replaced was refused") || !strings.Contains(r.stdout, "build_id") {
		t.Fatalf("zuul-cursor-reset of a refused cursor: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if c, err := other.Cursor(ctx, "debian"); err != nil || c.Outcome != "reset" {
		t.Fatalf("cursor after resetting a refused one = %+v, %v; want it reset", c, err)
	}
}
