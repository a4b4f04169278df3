package builder

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/store/storetest"
	"github.com/nodepool-builder/nodepool-builder/uploader"
)

// gatedCloud is an in-memory image service whose uploads can be held: while the
// gate is closed, an upload blocks (until the gate opens or its context ends),
// which is how a test keeps a worker busy.
type gatedCloud struct {
	mu      sync.Mutex
	seq     int
	images  map[string]uploader.CloudImage
	gate    chan struct{} // nil: uploads pass
	started chan string   // receives the id of each upload that begins
	creates int
	lists   int
	// hangDeletes makes deletes wait for their context to end, as a cloud that
	// stopped answering does.
	hangDeletes bool
	// uploadErr, when set, is what every upload fails with.
	uploadErr error
}

func newGatedCloud() *gatedCloud {
	return &gatedCloud{images: map[string]uploader.CloudImage{}, started: make(chan string, 16)}
}

// hold makes uploads block until release.
func (c *gatedCloud) hold() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gate = make(chan struct{})
}

func (c *gatedCloud) release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gate != nil {
		close(c.gate)
		c.gate = nil
	}
}

func (c *gatedCloud) Create(_ context.Context, spec uploader.ImageSpec) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	c.creates++
	// Shaped as Glance makes them: the uploader deletes no other.
	id := fmt.Sprintf("00000000-0000-4000-8000-%012d", c.seq)
	c.images[id] = uploader.CloudImage{ID: id, Name: spec.Name, Status: "queued", Properties: spec.Properties}
	return id, nil
}

func (c *gatedCloud) Upload(ctx context.Context, id string, r io.Reader, size int64) error {
	c.mu.Lock()
	gate, fail := c.gate, c.uploadErr
	c.mu.Unlock()
	if fail != nil {
		return fail
	}
	c.started <- id
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if _, err := io.Copy(io.Discard, r); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	img, ok := c.images[id]
	if !ok {
		return uploader.ErrNotFound
	}
	img.Status = "active"
	c.images[id] = img
	return nil
}

func (c *gatedCloud) Get(_ context.Context, id string) (uploader.CloudImage, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	img, ok := c.images[id]
	if !ok {
		return uploader.CloudImage{}, fmt.Errorf("image %s: %w", id, uploader.ErrNotFound)
	}
	return img, nil
}

func (c *gatedCloud) List(_ context.Context, match map[string]string) ([]uploader.CloudImage, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lists++
	var out []uploader.CloudImage
	for _, img := range c.images {
		ok := true
		for k, v := range match {
			ok = ok && img.Properties[k] == v
		}
		if ok {
			out = append(out, img)
		}
	}
	return out, nil
}

func (c *gatedCloud) Project(context.Context) (string, error) { return "", nil }

func (c *gatedCloud) Delete(ctx context.Context, id string) error {
	c.mu.Lock()
	hang := c.hangDeletes
	c.mu.Unlock()
	if hang {
		<-ctx.Done()
		return ctx.Err()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.images, id)
	return nil
}

func (c *gatedCloud) count() (images, creates int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.images), c.creates
}

// rig is a builder on a temporary images-dir whose providers are gated clouds.
type rig struct {
	t      *testing.T
	dir    string
	st     *store.Store
	raw    storetest.Raw // writes the records a test sets up
	clouds map[string]*gatedCloud
	b      *Builder
	cfg    string // the config file
	// storeLogs holds what the store logged: the records it refused.
	storeLogs *logBuffer
	// reloads is the Reload signal of the builder, unless the test gave its own.
	reloads chan struct{}
}

// twoImages has two diskimages, paused so that only the test makes builds, each
// uploaded to its own provider.
const twoImages = `images-dir: %s
diskimages:
  - name: img-a
    elements: [e]
    pause: true
  - name: img-b
    elements: [e]
    pause: true
providers:
  - name: pa
    cloud: a
    image-format: raw
    diskimages: [{name: img-a}]
  - name: pb
    cloud: b
    image-format: raw
    diskimages: [{name: img-b}]
`

