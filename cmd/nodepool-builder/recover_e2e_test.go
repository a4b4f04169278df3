package main

import (
	"bytes"
	"context"
	"crypto/md5"
	"encoding/hex"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/store/storetest"
	"github.com/nodepool-builder/nodepool-builder/uploader"
	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

// recoverConfig uploads the debian zuul-image as raw to one provider, whose
// post-upload-hook is hookScript.
const recoverConfig = `images-dir: {{IMAGES}}
zuul-images:
{{DEBIAN}}providers:
  - name: cloud-x
    cloud: {{CLOUD}}
    image-format: raw
    post-upload-hook: {{DIR}}/hook
    diskimages:
      - name: debian
`

// notOursSaid is what the builder logs of a cloud image an uploading record
// names that is not that upload's.
const notOursSaid = "not adopting or deleting a cloud image that is not this upload's"

// othersImages are what Glance holds beside the builder's images: an
// operator's golden image, active, and another tool's image, queued (made,
// its data not sent yet).
type othersImages struct {
	golden, queued string
	goldenData     []byte // the golden image's data
	goldenMD5      string
}

func (e *env) othersImages() othersImages {
	e.t.Helper()
	ctx := context.Background()
	var o othersImages
	o.goldenData = make([]byte, 1<<20)
	rand.New(rand.NewSource(38)).Read(o.goldenData)
	sum := md5.Sum(o.goldenData)
	o.goldenMD5 = hex.EncodeToString(sum[:])
	var err error
	o.golden, err = e.cloud.Create(ctx, uploader.ImageSpec{Name: "golden-debian", DiskFormat: "raw",
		Properties: map[string]string{"os_distro": "debian"}})
	if err != nil {
		e.t.Fatal(err)
	}
	if err := e.cloud.Upload(ctx, o.golden, bytes.NewReader(o.goldenData), int64(len(o.goldenData))); err != nil {
		e.t.Fatal(err)
	}
	o.queued, err = e.cloud.Create(ctx, uploader.ImageSpec{Name: "another-tools-image", DiskFormat: "raw",
		Properties: map[string]string{"made_by": "another-tool"}})
	if err != nil {
		e.t.Fatal(err)
	}
	return o
}

// checkLeft fails the test unless both images are in Glance as they were, no
// post-upload-hook ran on either, and no upload record names either.
func (e *env) checkLeft(o othersImages) {
	e.t.Helper()
	ctx := context.Background()
	for id, status := range map[string]string{o.golden: "active", o.queued: "queued"} {
		img, err := e.cloud.Get(ctx, id)
		if err != nil || img.Status != status {
			e.t.Errorf("image %s: %+v, %v; want it left %s", id, img, err, status)
		}
	}
	for _, call := range e.hookCalls() {
		if args := strings.Join(call, " "); strings.Contains(args, o.golden) || strings.Contains(args, o.queued) {
			e.t.Errorf("the post-upload-hook ran on an image that is not the builder's: %q", call)
		}
	}
	for _, u := range e.uploadsJSON() {
		if u.ExternalID == o.golden || u.ExternalID == o.queued {
			e.t.Errorf("an upload record still names an image that is not its own: %+v", u)
		}
	}
}

// TestOnceRecoveryLeavesImagesNotOurs: uploading records whose external_id
// names an operator's active image and another tool's queued image, forged in
// SQLite and in ZooKeeper (by nodepool's own class), make --once neither adopt
// nor delete either: both stay, the post-upload-hook runs on neither, each is
// logged once, and the records are failed without the ids (this builder's are then
// uploaded again). The active one's
// md5 matches the forged build's file, so only the ownership check keeps it
// from being adopted; the queued one is what recovery would delete as
// half-made.
func TestOnceRecoveryLeavesImagesNotOurs(t *testing.T) {
	ctx := context.Background()
	run := func(e *env, o othersImages) {
		t := e.t
		t.Helper()
		hook := writeFileT(t, filepath.Join(e.dir, "hook"), strings.ReplaceAll(hookScript, "{{DIR}}", e.dir))
		if err := os.Chmod(hook, 0o755); err != nil {
			t.Fatal(err)
		}
		r := e.once(0)
		e.checkLeft(o)
		for _, id := range []string{o.golden, o.queued} {
			if n := strings.Count(r.stderr, id); n == 0 || !strings.Contains(r.stderr, notOursSaid) {
				t.Errorf("--once does not say it left image %s:\n%s", id, r.stderr)
			}
		}
		if n := strings.Count(r.stderr, notOursSaid); n != 2 {
			t.Errorf("%d lines say an image is not the upload's, want one for each:\n%s", n, r.stderr)
		}
		// The records name the images no more: a second run leaves them
		// as they are, and says nothing of them.
		r = e.once(0)
		e.checkLeft(o)
		if strings.Contains(r.stderr, notOursSaid) {
			t.Errorf("the second --once speaks of the images again:\n%s", r.stderr)
		}
	}

	t.Run("sqlite", func(t *testing.T) {
		e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
		e.writeYAML(recoverConfig)
		o := e.othersImages()
		if err := os.MkdirAll(e.imagesDir(), 0o750); err != nil {
			t.Fatal(err)
		}
		st, raw := storetest.Open(t, store.Options{ImagesDir: e.imagesDir()})
		// Two builds of this builder whose raw file is the golden image's
		// data, each with an upload left uploading that names an image.
		for _, id := range []string{o.golden, o.queued} {
			b, err := st.CreateBuild(ctx, store.Build{Image: "debian", Source: store.SourceZuul})
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(mustPath(st.FilePath("debian", b.ID, "raw")), o.goldenData, 0o640); err != nil {
				t.Fatal(err)
			}
			b.SetFile(store.File{Format: "raw", Size: int64(len(o.goldenData)), MD5: o.goldenMD5, Present: true})
			if err := raw.SetBuildState(ctx, &b, store.Ready, ""); err != nil {
				t.Fatal(err)
			}
			up, err := st.CreateUpload(ctx, &b, "cloud-x", "raw")
			if err != nil {
				t.Fatal(err)
			}
			up.ExternalID = id
			if err := raw.Write(ctx, store.PutUpload(&up)); err != nil {
				t.Fatal(err)
			}
		}
		st.Close()
		run(e, o)
	})

	t.Run("zookeeper", func(t *testing.T) {
		testenv.RequireNodepool(t)
		e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
		e.writeYAML(recoverConfig)
		z := testenv.NewZooKeeper(t, testenv.ZooKeeperOptions{TLS: true})
		e.appendConfig(zkKeys(z, zkChroot))
		o := e.othersImages()
		// A build of another builder, as nodepool's builder stores one (no
		// checksum of its file), with an upload left uploading per image.
		for _, id := range []string{o.golden, o.queued} {
			sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			_, _, err := testenv.NodepoolStoreBuild(sctx, kazooConn(z), testenv.NodepoolBuildRecord{
				Image: "debian", State: "ready", Builder: "elsewhere", BuilderID: "python-builder", Formats: []string{"raw"},
				Uploads: []testenv.NodepoolUploadRecord{{Provider: "cloud-x", State: "uploading", Format: "raw", ExternalID: id}},
			})
			cancel()
			if err != nil {
				t.Fatal(err)
			}
		}
		run(e, o)
		// Another builder's build: its uploads stay failed, with the reason,
		// for that builder to retry.
		failed := 0
		for _, u := range e.uploadsJSON() {
			if u.State == "failed" && strings.Contains(u.Reason, "its record named was left in the cloud") && u.ExternalID == "" {
				failed++
			}
		}
		if failed != 2 {
			t.Errorf("%d uploads failed without the image they named, want 2: %+v", failed, e.uploadsJSON())
		}
	})
}
