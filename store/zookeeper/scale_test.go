package zookeeper_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/store/storetest"
	"github.com/nodepool-builder/nodepool-builder/store/zookeeper"
	"github.com/nodepool-builder/nodepool-builder/store/zookeeper/zktest"
	"github.com/nodepool-builder/nodepool-builder/uploader"
)

// fleet is the shape of a populated state: images × providers, every image
// listed by every provider.
type fleet struct {
	images, providers int
}

func (f fleet) image(i int) string    { return fmt.Sprintf("image-%03d", i) }
func (f fleet) provider(p int) string { return fmt.Sprintf("provider-%02d", p) }

// builds is how many ready builds image i has: two, but one for every tenth
// image, so that images differ as they do in a real installation.
func (f fleet) builds(i int) int {
	if i%10 == 9 {
		return 1
	}
	return 2
}

// config lists every image as a zuul-image and every provider with all of them.
// keep-builds and keep-uploads 2 keep everything populate writes: a step over
// it plans nothing and releases nothing, as in a builder with nothing to do.
func (f fleet) config() *config.Config {
	cfg := &config.Config{Builder: config.Builder{KeepBuilds: 2, KeepUploads: 2, UploadAttempts: 3}}
	var listed []config.ProviderImage
	for i := range f.images {
		cfg.ZuulImages = append(cfg.ZuulImages, config.ZuulImage{Name: f.image(i)})
		listed = append(listed, config.ProviderImage{Name: f.image(i)})
	}
	for p := range f.providers {
		cfg.Providers = append(cfg.Providers, config.Provider{Name: f.provider(p), ImageFormat: "qcow2",
			ImageNameFormat: "{image_name}-{upload_id}", DiskImages: listed})
	}
	return cfg
}