// newRig makes a rig of a config; edit, when given, changes the builder's
// options before it is made.
func newRig(t *testing.T, text string, edit ...func(*Options)) *rig {
	t.Helper()
	dir := t.TempDir()
	r := &rig{t: t, dir: dir, clouds: map[string]*gatedCloud{"pa": newGatedCloud(), "pb": newGatedCloud()},
		reloads: make(chan struct{}, 1)}
	images := filepath.Join(dir, "images")
	r.cfg = filepath.Join(dir, "nodepool.yaml")
	r.write(fmt.Sprintf(text, images))
	cfg, err := config.Load(config.Files{Nodepool: r.cfg})
	if err != nil {
		t.Fatal(err)
	}
	r.storeLogs = &logBuffer{}
	st, raw := storetest.Open(t, store.Options{ImagesDir: images,
		Logger: slog.New(slog.NewTextHandler(io.MultiWriter(t.Output(), r.storeLogs), nil))})
	t.Cleanup(func() { st.Close() })
	r.st, r.raw = st, raw
	opts := Options{
		Config:        cfg,
		Store:         st,
		Logger:        slog.New(slog.NewTextHandler(t.Output(), nil)),
		UploadWorkers: 1,
		Read:          func() (*config.Snapshot, error) { return config.Read(config.Files{Nodepool: r.cfg}) },
		OpenCloud: func(_ context.Context, p *config.Provider) (uploader.Cloud, error) {
			return r.clouds[p.Name], nil
		},
		Intervals:    Intervals{Plan: 20 * time.Millisecond, Cleanup: 20 * time.Millisecond, ConfigCheck: 20 * time.Millisecond},
		CleanupGrace: 500 * time.Millisecond,
		Reload:       r.reloads,
	}
	for _, e := range edit {
		e(&opts)
	}
	r.b, err = New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *rig) write(text string) {
	r.t.Helper()
	if err := os.WriteFile(r.cfg, []byte(text), 0o644); err != nil {
		r.t.Fatal(err)
	}
}

// confirm writes text as the config and sends the Reload signal, as SIGHUP
// does: a change of the builder's own settings waits for it.
func (r *rig) confirm(text string) {
	r.t.Helper()
	r.write(text)
	select {
	case r.reloads <- struct{}{}:
	default:
		r.t.Fatal("a Reload signal is still pending, or the test gave the builder its own")
	}
}

// run runs the daemon's loops until the test ends or it calls the returned stop,
// which waits for Run to return.
func (r *rig) run() (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		r.b.Run(ctx)
		close(done)
	}()
	stop = func() {
		cancel()
		<-done
	}
	r.t.Cleanup(func() {
		for _, c := range r.clouds {
			c.release()
		}
		stop()
	})
	return stop
}

// build records a ready build of image with a raw file.
func (r *rig) build(image string) store.Build {
	r.t.Helper()
	ctx := context.Background()
	// As a real build step does, under the image's build lock: without it the
	// daemon's recovery rightly takes the building record for an interrupted
	// build and settles it.
	var held store.Held
	testenv.WaitFor(r.t, 10*time.Second, "the build lock of "+image, func() bool {
		var err error
		held, err = r.st.TryLock(ctx, store.LockKey{Image: image})
		if err != nil && !errors.Is(err, store.ErrHeld) {
			r.t.Fatal(err)
		}
		return err == nil
	})
	defer held.Release()
	b, err := r.st.CreateBuild(ctx, store.Build{Image: image, Source: store.SourceDIB})
	if err != nil {
		r.t.Fatal(err)
	}
	if err := os.WriteFile(mustPath(r.st.FilePath(image, b.ID, "raw")), []byte("data of "+b.ID), 0o644); err != nil {
		r.t.Fatal(err)
	}
	b.SetFile(store.File{Format: "raw", Size: int64(len("data of " + b.ID)), Present: true})
	if err := r.raw.SetBuildState(ctx, &b, store.Ready, ""); err != nil {
		r.t.Fatal(err)
	}
	return b
}

func (r *rig) uploads(f store.UploadFilter) []store.Upload {
	r.t.Helper()
	ups, err := r.st.Uploads(context.Background(), f)
	if err != nil {
		r.t.Fatal(err)
	}
	return ups
}

// busy starts the rig with pa's upload of a new img-a build held, the only
// worker on it; it returns that build and what stops the rig.
func (r *rig) busy() (store.Build, func()) {
	r.t.Helper()
	r.clouds["pa"].hold()
	a := r.build("img-a")
	stop := r.run()
	select {
	case <-r.clouds["pa"].started:
	case <-time.After(10 * time.Second):
		r.t.Fatal("the upload to pa did not start")
	}
	return a, stop
}

