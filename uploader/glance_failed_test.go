package uploader_test

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/uploader"
	"github.com/nodepool-builder/nodepool-builder/uploader/openstack"
)

// TestGlanceGoneDuringAnUpload: a real Glance goes away (its address refuses
// connections and the open ones are cut) while an upload's data is on its way.
// The half-made image cannot be deleted then, so the upload is recorded failed
// with the image's id, never left uploading. While Glance is away the
// lifecycle's delete fails and the record stays; once Glance is back the
// lifecycle deletes the image and then the record, and the retry makes a ready
// upload.
func TestGlanceGoneDuringAnUpload(t *testing.T) {
	g := testenv.NewGlance(t)
	proxy := testenv.NewProxy(t, strings.TrimPrefix(g.Endpoint, "http://"))
	// Slow enough that the upload is surely under way when Glance goes.
	proxy.SetRate(64 << 10)
	ctx := t.Context()

	dir := t.TempDir()
	clouds := filepath.Join(dir, "clouds.yaml")
	if err := os.WriteFile(clouds, []byte("clouds:\n  away:\n    auth_type: none\n    image_endpoint_override: "+proxy.URL()+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cloud, err := openstack.Open(ctx, openstack.Options{Cloud: "away", CloudsFile: clouds})
	if err != nil {
		t.Fatal(err)
	}
	// Glance itself, past the proxy, to see what it holds.
	direct, err := openstack.Open(ctx, openstack.Options{Cloud: g.Cloud, CloudsFile: g.CloudsFile})
	if err != nil {
		t.Fatal(err)
	}

	setup := newGlanceSetup(t, "a", "away", time.Minute, 3)
	st, cfg := setup.st, setup.cfg
	data := bytes.Repeat([]byte("not really a disk image "), 1<<16) // 1.5 MiB: ~24 s through the proxy
	b := setup.readyBuild(t, "", func(path string) error { return os.WriteFile(path, data, 0o644) })

	sending := make(chan struct{})
	var once sync.Once
	up := uploader.New(uploader.Options{Store: st, Config: cfg, Clouds: map[string]uploader.Cloud{"a": cloud},
		Logger:       slog.New(slog.NewTextHandler(t.Output(), nil)),
		PollInterval: 100 * time.Millisecond, CloudTimeout: 10 * time.Second, CleanupGrace: 5 * time.Second,
		OnSent: func(_ uploader.Planned, sent, _ int64) {
			if sent > 0 {
				once.Do(func() { close(sending) })
			}
		}})

	jobs, err := up.Plan(ctx)
	if err != nil || len(jobs) != 1 {
		t.Fatalf("plan: %v, %v; want one job", jobs, err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := up.Upload(ctx, jobs[0])
		done <- err
	}()
	select {
	case <-sending:
	case err := <-done:
		t.Fatalf("the upload ended before its data was on its way: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("the upload's data did not start within a minute")
	}
	proxy.Down()
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		t.Fatal("the upload did not end within a minute of Glance going away")
	}
	if err == nil {
		t.Fatal("the upload succeeded although Glance went away during it")
	}

	ups, lerr := st.Uploads(ctx, store.UploadFilter{BuildID: b.ID})
	if lerr != nil {
		t.Fatal(lerr)
	}
	if len(ups) != 1 || ups[0].State != store.Failed || ups[0].ExternalID == "" || !strings.Contains(ups[0].LastError, "could not be deleted") {
		t.Fatalf("after an upload Glance went away from (%v): %+v; want one upload, failed, with its image's id", err, ups)
	}
	failed := ups[0]
	if img, err := direct.Get(ctx, failed.ExternalID); err != nil || img.Status == "active" {
		t.Fatalf("Glance's half-made image %s: %+v, %v; want it there, not active", failed.ExternalID, img, err)
	}

	// Glance still away: the lifecycle cannot delete the image, and the
	// record keeps its id.
	if err := up.Delete(ctx); err == nil || !strings.Contains(err.Error(), failed.ExternalID) {
		t.Fatalf("a delete pass with Glance away: %v; want the failed delete of %s reported", err, failed.ExternalID)
	}
	if ups, _ := st.Uploads(ctx, store.UploadFilter{BuildID: b.ID}); len(ups) != 1 || ups[0].State != store.Failed || ups[0].ExternalID != failed.ExternalID {
		t.Fatalf("after a delete pass with Glance away: %+v; want the failed upload with its image's id", ups)
	}

	// Glance is back: the image goes, then the record.
	if err := proxy.Up(); err != nil {
		t.Fatal(err)
	}
	proxy.SetRate(0)
	if err := up.Delete(ctx); err != nil {
		t.Fatalf("a delete pass with Glance back: %v", err)
	}
	if img, err := direct.Get(ctx, failed.ExternalID); !errors.Is(err, uploader.ErrNotFound) && (err != nil || img.Status != "deleted") {
		t.Fatalf("Glance's half-made image %s after the delete pass: %+v, %v; want it gone", failed.ExternalID, img, err)
	}
	if ups, _ := st.Uploads(ctx, store.UploadFilter{BuildID: b.ID}); len(ups) != 0 {
		t.Fatalf("after the half-made image went: %+v; want the failed record gone too", ups)
	}

	// The retry makes a ready upload.
	jobs, err = up.Plan(ctx)
	if err != nil || len(jobs) != 1 {
		t.Fatalf("plan after Glance came back: %v, %v; want one job", jobs, err)
	}
	ready, err := up.Upload(ctx, jobs[0])
	if err != nil {
		t.Fatalf("the retry: %v", err)
	}
	if img, err := direct.Get(ctx, ready.ExternalID); err != nil || img.Status != "active" || img.Size != int64(len(data)) {
		t.Fatalf("Glance's image of the retry: %+v, %v; want it active with all %d bytes", img, err, len(data))
	}
	if ups, _ := st.Uploads(ctx, store.UploadFilter{BuildID: b.ID}); len(ups) != 1 || ups[0].State != store.Ready {
		t.Fatalf("after the retry: %+v; want one ready upload", ups)
	}
}
