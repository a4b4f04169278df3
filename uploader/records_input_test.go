package uploader_test

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/store/zookeeper"
	"github.com/nodepool-builder/nodepool-builder/uploader"
	"github.com/nodepool-builder/nodepool-builder/uploader/openstack"
)

// zkStore opens a store whose state is a real ZooKeeper, under a chroot of
// the test's own, logging to logs; it returns the chroot too.
func zkStore(t *testing.T, z *testenv.ZooKeeper, logs *testenv.Buffer) (*store.Store, string) {
	t.Helper()
	var b [4]byte
	rand.Read(b[:])
	root := "/input-" + hex.EncodeToString(b[:])
	backend, err := zookeeper.Open(t.Context(), zookeeper.Options{Servers: []string{z.Addr}, Chroot: root,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	images := filepath.Join(t.TempDir(), "images")
	if err := os.Mkdir(images, 0o750); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(t.Context(), store.Options{ImagesDir: images, Backend: backend})
	if err != nil {
		backend.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st, root
}

// writeRecords is a kazoo script that writes a build and its uploads as
// nodepool does, with the fields given: argv is the build's znode path, its
// builder_id, its formats, the uploads' provider and state, then their
// external ids.
const writeRecords = `
import json, sys, time
base, builder_id, formats, provider, state = sys.argv[1:6]
t = time.time() - 3600
zk.create(base, json.dumps({"state": "ready", "state_time": t, "builder": "elsewhere",
    "builder_id": builder_id, "formats": formats, "username": "zuul",
    "python_path": "auto", "shell_type": None}).encode(), makepath=True)
for ext in sys.argv[6:]:
    zk.create(base + "/providers/%s/images/" % provider, json.dumps({"state": state,
        "state_time": t, "external_id": ext, "external_name": "made-elsewhere",
        "format": "raw", "username": "zuul", "python_path": "auto", "shell_type": None}).encode(),
        sequence=True, makepath=True)
`

// waitSeen waits until the store lists n uploads, or the log names every path
// in refused: until ZooKeeper's records are read, whichever way they go.
func waitSeen(t *testing.T, st *store.Store, logs *testenv.Buffer, n int, refused ...string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		ups, _ := st.Uploads(t.Context(), store.UploadFilter{})
		all := len(refused) > 0
		for _, p := range refused {
			all = all && strings.Contains(logs.String(), p)
		}
		if all || n > 0 && len(ups) >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("ZooKeeper's records not read within 30 s; uploads %v, log:\n%s", ups, logs)
		}
		<-tick.C
	}
}

// TestRecordFormatOutsideImagesDir: a build record whose formats lead out of
// the images-dir, written with this builder's id as any writer of the znodes
// can, is refused on read, named by its znode path in the log once, and left
// in ZooKeeper; delete-after-upload removes nothing outside the images-dir. So
// is a build whose id holds a space, which would become a gearman function name.
func TestRecordFormatOutsideImagesDir(t *testing.T) {
	z := testenv.NewZooKeeper(t, testenv.ZooKeeperOptions{})
	var logs testenv.Buffer
	st, root := zkStore(t, z, &logs)
	victim := filepath.Join(filepath.Dir(st.Dir()), "victim")
	for _, p := range []string{victim, victim + ".sha256", victim + ".md5"} {
		if err := os.WriteFile(p, []byte("not the builder's"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// As the builder names them, within its chroot.
	build := "/nodepool/images/debian/builds/0123456789abcdef0123456789abcdef"
	spaced := "/nodepool/images/debian/builds/abc def"
	z.Kazoo(t, writeRecords, root+build, st.BuilderID(), "raw,x/../../victim", "cloud-a", "ready",
		"11111111-2222-4333-8444-555555555555")
	z.Kazoo(t, writeRecords, root+spaced, st.BuilderID(), "raw", "cloud-a", "ready")
	waitSeen(t, st, &logs, 1, build, spaced)

	cfg := &config.Config{
		ImagesDir:  st.Dir(),
		DiskImages: []config.DiskImage{{Name: "debian", Formats: []string{"raw"}, DeleteAfterUpload: true}},
		Providers: []config.Provider{{Name: "cloud-a", Cloud: "a", ImageFormat: "raw",
			DiskImages: []config.ProviderImage{{Name: "debian"}}}},
		Builder: config.Builder{UploadWorkers: 1, KeepBuilds: 2, KeepUploads: 2, UploadAttempts: 1},
	}
	u := uploader.New(uploader.Options{Store: st, Config: cfg, Clouds: map[string]uploader.Cloud{},
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	_ = u.DropUploaded(t.Context()) // a refusal may be an error; what counts is what it removed
	for _, p := range []string{victim, victim + ".sha256", victim + ".md5"} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s outside the images-dir: %v; want it left", p, err)
		}
	}
	builds, _ := st.Builds(t.Context(), store.BuildFilter{})
	if len(builds) != 0 {
		t.Errorf("builds listed: %v; want the refused records left out", builds)
	}
	for _, p := range []string{build, spaced} {
		if n := strings.Count(logs.String(), "builds/"+filepath.Base(p)); n != 1 {
			t.Errorf("log lines naming %s: %d; want 1. Log:\n%s", p, n, logs.String())
		}
	}
	out := z.Kazoo(t, `import sys
print(all(zk.exists(p) is not None for p in sys.argv[1:]))`, root+build, root+spaced)
	if out != "True\n" {
		t.Errorf("refused records in ZooKeeper: %q; want them left as they were", out)
	}
}

// TestDeleteOnlyOurImage: upload records marked deleting whose external_id
// names an image of Glance that no nodepool builder uploaded (its UUID, or
// something that is not a UUID but reaches it), or another build's, delete
// nothing there; the records stay and the log says why, once. The upload's own
// image goes, found by its upload id or, numbered anew, by its name.
func TestDeleteOnlyOurImage(t *testing.T) {
	g := testenv.NewGlance(t)
	z := testenv.NewZooKeeper(t, testenv.ZooKeeperOptions{})
	ctx := t.Context()
	cloud, err := openstack.Open(ctx, openstack.Options{Cloud: g.Cloud, CloudsFile: g.CloudsFile})
	if err != nil {
		t.Fatal(err)
	}
	const build = "0123456789abcdef0123456789abcdef"
	image := func(name string, props map[string]string) string {
		id, err := cloud.Create(ctx, uploader.ImageSpec{Name: name, DiskFormat: "raw", Properties: props})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	other := image("someone-elses", nil)
	// Nodepool's, as its builders upload: the build id and upload id. The
	// records below are the build's sequence nodes 0000000000 to 0000000004.
	anotherBuild := image("made-elsewhere", map[string]string{uploader.PropBuildID: "fedcba9876543210fedcba9876543210",
		uploader.PropUploadID: "0000000002"})
	renumbered := image("made-elsewhere", map[string]string{uploader.PropBuildID: build, uploader.PropUploadID: "0000000042"})
	exact := image("named-otherwise", map[string]string{uploader.PropBuildID: build, uploader.PropUploadID: "0000000004"})
	var logs testenv.Buffer
	st, root := zkStore(t, z, &logs)
	z.Kazoo(t, writeRecords, root+"/nodepool/images/debian/builds/"+build, "python-builder",
		"raw", "glance", "deleting", other, other+"?not-a-uuid", anotherBuild, renumbered, exact)
	waitSeen(t, st, &logs, 5)

	cfg := &config.Config{
		ImagesDir:  st.Dir(),
		DiskImages: []config.DiskImage{{Name: "debian", Formats: []string{"raw"}}},
		Providers: []config.Provider{{Name: "glance", Cloud: g.Cloud, ImageFormat: "raw",
			DiskImages: []config.ProviderImage{{Name: "debian"}}}},
		Builder: config.Builder{UploadWorkers: 1, KeepBuilds: 2, KeepUploads: 2, UploadAttempts: 1},
	}
	u := uploader.New(uploader.Options{Store: st, Config: cfg, Clouds: map[string]uploader.Cloud{"glance": cloud},
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	for range 2 {
		if err := u.Delete(ctx); err != nil {
			t.Fatalf("delete pass: %v", err)
		}
	}
	gone := func(id string) bool {
		img, err := cloud.Get(ctx, id)
		return errors.Is(err, uploader.ErrNotFound) || err == nil && (img.Status == "deleted" || img.Status == "pending_delete")
	}
	for name, id := range map[string]string{"the image not nodepool's": other, "another build's image": anotherBuild} {
		if gone(id) {
			t.Errorf("%s (%s) was deleted; want it left in Glance", name, id)
		}
	}
	// The upload's own: by its upload id, or by its name when the ids differ.
	for name, id := range map[string]string{"the upload's image": exact, "the upload's image, numbered anew": renumbered} {
		if !gone(id) {
			t.Errorf("%s (%s) was left; want it deleted", name, id)
		}
	}
	testenv.WaitFor(t, 30*time.Second, "the records of the deleted images to go", func() bool {
		ups, _ := st.Uploads(ctx, store.UploadFilter{})
		return len(ups) == 3
	}, logs.String)
	ups, _ := st.Uploads(ctx, store.UploadFilter{})
	for _, up := range ups {
		if up.ExternalID == exact || up.ExternalID == renumbered {
			t.Errorf("the record of a deleted image is left: %v", up)
		}
	}
	if n := strings.Count(logs.String(), "not deleting a cloud image that is not this upload's"); n != 3 {
		t.Errorf("refusals logged: %d; want one for each record not the image's. Log:\n%s", n, logs.String())
	}
}