// TestReleasedBuildStopsItsQueuedUpload: a dib-image-delete given while the
// build's upload waits for a worker stops the upload.
func TestReleasedBuildStopsItsQueuedUpload(t *testing.T) {
	r := newRig(t, twoImages)
	r.busy()
	bb := r.build("img-b")
	testenv.WaitFor(t, 10*time.Second, "img-b's upload to be queued behind the busy worker", func() bool { return r.b.queue.onBuild(bb.ID) })
	if _, err := r.st.ReleaseBuild(context.Background(), bb.ID, "dib-image-delete"); err != nil {
		t.Fatal(err)
	}
	r.clouds["pa"].release()
	testenv.WaitFor(t, 10*time.Second, "the released build to be deleted", func() bool {
		_, err := r.st.Build(context.Background(), bb.ID)
		return errors.Is(err, store.ErrNotFound)
	})
	if _, creates := r.clouds["pb"].count(); creates != 0 {
		t.Fatalf("the released build was uploaded to pb (%d creates)", creates)
	}
	if ups := r.uploads(store.UploadFilter{Provider: "pb"}); len(ups) != 0 {
		t.Fatalf("upload records of the released build: %+v", ups)
	}
}

// TestImageDeleteWinsOverQueuedRetry: an image-delete given while the upload's
// retry waits for a worker wins: the retry does not overwrite it, the cloud
// image goes, and the newest build is uploaded again under a new id.
func TestImageDeleteWinsOverQueuedRetry(t *testing.T) {
	ctx := context.Background()
	r := newRig(t, twoImages)
	bb := r.build("img-b")
	failed, err := r.st.CreateUpload(ctx, &bb, "pb", "raw")
	if err != nil {
		t.Fatal(err)
	}
	failed.SetState(store.Failed, r.st.Now())
	failed.LastError = "injected"
	failed.ExternalID = "" // nothing left of it in the cloud
	if err := r.raw.Write(ctx, store.PutUpload(&failed)); err != nil {
		t.Fatal(err)
	}
	r.busy()
	testenv.WaitFor(t, 10*time.Second, "the retry to be queued behind the busy worker", func() bool { return r.b.queue.onBuild(bb.ID) })
	if _, err := r.st.ReleaseUpload(ctx, bb.ID, "pb", failed.ID); err != nil {
		t.Fatal(err)
	}
	r.clouds["pa"].release()
	testenv.WaitFor(t, 10*time.Second, "the deleted upload to go and a new one to be made", func() bool {
		ups := r.uploads(store.UploadFilter{Provider: "pb"})
		return len(ups) == 1 && ups[0].ID != failed.ID && ups[0].State == store.Ready
	})
	if images, creates := r.clouds["pb"].count(); images != 1 || creates != 1 {
		t.Fatalf("pb holds %d images after %d creates, want 1 of 1", images, creates)
	}
}

// TestBusyWorkerHoldsNothingElseBack: while an upload is held, a new build of
// another image is uploaded with the next free worker, and deletes go on.
func TestBusyWorkerHoldsNothingElseBack(t *testing.T) {
	ctx := context.Background()
	r := newRig(t, twoImages)
	r.b.opts.UploadWorkers = 2
	old := r.build("img-b")
	a, _ := r.busy()
	testenv.WaitFor(t, 10*time.Second, "img-b uploaded while pa is held", func() bool {
		return len(r.uploads(store.UploadFilter{BuildID: old.ID, State: store.Ready})) == 1
	})
	// An operator deletes it: carried out while pa is still held.
	up := r.uploads(store.UploadFilter{BuildID: old.ID})[0]
	if _, err := r.st.ReleaseUpload(ctx, old.ID, "pb", up.ID); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the delete while pa is held", func() bool {
		_, err := r.clouds["pb"].Get(ctx, up.ExternalID)
		return errors.Is(err, uploader.ErrNotFound)
	})
	if ups := r.uploads(store.UploadFilter{BuildID: a.ID}); len(ups) != 1 || ups[0].State != store.Uploading {
		t.Fatalf("pa's upload is not held: %+v", ups)
	}
}

