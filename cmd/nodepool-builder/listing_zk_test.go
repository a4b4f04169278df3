package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/listing"
	"github.com/nodepool-builder/nodepool-builder/state"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/store/storetest"
)

// TestZooKeeperListingsNeedNoImagesDir: with the state in ZooKeeper, the
// listings read only ZooKeeper, so they work on a host without the images-dir
// (an operator's workstation, the launcher's host) and create nothing there.
// With SQLite the images-dir holds the state, and a missing one is refused.
func TestZooKeeperListingsNeedNoImagesDir(t *testing.T) {
	z := testenv.NewZooKeeper(t, testenv.ZooKeeperOptions{})
	ctx := t.Context()
	dir := t.TempDir()
	configText := func(images string, zk bool) string {
		s := "images-dir: " + images + "\nbuild-log-dir: " + filepath.Join(dir, "logs") +
			"\ndiskimages:\n  - name: debian\n    dib-cmd: /bin/false\n"
		if zk {
			s += zkKeys(z, zkChroot)
		}
		return s
	}

	// The builder's host writes a build and an upload.
	hostCfg, err := config.Load(config.Files{Nodepool: writeFileT(t, filepath.Join(dir, "host.yaml"), configText(filepath.Join(dir, "images"), true))})
	if err != nil {
		t.Fatal(err)
	}
	zb, err := state.OpenZooKeeper(ctx, hostCfg.ZooKeeper, state.Options{Access: store.Create})
	if err != nil {
		t.Fatal(err)
	}
	st, raw := storetest.Open(t, store.Options{ImagesDir: hostCfg.ImagesDir, Access: store.Create, Backend: zb})
	b, err := st.CreateBuild(ctx, store.Build{Image: "debian", Source: store.SourceDIB})
	if err == nil {
		err = raw.SetBuildState(ctx, &b, store.Ready, "")
	}
	if err != nil {
		t.Fatal(err)
	}
	u, err := st.CreateUpload(ctx, &b, "cloud-a", "qcow2")
	if err != nil {
		t.Fatal(err)
	}
	st.Close()

	// A workstation has the same config but no images-dir.
	missing := filepath.Join(dir, "not-here")
	ws := writeFileT(t, filepath.Join(dir, "workstation.yaml"), configText(missing, true))
	r := runCmd("-c", ws, "dib-image-list", "--json")
	var builds []listing.Build
	if err := json.Unmarshal([]byte(r.stdout), &builds); r.code != exitOK || err != nil || len(builds) != 1 || builds[0].BuildID != b.ID {
		t.Errorf("dib-image-list --json exited %d (%v), builds %+v; want build %s\n%s", r.code, err, builds, b.ID, r.stderr)
	}
	r = runCmd("-c", ws, "image-list", "--json")
	var uploads []listing.Upload
	if err := json.Unmarshal([]byte(r.stdout), &uploads); r.code != exitOK || err != nil || len(uploads) != 1 ||
		uploads[0].BuildID != b.ID || uploads[0].UploadID != u.ID || uploads[0].Provider != "cloud-a" {
		t.Errorf("image-list --json exited %d (%v), uploads %+v; want upload %s of build %s\n%s", r.code, err, uploads, u.ID, b.ID, r.stderr)
	}
	for _, args := range [][]string{{"dib-image-list"}, {"image-list"}, {"image-status"}, {"image-status", "--json"}} {
		r := runCmd(append([]string{"-c", ws}, args...)...)
		want := b.ID
		if args[0] == "image-status" {
			want = "debian"
		}
		if r.code != exitOK || !strings.Contains(r.stdout, want) {
			t.Errorf("%s exited %d, want %d and %s in:\n%s%s", strings.Join(args, " "), r.code, exitOK, want, r.stdout, r.stderr)
		}
	}
	if _, err := os.Stat(missing); !os.IsNotExist(err) {
		t.Errorf("a listing made the images-dir %s: %v", missing, err)
	}

	// With SQLite, the images-dir is where the state is.
	sq := writeFileT(t, filepath.Join(dir, "sqlite.yaml"), configText(missing, false))
	for _, cmd := range []string{"dib-image-list", "image-list", "image-status"} {
		if r := runCmd("-c", sq, cmd); r.code != exitUsage || !strings.Contains(r.stderr, missing) {
			t.Errorf("%s with SQLite and no images-dir exited %d, want %d naming %s:\n%s", cmd, r.code, exitUsage, missing, r.stderr)
		}
	}
}