// populate writes the fleet through st, as the builder writes its records: per
// image its ready builds (created building, their file recorded, then ready, as
// the poller and DIB do), and per build and provider an upload created uploading
// and then recorded ready with its cloud image, as the uploader does. Images are
// written in parallel, each by one goroutine: the builds of an image must be
// created in order (the newest is the one to upload), and each upload of a build
// changes the build, so one writer per image keeps them from conflicting. It
// returns how many uploads it wrote.
func populate(ctx context.Context, st opened, f fleet) (int, error) {
	const workers = 32
	next := make(chan int)
	var uploads atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for range workers {
		wg.Go(func() {
			for i := range next {
				n, err := populateImage(ctx, st, f, i)
				uploads.Add(int64(n))
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	for i := range f.images {
		next <- i
	}
	close(next)
	wg.Wait()
	return int(uploads.Load()), errors.Join(errs...)
}

func populateImage(ctx context.Context, st opened, f fleet, i int) (int, error) {
	image := f.image(i)
	uploads := 0
	for n := range f.builds(i) {
		b, err := readyBuild(ctx, st, image, int64(i*10+n))
		if err != nil {
			return uploads, err
		}
		for p := range f.providers {
			if _, err := readyUpload(ctx, st, &b, f.provider(p)); err != nil {
				return uploads, err
			}
			uploads++
		}
	}
	return uploads, nil
}

// readyBuild records a ready Zuul build of image with a qcow2 file.
func readyBuild(ctx context.Context, st opened, image string, zuulID int64) (store.Build, error) {
	zuulUUID := randomHex(16)
	b, err := st.CreateBuild(ctx, store.Build{Image: image, Source: store.SourceZuul, Zuul: store.ZuulRef{
		UUID: zuulUUID, ID: zuulID, EndTime: st.Now(), LogURL: "https://zuul.example.org/logs/" + zuulUUID + "/"}})
	if err != nil {
		return b, err
	}
	b.SetFile(store.File{Format: "qcow2", SHA256: randomHex(32), MD5: randomHex(16), Size: 2 << 30,
		URL: "https://zuul.example.org/logs/" + zuulUUID + "/" + image + ".qcow2", Present: true})
	if err := st.raw.SetBuildState(ctx, &b, store.Ready, ""); err != nil {
		return b, err
	}
	return b, nil
}

// readyUpload records an upload of b to provider and marks it ready with its
// cloud image. b's version moves on: creating an upload changes its build.
func readyUpload(ctx context.Context, st opened, b *store.Build, provider string) (store.Upload, error) {
	u, err := st.CreateUpload(ctx, b, provider, "qcow2")
	if err != nil {
		return u, err
	}
	u.ExternalID = randomHex(16)
	u.ExternalName = uploader.ImageName("{image_name}-{upload_id}", b.Image, b.ID, u.ID, st.Now())
	u.SetState(store.Ready, st.Now())
	if err := st.raw.Write(ctx, store.PutUpload(&u)); err != nil {
		return u, fmt.Errorf("record upload %s ready: %w", u, err)
	}
	return u, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// scaleChroot is a chroot of the test's or benchmark's own, as chroot is.
func scaleChroot(tb testing.TB) string {
	return "/" + runPrefix + "/" + strings.ReplaceAll(tb.Name(), "/", "-")
}

// openStore opens a store over a new backend under chroot, on images-dir dir;
// stores on one dir share its builder id, as a builder restarted on its host.
// The backend talks to z through the counter it returns, which counts what it
// sends.
// opened is a store with its backend, through which a test writes the records
// it sets up.
type opened struct {
	*store.Store
	raw storetest.Raw
}

func openStore(tb testing.TB, z *testenv.ZooKeeper, chroot, dir string, log *slog.Logger) (opened, *testenv.ZooKeeperCounter) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	wire := testenv.NewZooKeeperCounter(tb, z)
	b, err := zookeeper.Open(ctx, zookeeper.Options{Servers: []string{wire.Addr}, Chroot: chroot, Logger: log})
	if err != nil {
		tb.Fatal(err)
	}
	st, raw := storetest.Open(tb, store.Options{ImagesDir: dir, Backend: b})
	tb.Cleanup(func() { st.Close() })
	return opened{st, raw}, wire
}

// reconcile is the builder's reconcile step over the records: it plans the
// uploads that are missing and applies retention. It returns how many uploads
// it planned.
func reconcile(ctx context.Context, up *uploader.Uploader) (int, error) {
	jobs, err := up.Plan(ctx)
	if err != nil {
		return 0, fmt.Errorf("plan: %w", err)
	}
	if err := up.Retain(ctx); err != nil {
		return 0, fmt.Errorf("retain: %w", err)
	}
	return len(jobs), nil
}

// newUploader returns an uploader over st for the fleet. Plan and Retain call
// no cloud, so there is none.
func newUploader(st *store.Store, f fleet, log *slog.Logger) *uploader.Uploader {
	return uploader.New(uploader.Options{Store: st, Config: f.config(), Logger: log})
}

// TestZooKeeperStepReadsNoZnode shows that a reconcile step reads the records
// from the cache, sending ZooKeeper nothing, and that the cache still follows
// what another builder writes.
func TestZooKeeperStepReadsNoZnode(t *testing.T) {
	ctx := context.Background()
	z := testenv.NewZooKeeper(t, testenv.ZooKeeperOptions{})
	root := scaleChroot(t)
	dir := t.TempDir()
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	f := fleet{images: 20, providers: 5}
	writer, _ := openStore(t, z, root, dir, log)
	uploads, err := populate(ctx, writer, f)
	if err != nil {
		t.Fatal(err)
	}

	// A fresh process: its Open reads the tree once, then steps read no znode.
	st, b := openStore(t, z, root, dir, log)
	loaded := b.Requests()
	up := newUploader(st.Store, f, log)
	full := zktest.NewFullRead(t, z, root)
	if err := full.Read(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d uploads; opening read the tree with %d requests; a full read takes %d requests for %d znodes",
		uploads, loaded, full.Requests.Load(), full.Znodes.Load())
	if full.Znodes.Load() < int64(2*uploads) {
		t.Fatalf("a full read read %d znodes, want at least the %d uploads and their extra nodes", full.Znodes.Load(), uploads)
	}
	steady := func(what string) {
		t.Helper()
		for i := range 5 {
			before := b.Requests()
			jobs, err := reconcile(ctx, up)
			if err != nil {
				t.Fatal(err)
			}
			if jobs != 0 {
				t.Fatalf("%s: step %d planned %d uploads, want none: every upload is there", what, i, jobs)
			}
			// Nothing changed, so no watch fired and nothing is read again.
			if n := b.Requests() - before; n != 0 {
				t.Fatalf("%s: step %d sent ZooKeeper %d requests, want none (a full read is %d)", what, i, n, full.Requests.Load())
			}
		}
	}
	steady("after open")

	// Another builder's changes reach the next step.
	sees := func(what string, want int) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			jobs, err := reconcile(ctx, up)
			if err != nil {
				t.Fatal(err)
			}
			if jobs == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the step plans %d uploads after 30s, want %d", what, jobs, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	nb, err := readyBuild(ctx, writer, f.image(0), 1000)
	if err != nil {
		t.Fatal(err)
	}
	sees("a new ready build", f.providers)
	if _, err := writer.CreateUpload(ctx, &nb, f.provider(0), "qcow2"); err != nil {
		t.Fatal(err)
	}
	sees("an upload of it begun", f.providers-1)
	if err := writer.raw.SetBuildState(ctx, &nb, store.Deleting, "released"); err != nil {
		t.Fatal(err)
	}
	sees("the build marked deleting", 0)
	// The reason is in the build's extra node, which the writer wrote last: once
	// it is read, no change is left for the cache to read.
	deadline := time.Now().Add(30 * time.Second)
	for {
		bs, err := st.Builds(ctx, store.BuildFilter{Image: nb.Image, State: store.Deleting})
		if err != nil {
			t.Fatal(err)
		}
		if len(bs) == 1 && bs[0].Version == nb.Version && bs[0].Reason == nb.Reason {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the deleting build as read: %+v, want version %d and reason %q", bs, nb.Version, nb.Reason)
		}
		time.Sleep(10 * time.Millisecond)
	}
	steady("after the changes")
}

// TestZooKeeperOpenReadsLikeAFullRead: opening reads the tree about as a
// plain full read of it does: beside the full read's listings and records, a
// listing of each image and each build, whose children the full read knows by
// name, and the few paths Open makes sure of. A node that holds only others is
// listed, not also read; an upload is read with its extra node, not listed.
func TestZooKeeperOpenReadsLikeAFullRead(t *testing.T) {
	ctx := context.Background()
	z := testenv.NewZooKeeper(t, testenv.ZooKeeperOptions{})
	root := scaleChroot(t)
	dir := t.TempDir()
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	f := fleet{images: 10, providers: 5}
	writer, _ := openStore(t, z, root, dir, log)
	if _, err := populate(ctx, writer, f); err != nil {
		t.Fatal(err)
	}
	builds := 0
	for i := range f.images {
		builds += f.builds(i)
	}
	full := zktest.NewFullRead(t, z, root)
	if err := full.Read(); err != nil {
		t.Fatal(err)
	}
	_, b := openStore(t, z, root, dir, log)
	// Open makes sure of the paths it needs and the store reads its own
	// records of the builder: a few reads whatever the tree holds.
	const ensured = 16
	bound := full.Requests.Load() + int64(f.images+builds) + ensured
	if n := b.Reads(); n > bound {
		t.Fatalf("Open read %d znodes; a full read takes %d, and with a listing of each of %d images and %d builds "+
			"and the paths Open ensures, no more than %d", n, full.Requests.Load(), f.images, builds, bound)
	}
	t.Logf("Open read %d znodes, a full read %d", b.Reads(), full.Requests.Load())
}

// TestZooKeeperCachedRecordsAreCopies shows that the records a read returns are
// the caller's: changing them, as a step does before it writes, changes nothing
// another read sees.
func TestZooKeeperCachedRecordsAreCopies(t *testing.T) {
	ctx := context.Background()
	z := testenv.NewZooKeeper(t, testenv.ZooKeeperOptions{})
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	st, _ := openStore(t, z, scaleChroot(t), t.TempDir(), log)
	b, err := readyBuild(ctx, st, "debian", 1)
	if err != nil {
		t.Fatal(err)
	}
	b.Refuse("raw", "checksum mismatch")
	if err := st.raw.Write(ctx, store.PutBuild(&b)); err != nil {
		t.Fatal(err)
	}
	read := func() store.Build {
		t.Helper()
		bs, err := st.Builds(ctx, store.BuildFilter{Image: "debian"})
		if err != nil || len(bs) != 1 {
			t.Fatalf("builds of debian: %+v, %v", bs, err)
		}
		return bs[0]
	}
	got := read()
	f := got.Files[0]
	f.Present = false
	got.SetFile(f)
	got.Refuse("raw", "changed by the caller")
	if again := read(); !again.Files[0].Present || again.Refused["raw"] != "checksum mismatch" {
		t.Fatalf("a caller's change of a read build reached the cache: %+v", again)
	}
}

// BenchmarkZooKeeperStep times the reconcile step at the scale of a large
// installation, 500 images × 20 providers: 19,000 uploads, 40,000 znodes of
// records and 80,000 in all. Beside it, as an anchor, a full read of the tree,
// which a backend without a cache would make on every step. Populating takes
// 30 to 60 s on a small machine and opening the reading backend 20 s; both
// happen once, before the timer starts, so -benchtime adds only steps.
//
// Metrics: ns/op and zk-requests/step are a step on an unchanged state;
// first-step-ns is the first step after Open, which decodes every record;
// changed-step-ns is a step after one upload changed, which decodes that one
// again; full-read-ns and full-read-requests are the anchor, and
// x-of-full-read is a step's time as a fraction of it.
func BenchmarkZooKeeperStep(b *testing.B) {
	ctx := context.Background()
	z := testenv.NewZooKeeper(b, testenv.ZooKeeperOptions{})
	root := scaleChroot(b)
	dir := b.TempDir()
	log := slog.New(slog.DiscardHandler)
	f := fleet{images: 500, providers: 20}
	writer, wb := openStore(b, z, root, dir, log)
	start := time.Now()
	uploads, err := populate(ctx, writer, f)
	if err != nil {
		b.Fatal(err)
	}
	populated, written := time.Since(start), wb.Requests()
	writer.Close()

	start = time.Now()
	st, zb := openStore(b, z, root, dir, log)
	opened := time.Since(start)
	loaded := zb.Requests()
	up := newUploader(st.Store, f, log)
	full := zktest.NewFullRead(b, z, root)
	const fullReads = 2
	start = time.Now()
	for range fullReads {
		if err := full.Read(); err != nil {
			b.Fatal(err)
		}
	}
	fullTime := time.Since(start) / fullReads
	fullRequests := full.Requests.Load() / fullReads
	b.Logf("%d uploads, populated in %s with %d requests; Open read the tree in %s with %d requests; a full read gets %d znodes",
		uploads, populated.Round(time.Millisecond), written, opened.Round(time.Millisecond), loaded, full.Znodes.Load()/fullReads)

	timed := func() time.Duration {
		start := time.Now()
		if jobs, err := reconcile(ctx, up); err != nil || jobs != 0 {
			b.Fatalf("step: %d uploads planned, want none; %v", jobs, err)
		}
		return time.Since(start)
	}
	first := timed()
	before := zb.Requests()
	for b.Loop() {
		jobs, err := reconcile(ctx, up)
		if err != nil {
			b.Fatal(err)
		}
		if jobs != 0 {
			b.Fatalf("the step planned %d uploads, want none", jobs)
		}
	}
	requests := zb.Requests() - before
	step := b.Elapsed() / time.Duration(b.N)

	ups, err := st.Uploads(ctx, store.UploadFilter{Image: f.image(0), Provider: f.provider(0)})
	if err != nil || len(ups) == 0 {
		b.Fatalf("uploads of %s to %s: %d, %v", f.image(0), f.provider(0), len(ups), err)
	}
	const changes = 5
	var changed time.Duration
	for range changes {
		// Written again unchanged: its version moves on, so the step decodes it again.
		if err := st.raw.Write(ctx, store.PutUpload(&ups[0])); err != nil {
			b.Fatal(err)
		}
		changed += timed()
	}
	b.ReportMetric(float64(requests)/float64(b.N), "zk-requests/step")
	b.ReportMetric(float64(first.Nanoseconds()), "first-step-ns")
	b.ReportMetric(float64(changed.Nanoseconds()/changes), "changed-step-ns")
	b.ReportMetric(float64(fullTime.Nanoseconds()), "full-read-ns")
	b.ReportMetric(float64(fullRequests), "full-read-requests")
	b.ReportMetric(float64(step)/float64(fullTime), "x-of-full-read")
}