// TestReloadCancelsUploadsOfDroppedImages: a reload that drops an image from a
// provider stops its upload under way; the other work goes on.
func TestReloadCancelsUploadsOfDroppedImages(t *testing.T) {
	ctx := context.Background()
	reload := make(chan struct{}, 1)
	r := newRig(t, twoImages, func(o *Options) { o.Reload = reload })
	a, _ := r.busy()
	r.write(strings.Replace(fmt.Sprintf(twoImages, r.st.Dir()), "diskimages: [{name: img-a}]", "diskimages: []", 1))
	reload <- struct{}{} // pa's every upload goes: the operator confirms it
	testenv.WaitFor(t, 10*time.Second, "the dropped image's upload to stop and go", func() bool {
		return len(r.uploads(store.UploadFilter{BuildID: a.ID})) == 0
	})
	if images, _ := r.clouds["pa"].count(); images != 0 {
		t.Fatalf("pa holds %d images of the dropped upload", images)
	}
	if r.b.Config().Provider("pa").Entry("img-a") != nil {
		t.Fatal("the new config was not taken")
	}
	b := r.build("img-b")
	testenv.WaitFor(t, 10*time.Second, "img-b uploaded after the reload", func() bool {
		return len(r.uploads(store.UploadFilter{BuildID: b.ID, State: store.Ready})) == 1
	})
	if _, err := r.st.Build(ctx, a.ID); err != nil {
		t.Fatalf("the build of an image still in the config went: %v", err)
	}
}

// TestOnceDoesEveryStepToCompletion: --once uploads, applies retention and
// deletes in one call, and reports a failure it met.
func TestOnceDoesEveryStepToCompletion(t *testing.T) {
	ctx := context.Background()
	r := newRig(t, strings.Replace(twoImages, "providers:", "builder:\n  keep-builds: 1\n  keep-uploads: 1\nproviders:", 1))
	old := r.build("img-a")
	if err := r.b.Once(ctx); err != nil {
		t.Fatal(err)
	}
	if ups := r.uploads(store.UploadFilter{BuildID: old.ID, State: store.Ready}); len(ups) != 1 {
		t.Fatalf("uploads after --once: %+v", ups)
	}
	newer := r.build("img-a")
	if err := r.b.Once(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := r.st.Build(ctx, old.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the older build outlived keep-builds 1 after --once: %v", err)
	}
	if images, _ := r.clouds["pa"].count(); images != 1 || len(r.uploads(store.UploadFilter{BuildID: newer.ID, State: store.Ready})) != 1 {
		t.Fatalf("pa holds %d images; uploads %+v", images, r.uploads(store.UploadFilter{}))
	}
	// A build whose file is gone fails its upload; --once says so.
	broken := r.build("img-b")
	os.Remove(mustPath(r.st.FilePath("img-b", broken.ID, "raw")))
	if err := r.b.Once(ctx); err == nil || !strings.Contains(err.Error(), "open image file") {
		t.Fatalf("--once with a failing upload: %v", err)
	}
}

// TestStopInterruptsUploadsWithinTheGrace: stopping the daemon interrupts an
// upload under way, which is no failure: its half-made image is deleted, and
// its record goes back to what it was before the attempt (none for a first
// attempt; the failed record of the last real attempt for a retry), or, when
// the cloud does not answer, the stop still ends within the clean-up grace and
// the upload is recorded failed with its image, which the next start deletes.
// None counts as an attempt, and the next start makes the upload at once.
func TestStopInterruptsUploadsWithinTheGrace(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name        string
		hang, retry bool
	}{
		{name: "first attempt"},
		{name: "retry", retry: true},
		{name: "cloud hangs", hang: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, twoImages)
			r.clouds["pa"].hold()
			a := r.build("img-a")
			var before store.Upload
			if tc.retry {
				// A real failure before: the retry is due at once.
				var err error
				if before, err = r.st.CreateUpload(ctx, &a, "pa", "raw"); err != nil {
					t.Fatal(err)
				}
				before.SetState(store.Failed, r.st.Now().Add(-time.Hour))
				before.LastError, before.NextAttempt = "glance said no", r.st.Now().Add(-time.Minute)
				if err := r.raw.Write(ctx, store.PutUpload(&before)); err != nil {
					t.Fatal(err)
				}
			}
			stop := r.run()
			select {
			case <-r.clouds["pa"].started:
			case <-time.After(10 * time.Second):
				t.Fatal("the upload to pa did not start")
			}
			r.clouds["pa"].hangDeletes = tc.hang
			began := time.Now()
			stop()
			if took := time.Since(began); took > 5*time.Second {
				t.Fatalf("the stop took %s; the clean-up grace is 500ms", took)
			}
			ups := r.uploads(store.UploadFilter{BuildID: a.ID})
			images, _ := r.clouds["pa"].count()
			switch {
			case tc.hang:
				// Failed with its image, for the lifecycle to delete: not
				// uploading, which nothing does any more.
				if images != 1 || len(ups) != 1 || ups[0].State != store.Failed || ups[0].ExternalID == "" || ups[0].Attempts != 0 {
					t.Fatalf("after a stop whose delete hung: %d images in pa, uploads %+v; want the image, and the upload failed with it, no attempt counted", images, ups)
				}
			case tc.retry:
				if images != 0 || len(ups) != 1 || ups[0].ID != before.ID || ups[0].State != store.Failed ||
					ups[0].Attempts != before.Attempts || ups[0].LastError != before.LastError || !ups[0].StateTime.Equal(before.StateTime) ||
					ups[0].NextAttempt.After(r.st.Now()) {
					t.Fatalf("after the stop: %d images in pa, uploads %+v; want none, and the upload as its last real attempt left it, %+v, due now", images, ups, before)
				}
			default:
				if images != 0 || len(ups) != 0 {
					t.Fatalf("after the stop: %d images in pa, uploads %+v; want none: a stop is not a failed upload", images, ups)
				}
			}
			// The next start makes it at once.
			r.clouds["pa"].hangDeletes = false
			r.clouds["pa"].release()
			if err := r.b.Once(ctx); err != nil {
				t.Fatal(err)
			}
			ups = r.uploads(store.UploadFilter{BuildID: a.ID})
			want := 1
			if tc.retry {
				want = before.Attempts + 1
			}
			if images, _ := r.clouds["pa"].count(); images != 1 || len(ups) != 1 || ups[0].State != store.Ready || ups[0].Attempts != want {
				t.Fatalf("after the next run: %d images, uploads %+v; want one ready after %d attempts", images, ups, want)
			}
		})
	}
}

