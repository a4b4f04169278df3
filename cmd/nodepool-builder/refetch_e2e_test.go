package main

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/listing"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/uploader"
	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

// refetchConfig is a zuul-image polled every second, uploaded to one cloud,
// and a builder that serves gearman jobs.
const refetchConfig = `images-dir: {{IMAGES}}
build-log-dir: {{LOGS}}
gearman-servers:
  - host: 127.0.0.1
    port: {{GEARMAN}}
zuul-images:
{{DEBIAN}}providers:
  - name: cloud-q
    cloud: {{CLOUD}}
    image-format: qcow2
    diskimages:
      - name: debian
`

// TestZuulImageFetchedAgainAfterImageDelete: anyone who reaches gearmand can
// run image-delete:<build>. When it deletes the only build of a zuul-image,
// the daemon fetches Zuul's newest build again, though its poll cursor is at
// that build, and uploads it: the cloud is not left without the image.
func TestZuulImageFetchedAgainAfterImageDelete(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	gd := testenv.NewGearmand(t)
	e.writeYAML(strings.ReplaceAll(refetchConfig, "{{GEARMAN}}", strconv.Itoa(gd.Port)))
	zb := e.addBuild(e.makeImage(1), zuultest.BuildSpec{})
	d := startDaemon(t, e.cfgPath)

	// ready waits for a ready build of zb other than not, uploaded to cloud-q.
	ready := func(what, not string) listing.Build {
		t.Helper()
		var b listing.Build
		testenv.WaitFor(t, 90*time.Second, what, func() bool {
			var ok bool
			b, ok = e.zuulBuildOf(zb.UUID)
			if !ok || b.BuildID == not || b.State != "ready" {
				return false
			}
			_, ok = e.readyUpload(b.BuildID, "cloud-q")
			return ok
		}, d.logs.String)
		e.checkUploaded("cloud-q", b, "qcow2")
		return b
	}
	first := ready("the Zuul build fetched and uploaded", "")

	waitWorkers(t, gd, d, "image-delete:"+first.BuildID, 1)
	if name := gearmanJob(t, gd, "image-delete:"+first.BuildID, "").ok(t, "image-delete"); name != store.BuildName("debian", first.BuildID) {
		t.Fatalf("image-delete answered %q, want %s", name, store.BuildName("debian", first.BuildID))
	}
	if e.listed(first.BuildID) {
		t.Fatalf("build %s still listed after image-delete", first.BuildID)
	}
	// Only the deleted build's images must be gone: the fetch again may
	// already have begun the next build's upload, which follows its download.
	imgs, err := e.cloud.List(context.Background(), map[string]string{uploader.PropProvider: "cloud-q", uploader.PropBuildID: first.BuildID})
	if err != nil {
		t.Fatal(err)
	}
	if len(imgs) != 0 {
		t.Fatalf("Glance still holds images of build %s after image-delete: %+v", first.BuildID, imgs)
	}

	again := ready("the same Zuul build fetched and uploaded again", first.BuildID)
	d.waitLog(t, 10*time.Second, "the zuul-image has no ready build: fetching Zuul's newest build again")
	if n := len(e.buildsOf("debian")); n != 1 {
		t.Errorf("%d builds of debian after the fetch again, want 1: %+v", n, e.buildsOf("debian"))
	}
	// Fetched once again, not at every poll.
	polls := len(e.zuul.BuildsCalls())
	testenv.WaitFor(t, 30*time.Second, "two more polls", func() bool { return len(e.zuul.BuildsCalls()) >= polls+2 }, d.logs.String)
	if builds := e.buildsOf("debian"); len(builds) != 1 || builds[0].BuildID != again.BuildID {
		t.Errorf("builds of debian after more polls: %+v, want only %s", builds, again.BuildID)
	}
}