// listingCloud is a gated cloud whose listing opens its gate: its uploads
// wait for a leak sweep to list it.
type listingCloud struct{ *gatedCloud }

func (c listingCloud) List(ctx context.Context, match map[string]string) ([]uploader.CloudImage, error) {
	c.release()
	return c.gatedCloud.List(ctx, match)
}

// TestOnceSweepsMeanwhile: --once runs the leak sweep beside its steps, not
// after them: the sweep waits on the clouds' listings, the steps on the state
// and the sources, and --once takes the longer of the two, not their sum.
// Here an upload waits for the sweep to list its cloud: a sweep that came
// only after the uploads would never come.
func TestOnceSweepsMeanwhile(t *testing.T) {
	pa := newGatedCloud()
	r := newRig(t, twoImages, func(o *Options) {
		o.OpenCloud = func(_ context.Context, p *config.Provider) (uploader.Cloud, error) {
			if p.Name == "pa" {
				return listingCloud{pa}, nil
			}
			return newGatedCloud(), nil
		}
	})
	pa.hold()
	bd := r.build("img-a")
	done := make(chan error, 1)
	go func() { done <- r.b.Once(context.Background()) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		pa.release()
		<-done
		t.Fatal("--once did not end within 30s: its upload waited for a leak sweep that had not listed the cloud")
	}
	if ups := r.uploads(store.UploadFilter{BuildID: bd.ID, State: store.Ready}); len(ups) != 1 {
		t.Fatalf("ready uploads of %s after --once: %+v, want one", bd.ID, ups)
	}
}

// TestFailedUploadIsLoggedOnce: a failed upload is logged once, by the
// daemon's dispatcher that handles the uploader's error.
func TestFailedUploadIsLoggedOnce(t *testing.T) {
	logs := &logBuffer{}
	r := newRig(t, twoImages, func(o *Options) {
		o.Logger = slog.New(slog.NewTextHandler(logs, nil))
		o.RetryBase = time.Hour // one attempt while the test looks
	})
	r.clouds["pa"].uploadErr = errors.New("quota exceeded")
	r.build("img-a")
	stop := r.run()
	testenv.WaitFor(t, 10*time.Second, "the dispatcher to log the failure", func() bool {
		return logs.count(`level=ERROR msg="upload failed"`) > 0
	}, logs.String)
	stop() // and nothing is left to log it again
	if n := logs.count(`msg="upload failed"`); n != 1 {
		t.Errorf("the failed upload is logged %d times, want once:\n%s", n, logs.String())
	}
	if ups := r.uploads(store.UploadFilter{Provider: "pa"}); len(ups) != 1 || ups[0].State != store.Failed {
		t.Errorf("uploads to pa: %+v; want one, failed", ups)
	}
}
