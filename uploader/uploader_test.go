package uploader

import (
	"bytes"
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/metrics"
	"github.com/nodepool-builder/nodepool-builder/metrics/metricstest"
	"github.com/nodepool-builder/nodepool-builder/progress"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/store/storetest"
)

// fakeCloud is an in-memory image service with failure injection.
type fakeCloud struct {
	mu         sync.Mutex
	seq        int
	images     map[string]*CloudImage
	data       map[string][]byte
	failUpload int  // fail this many uploads
	neverReady bool // images stay "saving"
	failDelete bool
	// unreachable fails every call as a cloud that cannot be reached does.
	unreachable bool
	creates     int
	lists       int
	deletes     []string
	// sent, when set, is called once an upload's data has been read.
	sent func()
	// project is the project its credentials act for, which owns every image
	// it creates; "" as in a Glance without authentication.
	project string
}

func newFakeCloud() *fakeCloud {
	return &fakeCloud{images: map[string]*CloudImage{}, data: map[string][]byte{}}
}

var errUnreachable = fmt.Errorf("%w: connection refused", ErrUnavailable)

func (c *fakeCloud) Create(_ context.Context, spec ImageSpec) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.unreachable {
		return "", errUnreachable
	}
	c.seq++
	c.creates++
	id := fmt.Sprintf("00000000-0000-4000-8000-%012d", c.seq)
	props := map[string]string{}
	for k, v := range spec.Properties {
		props[k] = v
	}
	c.images[id] = &CloudImage{ID: id, Name: spec.Name, Status: "queued", DiskFormat: spec.DiskFormat, Properties: props,
		Created: time.Date(2026, 1, 1, 0, 0, c.seq, 0, time.UTC), Owner: c.project}
	return id, nil
}

func (c *fakeCloud) Upload(_ context.Context, id string, r io.Reader, size int64) error {
	data, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	if c.sent != nil {
		c.sent()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failUpload > 0 {
		c.failUpload--
		return errors.New("injected upload failure")
	}
	img, ok := c.images[id]
	if !ok {
		return ErrNotFound
	}
	if int64(len(data)) != size {
		return fmt.Errorf("got %d bytes, told %d", len(data), size)
	}
	c.data[id] = data
	sum := md5.Sum(data)
	img.Checksum = hex.EncodeToString(sum[:])
	img.Size = size
	if c.neverReady {
		img.Status = "saving"
	} else {
		img.Status = "active"
	}
	return nil
}

func (c *fakeCloud) Get(_ context.Context, id string) (CloudImage, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.unreachable {
		return CloudImage{}, errUnreachable
	}
	img, ok := c.images[id]
	if !ok {
		return CloudImage{}, fmt.Errorf("image %s: %w", id, ErrNotFound)
	}
	return *img, nil
}

func (c *fakeCloud) List(_ context.Context, match map[string]string) ([]CloudImage, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lists++
	if c.unreachable {
		return nil, errUnreachable
	}
	var out []CloudImage
	for _, img := range c.images {
		ok := true
		for k, v := range match {
			if img.Properties[k] != v {
				ok = false
			}
		}
		if ok {
			out = append(out, *img)
		}
	}
	return out, nil
}

func (c *fakeCloud) Delete(_ context.Context, id string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failDelete {
		return errors.New("injected delete failure")
	}
	delete(c.images, id)
	c.deletes = append(c.deletes, id)
	return nil
}

func (c *fakeCloud) Project(context.Context) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.unreachable {
		return "", errUnreachable
	}
	return c.project, nil
}

func (c *fakeCloud) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.images)
}

type fixture struct {
	t      *testing.T
	st     *store.Store
	raw    storetest.Raw // writes the records a test sets up
	cfg    *config.Config
	clouds map[string]*fakeCloud
	up     *Uploader
	clock  *storetest.Clock
	// metrics, when set before newUploader, is the uploader's.
	metrics *metrics.Metrics
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	dir := t.TempDir()
	f := &fixture{t: t, clock: storetest.NewClock()}
	// Every store write moves the clock on a second, so records are ordered.
	now := func() time.Time { return f.clock.Add(time.Second) }
	f.st, f.raw = storetest.Open(t, store.Options{ImagesDir: dir, Now: now})
	t.Cleanup(func() { f.st.Close() })
	f.cfg = &config.Config{
		ImagesDir:  dir,
		ZuulImages: []config.ZuulImage{{Name: "debian", Metadata: map[string]string{"os_distro": "debian"}}},
		Providers: []config.Provider{
			{Name: "a", ImageFormat: "qcow2", ImageNameFormat: "{image_name}-{upload_id}", ImageUploadTimeout: time.Minute,
				DiskImages: []config.ProviderImage{{Name: "debian", Meta: map[string]string{"hw_disk_bus": "scsi"}}}},
			{Name: "b", ImageFormat: "raw", ImageUploadTimeout: time.Minute,
				DiskImages: []config.ProviderImage{{Name: "debian"}}},
		},
		Builder: config.Builder{UploadWorkers: 4, KeepBuilds: 2, KeepUploads: 2, UploadAttempts: 3, LeakSweep: true},
	}
	f.clouds = map[string]*fakeCloud{"a": newFakeCloud(), "b": newFakeCloud()}
	f.newUploader()
	return f
}

func (f *fixture) newUploader() {
	clouds := map[string]Cloud{}
	for k, v := range f.clouds {
		clouds[k] = v
	}
	f.up = New(Options{Store: f.st, Config: f.cfg, Clouds: clouds, RetryBase: time.Millisecond,
		Logger:       slog.New(slog.NewTextHandler(f.t.Output(), nil)),
		PollInterval: time.Millisecond, Now: f.clock.Now, Metrics: f.metrics})
}

// addBuild writes a ready build with the given formats to the store.
func (f *fixture) addBuild(image string, formats ...string) store.Build {
	f.t.Helper()
	ctx := context.Background()
	b, err := f.st.CreateBuild(ctx, store.Build{Image: image, Source: store.SourceZuul})
	if err != nil {
		f.t.Fatal(err)
	}
	for _, format := range formats {
		data := []byte(b.ID + "/" + format)
		if err := os.WriteFile(mustPath(f.st.FilePath(image, b.ID, format)), data, 0o644); err != nil {
			f.t.Fatal(err)
		}
		sum := md5.Sum(data)
		b.SetFile(store.File{Format: format, MD5: hex.EncodeToString(sum[:]), SHA256: "s", Size: int64(len(data)), Present: true})
	}
	if err := f.raw.SetBuildState(ctx, &b, store.Ready, ""); err != nil {
		f.t.Fatal(err)
	}
	return b
}

// step is one pass as the builder core makes it, a second after the last, with
// every job run at once: plan, upload, drop uploaded files, retain, delete. It
// returns the failures.
func (f *fixture) step(ctx context.Context) error {
	f.clock.Add(time.Second)
	jobs, err := f.up.Plan(ctx)
	if err != nil {
		return err
	}
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for _, j := range jobs {
		wg.Go(func() {
			if _, err := f.up.Upload(ctx, j); err != nil && !errors.Is(err, ErrDropped) {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	errs = append(errs, f.up.DropUploaded(ctx), f.up.Retain(ctx), f.up.Delete(ctx))
	return errors.Join(errs...)
}

func (f *fixture) uploads(filter store.UploadFilter) []store.Upload {
	f.t.Helper()
	ups, err := f.st.Uploads(context.Background(), filter)
	if err != nil {
		f.t.Fatal(err)
	}
	return ups
}

// makeBuild makes a ready build through the store's build writer, as the
// builder's sources do: it is this builder's own, marked as such.
func (f *fixture) makeBuild(image, format string) store.Build {
	f.t.Helper()
	ctx := context.Background()
	w, err := f.st.BeginBuild(ctx, store.Build{Image: image, Source: store.SourceZuul})
	if err != nil {
		f.t.Fatal(err)
	}
	data := []byte(w.Build().ID + "/" + format)
	if err := os.WriteFile(mustPath(w.Temp(format)), data, 0o644); err != nil {
		f.t.Fatal(err)
	}
	sum := md5.Sum(data)
	if err := w.Add(store.File{Format: format, MD5: hex.EncodeToString(sum[:]), SHA256: "s", Size: int64(len(data))}); err != nil {
		f.t.Fatal(err)
	}
	b, err := w.Commit(ctx, nil)
	if err != nil {
		f.t.Fatal(err)
	}
	return b
}

// TestUploadDeletedElsewhereIsMadeAgainBounded: an upload of the builder's own
// build that another program deletes (a Python nodepool-builder whose
// nodepool.yaml lacks the image: its record and its cloud image go) is made
// again, with a warning, but only upload-attempts times: the deleter would
// delete each again. The next build is uploaded as ever.
func TestUploadDeletedElsewhereIsMadeAgainBounded(t *testing.T) {
	f := newFixture(t)
	var logs testenv.Buffer
	f.up.log = slog.New(slog.NewTextHandler(&logs, nil))
	ctx := context.Background()
	b := f.makeBuild("debian", "qcow2") // provider b takes raw: only a uploads it
	deleteElsewhere := func() {
		t.Helper()
		ups := f.uploads(store.UploadFilter{BuildID: b.ID, Provider: "a"})
		if len(ups) != 1 || ups[0].State != store.Ready {
			t.Fatalf("uploads of %s to a = %+v, want one ready", b.Name(), ups)
		}
		if err := f.clouds["a"].Delete(ctx, ups[0].ExternalID); err != nil {
			t.Fatal(err)
		}
		if err := f.raw.Write(ctx, store.DeleteUpload(ups[0])); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.step(ctx); err != nil {
		t.Fatal(err)
	}
	attempts := f.cfg.Builder.UploadAttempts
	for i := range attempts {
		deleteElsewhere()
		if err := f.step(ctx); err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(logs.String(), "uploading the build to this provider again"); n != i+1 {
			t.Fatalf("after %d deletes, %d warnings of an upload made again; want %d\n%s", i+1, n, i+1, logs.String())
		}
	}
	deleteElsewhere()
	for range 2 {
		if err := f.step(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if ups := f.uploads(store.UploadFilter{BuildID: b.ID, Provider: "a"}); len(ups) != 0 {
		t.Errorf("uploads after upload-attempts (%d) deletes = %+v, want none made", attempts, ups)
	}
	if n := strings.Count(logs.String(), "not uploading the build to this provider again"); n != 1 {
		t.Errorf("%d warnings that the build is not uploaded again, want one\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "does not declare the zuul-image") {
		t.Errorf("the warnings do not name the likely cause:\n%s", logs.String())
	}
	next := f.makeBuild("debian", "qcow2")
	if err := f.step(ctx); err != nil {
		t.Fatal(err)
	}
	if ups := f.uploads(store.UploadFilter{BuildID: next.ID, Provider: "a"}); len(ups) != 1 || ups[0].State != store.Ready {
		t.Errorf("uploads of the next build = %+v, want one ready", ups)
	}
}

func TestUploadEachProviderGetsItsFormat(t *testing.T) {
	f := newFixture(t)
	b := f.addBuild("debian", "qcow2", "raw")
	if err := f.step(context.Background()); err != nil {
		t.Fatal(err)
	}
	for provider, format := range map[string]string{"a": "qcow2", "b": "raw"} {
		ups := f.uploads(store.UploadFilter{Provider: provider})
		if len(ups) != 1 || ups[0].State != store.Ready || ups[0].Format != format || ups[0].BuildID != b.ID {
			t.Fatalf("%s uploads = %+v", provider, ups)
		}
		img, err := f.clouds[provider].Get(context.Background(), ups[0].ExternalID)
		if err != nil {
			t.Fatal(err)
		}
		if img.DiskFormat != format {
			t.Errorf("%s got disk_format %s", provider, img.DiskFormat)
		}
		if string(f.clouds[provider].data[img.ID]) != b.ID+"/"+format {
			t.Errorf("%s got the wrong file: %q", provider, f.clouds[provider].data[img.ID])
		}
		for k, want := range map[string]string{
			PropBuildID: b.ID, PropUploadID: "0000000001", PropProvider: provider,
			PropBuilderID: f.st.BuilderID(), "os_distro": "debian",
		} {
			if img.Properties[k] != want {
				t.Errorf("%s property %s = %q, want %q", provider, k, img.Properties[k], want)
			}
		}
		if _, ok := img.Properties["owner_specified.openstack.md5"]; !ok {
			t.Errorf("%s: no owner_specified.openstack.md5 property", provider)
		}
	}
	a := f.uploads(store.UploadFilter{Provider: "a"})[0]
	if a.ExternalName != "debian-0000000001" {
		t.Errorf("image-name-format not applied: %q", a.ExternalName)
	}
	img, _ := f.clouds["a"].Get(context.Background(), a.ExternalID)
	if img.Properties["hw_disk_bus"] != "scsi" {
		t.Errorf("provider meta missing: %v", img.Properties)
	}
	// Nothing new: a second step uploads nothing.
	if err := f.step(context.Background()); err != nil {
		t.Fatal(err)
	}
	if f.clouds["a"].creates != 1 || f.clouds["b"].creates != 1 {
		t.Fatalf("second step created images: a=%d b=%d", f.clouds["a"].creates, f.clouds["b"].creates)
	}
}

func TestUploadHasAProgressTask(t *testing.T) {
	f := newFixture(t)
	f.cfg.Providers = f.cfg.Providers[:1]
	delete(f.clouds, "b")
	tr := progress.NewTracker()
	f.newUploader()
	f.up.opts.Progress = tr
	var during []progress.Status
	f.clouds["a"].sent = func() { during = tr.Running() }
	b := f.addBuild("debian", "qcow2")
	if err := f.step(context.Background()); err != nil {
		t.Fatal(err)
	}
	file, _ := b.File("qcow2")
	if len(during) != 1 {
		t.Fatalf("tasks while the data was sent: %+v, want one", during)
	}
	if s := during[0]; s.Kind != progress.Upload || s.Subject != b.Name()+" to a" || s.Total != file.Size || s.Done != file.Size {
		t.Errorf("task = %+v, want an upload of %s to a with %d of %d bytes", s, b.Name(), file.Size, file.Size)
	}
	if run := tr.Running(); len(run) != 0 {
		t.Errorf("tasks after the upload: %+v, want none", run)
	}
}

func TestUploadRetriesOnLaterStepsThenSucceeds(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.up.opts.RetryBase = time.Hour
	f.addBuild("debian", "qcow2", "raw")
	f.clouds["a"].failUpload = 2
	err := f.step(ctx)
	if err == nil || !strings.Contains(err.Error(), "attempt 1 of 3") || !strings.Contains(err.Error(), "next try after") {
		t.Fatalf("first step: %v", err)
	}
	// The other provider was not held back.
	if b := f.uploads(store.UploadFilter{Provider: "b"}); len(b) != 1 || b[0].State != store.Ready {
		t.Fatalf("b uploads = %+v", b)
	}
	a := f.uploads(store.UploadFilter{Provider: "a"})
	if len(a) != 1 || a[0].State != store.Failed || a[0].Attempts != 1 || !a[0].NextAttempt.After(f.clock.Now()) {
		t.Fatalf("a after one failure = %+v", a)
	}
	// Before the backoff has passed, a step leaves it alone.
	creates := f.clouds["a"].creates
	if err := f.step(ctx); err != nil {
		t.Fatal(err)
	}
	if f.clouds["a"].creates != creates {
		t.Fatal("retried before the backoff passed")
	}
	f.clock.Add(time.Hour)
	if err := f.step(ctx); err == nil || !strings.Contains(err.Error(), "attempt 2 of 3") {
		t.Fatalf("second attempt: %v", err)
	}
	a = f.uploads(store.UploadFilter{Provider: "a"})
	if wait := a[0].NextAttempt.Sub(f.clock.Now()); wait < 90*time.Minute {
		t.Fatalf("backoff did not grow: next try in %s", wait)
	}
	f.clock.Add(3 * time.Hour)
	if err := f.step(ctx); err != nil {
		t.Fatal(err)
	}
	a = f.uploads(store.UploadFilter{Provider: "a"})
	if len(a) != 1 || a[0].State != store.Ready || a[0].Attempts != 3 || a[0].LastError != "" {
		t.Fatalf("a after the third attempt = %+v", a)
	}
	// The half-made images of the failed attempts were deleted.
	if n := f.clouds["a"].count(); n != 1 {
		t.Fatalf("cloud a holds %d images, want 1", n)
	}
}

func TestUploadGivesUpAndOtherProviderProceeds(t *testing.T) {
	f := newFixture(t)
	f.addBuild("debian", "qcow2", "raw")
	f.clouds["a"].failUpload = 100
	var err error
	for i := 0; i < 3; i++ {
		err = f.step(context.Background())
	}
	if err == nil || !strings.Contains(err.Error(), "injected upload failure") || !strings.Contains(err.Error(), "stays failed until the next build") {
		t.Fatalf("step error = %v", err)
	}
	a := f.uploads(store.UploadFilter{Provider: "a"})
	if len(a) != 1 || a[0].State != store.Failed || a[0].Attempts != 3 || !strings.Contains(a[0].LastError, "injected") {
		t.Fatalf("a uploads = %+v", a)
	}
	if f.clouds["a"].count() != 0 {
		t.Fatalf("failed uploads left %d images in the cloud", f.clouds["a"].count())
	}
	b := f.uploads(store.UploadFilter{Provider: "b"})
	if len(b) != 1 || b[0].State != store.Ready {
		t.Fatalf("b uploads = %+v", b)
	}
	// A failed upload stays failed until the next build.
	creates := f.clouds["a"].creates
	f.clock.Add(24 * time.Hour)
	f.step(context.Background())
	if f.clouds["a"].creates != creates {
		t.Fatal("an upload that used up its attempts was tried again")
	}
	f.clouds["a"].failUpload = 0
	f.addBuild("debian", "qcow2", "raw")
	if err := f.step(context.Background()); err != nil {
		t.Fatal(err)
	}
	ready := f.uploads(store.UploadFilter{Provider: "a", State: store.Ready})
	if len(ready) != 1 {
		t.Fatalf("new build not uploaded to a: %+v", f.uploads(store.UploadFilter{Provider: "a"}))
	}
}

func TestUploadTimeoutDeletesImage(t *testing.T) {
	f := newFixture(t)
	f.cfg.Providers[0].ImageUploadTimeout = 50 * time.Millisecond
	f.cfg.Builder.UploadAttempts = 1
	f.clouds["a"].neverReady = true
	f.addBuild("debian", "qcow2", "raw")
	err := f.step(context.Background())
	if err == nil || !strings.Contains(err.Error(), "image-upload-timeout") {
		t.Fatalf("step error = %v", err)
	}
	if f.clouds["a"].count() != 0 {
		t.Fatal("timed-out upload left its image in the cloud")
	}
}

func TestRotationKeepsNewest(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	var builds []store.Build
	for i := 0; i < 4; i++ {
		builds = append(builds, f.addBuild("debian", "qcow2", "raw"))
		if err := f.step(ctx); err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{"a", "b"} {
			if n := f.clouds[p].count(); n > 2 {
				t.Fatalf("after build %d provider %s holds %d images, keep-uploads is 2", i+1, p, n)
			}
		}
	}
	for _, p := range []string{"a", "b"} {
		ups := f.uploads(store.UploadFilter{Provider: p})
		if len(ups) != 2 || ups[0].BuildID != builds[3].ID || ups[1].BuildID != builds[2].ID {
			t.Fatalf("%s uploads = %+v", p, ups)
		}
	}
	left, err := f.st.Builds(ctx, store.BuildFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 2 {
		t.Fatalf("builds left = %d, want 2", len(left))
	}
	for _, old := range builds[:2] {
		if _, err := os.Stat(mustPath(f.st.FilePath("debian", old.ID, "qcow2"))); !os.IsNotExist(err) {
			t.Errorf("files of rotated build %s still on disk", old.ID)
		}
	}
}

func TestOldBuildLivesWhileItsUploadIsKept(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.cfg.Builder.KeepBuilds = 1
	old := f.addBuild("debian", "qcow2", "raw")
	if err := f.step(ctx); err != nil {
		t.Fatal(err)
	}
	f.addBuild("debian", "qcow2", "raw")
	if err := f.step(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := f.st.Build(ctx, old.ID); err != nil {
		t.Fatalf("old build removed while its uploads are kept: %v", err)
	}
}

func TestDeleteRetriesUntilCloudAgrees(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.cfg.Builder.KeepUploads, f.cfg.Builder.KeepBuilds = 1, 1
	old := f.addBuild("debian", "qcow2", "raw")
	f.step(ctx)
	f.addBuild("debian", "qcow2", "raw")
	f.clouds["a"].failDelete = true
	if err := f.step(ctx); err == nil {
		t.Fatal("a refused delete was not reported")
	}
	// Files go at once; the record waits for the cloud.
	if _, err := os.Stat(mustPath(f.st.FilePath("debian", old.ID, "qcow2"))); !os.IsNotExist(err) {
		t.Fatal("files of a deleting build still on disk")
	}
	if ups := f.uploads(store.UploadFilter{BuildID: old.ID, Provider: "a"}); len(ups) != 1 || ups[0].State != store.Deleting {
		t.Fatalf("old upload to a = %+v", ups)
	}
	f.clouds["a"].failDelete = false
	if err := f.step(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := f.st.Build(ctx, old.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("old build record: %v", err)
	}
	if f.clouds["a"].count() != 1 {
		t.Fatalf("cloud a holds %d images", f.clouds["a"].count())
	}
}

func TestImageRemovedFromProviderAndConfig(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	b := f.addBuild("debian", "qcow2", "raw")
	f.step(ctx)
	f.cfg.Providers[1].DiskImages = nil
	if err := f.step(ctx); err != nil {
		t.Fatal(err)
	}
	if f.clouds["b"].count() != 0 || len(f.uploads(store.UploadFilter{Provider: "b"})) != 0 {
		t.Fatal("uploads of an image a provider no longer lists were kept")
	}
	if f.clouds["a"].count() != 1 {
		t.Fatal("the other provider's upload went too")
	}
	f.cfg.ZuulImages = nil
	f.cfg.Providers[0].DiskImages = nil
	if err := f.step(ctx); err != nil {
		t.Fatal(err)
	}
	if f.clouds["a"].count() != 0 {
		t.Fatal("upload of an image removed from the config was kept")
	}
	if _, err := f.st.Build(ctx, b.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("build of removed image: %v", err)
	}
	if _, err := os.Stat(mustPath(f.st.FilePath("debian", b.ID, "raw"))); !os.IsNotExist(err) {
		t.Fatal("files of removed image still on disk")
	}
}

func TestPausedProviderEntryUploadsNothing(t *testing.T) {
	f := newFixture(t)
	f.cfg.Providers[0].DiskImages[0].Pause = true
	f.addBuild("debian", "qcow2", "raw")
	if err := f.step(context.Background()); err != nil {
		t.Fatal(err)
	}
	if f.clouds["a"].creates != 0 {
		t.Fatal("paused provider entry got an upload")
	}
	if f.clouds["b"].count() != 1 {
		t.Fatal("unpaused provider got no upload")
	}
}

func TestLeakSweepNeedsTwoSightings(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.cfg.Providers = f.cfg.Providers[:1]
	m, err := metrics.New(metrics.Options{})
	if err != nil {
		t.Fatal(err)
	}
	f.metrics = m
	f.newUploader()
	leaks := func() (found, deleted float64) {
		fams := metricstest.Scrape(t, m.Handler())
		found, _ = fams.Value("nodepool_builder_leaked_images_found_total", "provider", "a")
		deleted, _ = fams.Value("nodepool_builder_leaked_images_deleted_total", "provider", "a")
		return found, deleted
	}
	cloud := f.clouds["a"]
	ours, _ := cloud.Create(ctx, ImageSpec{Name: "leaked", Properties: map[string]string{PropBuilderID: f.st.BuilderID(), PropProvider: "a"}})
	// Another provider of ours on the same cloud: not a leak of a's.
	shared, _ := cloud.Create(ctx, ImageSpec{Name: "shared", Properties: map[string]string{PropBuilderID: f.st.BuilderID(), PropProvider: "b"}})
	theirs, _ := cloud.Create(ctx, ImageSpec{Name: "other", Properties: map[string]string{PropBuilderID: "someone-else"}})
	if err := f.up.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := cloud.Get(ctx, ours); err != nil {
		t.Fatal("leak deleted on first sighting")
	}
	if found, deleted := leaks(); found != 1 || deleted != 0 {
		t.Errorf("after the first sweep: %v leaks found, %v deleted; want 1, 0", found, deleted)
	}
	f.clock.Add(time.Minute)
	if err := f.up.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := cloud.Get(ctx, ours); !errors.Is(err, ErrNotFound) {
		t.Fatal("leak still there after the second sweep")
	}
	if found, deleted := leaks(); found != 1 || deleted != 1 {
		t.Errorf("after the second sweep: %v leaks found, %v deleted; want 1 (counted once), 1", found, deleted)
	}
	if _, err := cloud.Get(ctx, theirs); err != nil {
		t.Fatal("sweep deleted an image of another builder")
	}
	if _, err := cloud.Get(ctx, shared); err != nil {
		t.Fatal("sweep of provider a deleted an image of provider b on the same cloud")
	}
}

// TestLeakSweepListsASharedCloudOnce: providers that share a cloud client
// share one listing per sweep, and each still sweeps only its own images.
func TestLeakSweepListsASharedCloudOnce(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	cloud := f.clouds["a"]
	f.clouds["b"] = cloud
	f.newUploader()
	made := func(provider, builder string) string {
		id, err := cloud.Create(ctx, ImageSpec{Name: "leaked-" + provider,
			Properties: map[string]string{PropBuilderID: builder, PropProvider: provider}})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	ofA, ofB := made("a", f.st.BuilderID()), made("b", f.st.BuilderID())
	ofGone := made("c", f.st.BuilderID()) // a provider no longer in the config
	theirs := made("a", "someone-else")
	for range 2 {
		f.clock.Add(time.Minute)
		if err := f.up.Sweep(ctx); err != nil {
			t.Fatal(err)
		}
	}
	cloud.mu.Lock()
	lists := cloud.lists
	cloud.mu.Unlock()
	if lists != 2 {
		t.Errorf("the shared cloud was listed %d times over two sweeps, want 2", lists)
	}
	for _, id := range []string{ofA, ofB} {
		if _, err := cloud.Get(ctx, id); !errors.Is(err, ErrNotFound) {
			t.Errorf("leak %s still there after two sweeps: %v", id, err)
		}
	}
	for _, id := range []string{ofGone, theirs} {
		if _, err := cloud.Get(ctx, id); err != nil {
			t.Errorf("the sweep deleted %s, an image of no provider of this builder: %v", id, err)
		}
	}
}

// TestSweepKeepsTheLastImage: with the state lost, every image the builder made
// looks leaked; the sweep keeps the newest active one of each image in each
// provider until the store holds a ready upload there.
func TestSweepKeepsTheLastImage(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.cfg.Providers = f.cfg.Providers[:1]
	cloud := f.clouds["a"]
	made := func(name string, active bool) string {
		id, _ := cloud.Create(ctx, ImageSpec{Name: name, Properties: map[string]string{
			PropBuilderID: f.st.BuilderID(), PropProvider: "a", PropImage: "debian"}})
		if active {
			cloud.Upload(ctx, id, strings.NewReader("x"), 1)
		}
		return id
	}
	older, newer, half := made("debian-1", true), made("debian-2", true), made("debian-3", false)
	for range 2 {
		if err := f.up.Sweep(ctx); err != nil {
			t.Fatal(err)
		}
		f.clock.Add(time.Minute)
	}
	for id, want := range map[string]bool{older: false, newer: true, half: false} {
		if _, err := cloud.Get(ctx, id); (err == nil) != want {
			t.Errorf("image %s kept %v, want %v", id, err == nil, want)
		}
	}
	// Once the store has a ready upload of debian there, the last leak goes too.
	f.addBuild("debian", "qcow2")
	if err := f.step(ctx); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := f.up.Sweep(ctx); err != nil {
			t.Fatal(err)
		}
		f.clock.Add(time.Minute)
	}
	if _, err := cloud.Get(ctx, newer); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the kept image outlived a ready upload of its image: %v", err)
	}
	if n := cloud.count(); n != 1 {
		t.Fatalf("cloud a holds %d images, want the one ready upload", n)
	}
}

func TestRecoverInterruptedUploads(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	b := f.addBuild("debian", "qcow2", "raw")
	cloud := f.clouds["a"]
	// One upload finished in the cloud before the crash, one was half-made.
	done, _ := f.st.CreateUpload(ctx, &b, "a", "qcow2")
	half, _ := f.st.CreateUpload(ctx, &b, "b", "raw")
	file, _ := b.File("qcow2")
	id, _ := cloud.Create(ctx, ImageSpec{Name: "x", Properties: f.up.Properties(&f.cfg.Providers[0], b, file, done)})
	data, _ := os.ReadFile(mustPath(f.st.FilePath("debian", b.ID, "qcow2")))
	cloud.Upload(ctx, id, bytes.NewReader(data), int64(len(data)))
	hid, _ := f.clouds["b"].Create(ctx, ImageSpec{Name: "y", Properties: f.up.Properties(&f.cfg.Providers[1], b, store.File{}, half)})
	half.ExternalID = hid
	if err := f.raw.Write(ctx, store.PutUpload(&half)); err != nil {
		t.Fatal(err)
	}

	if err := f.up.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	got := f.uploads(store.UploadFilter{Provider: "a"})
	if got[0].State != store.Ready || got[0].ExternalID != id {
		t.Fatalf("finished upload not adopted: %+v", got)
	}
	got = f.uploads(store.UploadFilter{Provider: "b"})
	if got[0].State != store.Failed || f.clouds["b"].count() != 0 || !strings.Contains(got[0].LastError, "interrupted") {
		t.Fatalf("half-made upload not cleaned: %+v, %d images", got, f.clouds["b"].count())
	}
	// The interrupted upload is retried by the next step, at once.
	if err := f.step(ctx); err != nil {
		t.Fatal(err)
	}
	got = f.uploads(store.UploadFilter{Provider: "b"})
	if len(got) != 1 || got[0].State != store.Ready {
		t.Fatalf("interrupted upload not retried: %+v", got)
	}
}

// TestRecoverFindsAnotherBuildersImage: an interrupted upload whose image id
// was never recorded is found by build, upload and provider, also when the
// builder that made it (another host sharing the state) tagged it as its own.
func TestRecoverFindsAnotherBuildersImage(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	b := f.addBuild("debian", "qcow2")
	up, err := f.st.CreateUpload(ctx, &b, "a", "qcow2")
	if err != nil {
		t.Fatal(err)
	}
	props := f.up.Properties(&f.cfg.Providers[0], b, store.File{}, up)
	props[PropBuilderID] = "another-builder"
	if _, err := f.clouds["a"].Create(ctx, ImageSpec{Name: "half", Properties: props}); err != nil {
		t.Fatal(err)
	}
	if err := f.up.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if n := f.clouds["a"].count(); n != 0 {
		t.Fatalf("the half-made image of another builder's upload was left: %d images", n)
	}
	if got := f.uploads(store.UploadFilter{Provider: "a"}); got[0].State != store.Failed {
		t.Fatalf("interrupted upload = %+v, want failed", got)
	}
}

// TestRecoverRunsTheHookItMissed: an image that went active before a crash is
// ready only once the post-upload hook that never ran passes on it; one that
// fails the hook is deleted and uploaded again.
func TestRecoverRunsTheHookItMissed(t *testing.T) {
	for _, pass := range []bool{true, false} {
		t.Run(fmt.Sprintf("hook passes %v", pass), func(t *testing.T) {
			f := newFixture(t)
			ctx := context.Background()
			dir := t.TempDir()
			out := filepath.Join(dir, "args")
			code := map[bool]string{true: "0", false: "4"}[pass]
			hook := filepath.Join(dir, "hook")
			os.WriteFile(hook, []byte("#!/bin/sh\necho \"$@\" >> "+out+"\necho checked >&2\nexit "+code+"\n"), 0o755)
			f.cfg.Providers[0].PostUploadHook = hook
			b := f.addBuild("debian", "qcow2", "raw")
			up, _ := f.st.CreateUpload(ctx, &b, "a", "qcow2")
			file, _ := b.File("qcow2")
			id, _ := f.clouds["a"].Create(ctx, ImageSpec{Name: "x", Properties: f.up.Properties(&f.cfg.Providers[0], b, file, up)})
			data, _ := os.ReadFile(mustPath(f.st.FilePath("debian", b.ID, "qcow2")))
			f.clouds["a"].Upload(ctx, id, bytes.NewReader(data), int64(len(data)))
			up.ExternalID = id
			f.raw.Write(ctx, store.PutUpload(&up))

			err := f.up.Recover(ctx)
			got := f.uploads(store.UploadFilter{Provider: "a"})[0]
			args, _ := os.ReadFile(out)
			if want := "a " + id + " " + mustPath(f.st.FilePath("debian", b.ID, "qcow2")); strings.TrimSpace(string(args)) != want {
				t.Fatalf("hook ran with %q, want %q", args, want)
			}
			if pass {
				if err != nil || got.State != store.Ready || got.ExternalID != id {
					t.Fatalf("after a passing hook: %+v, %v", got, err)
				}
				return
			}
			if err != nil || got.State != store.Failed || !strings.Contains(got.LastError, "checked") {
				t.Fatalf("after a failing hook: %+v, %v", got, err)
			}
			if _, gerr := f.clouds["a"].Get(ctx, id); !errors.Is(gerr, ErrNotFound) {
				t.Fatal("the image that failed the hook is still in the cloud")
			}
		})
	}
}

// TestRecoverOnEveryPass: an upload whose cloud cannot be asked stays uploading
// and is settled by a later pass; one a worker is on is never touched.
func TestRecoverOnEveryPass(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	b := f.addBuild("debian", "qcow2", "raw")
	stuck, _ := f.st.CreateUpload(ctx, &b, "a", "qcow2")
	working, _ := f.st.CreateUpload(ctx, &b, "b", "raw")
	// A worker is on the upload to b: it holds its lock.
	held, err := f.st.TryLock(ctx, store.LockKey{Image: "debian", BuildID: b.ID, Provider: "b"})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	f.clouds["a"].unreachable = true
	if err := f.up.Recover(ctx); err == nil || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("recovery against an unreachable cloud: %v", err)
	}
	if got := f.uploads(store.UploadFilter{Provider: "a"})[0]; got.State != store.Uploading || got.Version != stuck.Version {
		t.Fatalf("upload changed while its cloud was unreachable: %+v", got)
	}
	f.clouds["a"].unreachable = false
	if err := f.up.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.uploads(store.UploadFilter{Provider: "a"})[0]; got.State != store.Failed {
		t.Fatalf("upload not settled once its cloud answered: %+v", got)
	}
	if got := f.uploads(store.UploadFilter{Provider: "b"})[0]; got.State != store.Uploading || got.Version != working.Version {
		t.Fatalf("recovery touched an upload a worker is on: %+v", got)
	}
}

// TestRecoverLeavesImagesNotOurs: uploading records that name cloud images not
// theirs (an operator's active image whose data is the build's file, another
// tool's queued image, an image of another project with the upload's own
// properties, an id that is no UUID) adopt none, delete none and run the
// post-upload-hook on none: each image stays, each record's is said once,
// and the records are failed without the ids, to be uploaded again.
func TestRecoverLeavesImagesNotOurs(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	dir := t.TempDir()
	calls := filepath.Join(dir, "calls")
	hook := filepath.Join(dir, "hook")
	if err := os.WriteFile(hook, []byte("#!/bin/sh\necho \"$@\" >> "+calls+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	f.cfg.Providers[0].PostUploadHook = hook
	var logs testenv.Buffer
	f.up = New(Options{Store: f.st, Config: f.cfg, Clouds: map[string]Cloud{"a": f.clouds["a"], "b": f.clouds["b"]},
		Logger: slog.New(slog.NewTextHandler(&logs, nil)), PollInterval: time.Millisecond, Now: f.clock.Now})
	cloud := f.clouds["a"]
	cloud.project = "the-builders-project"
	b := f.addBuild("debian", "qcow2")
	file, _ := b.File("qcow2")
	data, err := os.ReadFile(mustPath(f.st.FilePath("debian", b.ID, "qcow2")))
	if err != nil {
		t.Fatal(err)
	}
	golden, _ := cloud.Create(ctx, ImageSpec{Name: "golden", DiskFormat: "qcow2"})
	if err := cloud.Upload(ctx, golden, bytes.NewReader(data), int64(len(data))); err != nil {
		t.Fatal(err)
	}
	queued, _ := cloud.Create(ctx, ImageSpec{Name: "another-tools"})
	var names []string
	for _, id := range []string{golden, queued, "", golden + "?x"} {
		up, err := f.st.CreateUpload(ctx, &b, "a", "qcow2")
		if err != nil {
			t.Fatal(err)
		}
		if id == "" {
			// Of another project, with this upload's own properties.
			id, _ = cloud.Create(ctx, ImageSpec{Name: "theirs", Properties: f.up.Properties(&f.cfg.Providers[0], b, file, up)})
			cloud.Upload(ctx, id, bytes.NewReader(data), int64(len(data)))
			cloud.images[id].Owner = "another-project"
		}
		up.ExternalID = id
		if err := f.raw.Write(ctx, store.PutUpload(&up)); err != nil {
			t.Fatal(err)
		}
		names = append(names, id)
	}

	for range 2 {
		if err := f.up.Recover(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := cloud.count(); n != 3 || len(cloud.deletes) != 0 {
		t.Errorf("cloud holds %d images, deleted %v; want the 3 left", n, cloud.deletes)
	}
	if out, err := os.ReadFile(calls); err == nil {
		t.Errorf("the post-upload-hook ran: %q", out)
	}
	for _, up := range f.uploads(store.UploadFilter{Provider: "a"}) {
		if up.State != store.Failed || up.ExternalID != "" || !strings.Contains(up.LastError, "its record named was left in the cloud") {
			t.Errorf("upload %s: %s naming %q (%s); want failed naming none, saying why", up.ID, up.State, up.ExternalID, up.LastError)
		}
	}
	if n := strings.Count(logs.String(), "not adopting or deleting a cloud image that is not this upload's"); n != len(names) {
		t.Errorf("%d lines say an image is not the upload's, want one for each of %v:\n%s", n, names, logs.String())
	}
	if !strings.Contains(logs.String(), "another project's image") {
		t.Errorf("the log does not say which image is another project's:\n%s", logs.String())
	}
}

// TestJobFromAStalePlan: a job that waited for a worker reads the records again
// and does nothing when an operator released its upload or its build meanwhile.
func TestJobFromAStalePlan(t *testing.T) {
	ctx := context.Background()
	t.Run("image-delete of the failed upload it would retry", func(t *testing.T) {
		f := newFixture(t)
		f.cfg.Providers = f.cfg.Providers[:1]
		f.clouds["a"].failUpload = 1
		b := f.addBuild("debian", "qcow2")
		f.step(ctx)
		failed := f.uploads(store.UploadFilter{Provider: "a"})[0]
		f.clock.Add(time.Minute) // past the backoff
		jobs, err := f.up.Plan(ctx)
		if err != nil || len(jobs) != 1 || jobs[0].Retry == nil || jobs[0].Retry.ID != failed.ID {
			t.Fatalf("plan = %+v, %v; want a retry of %s", jobs, err, failed.ID)
		}
		if _, err := f.st.ReleaseUpload(ctx, b.ID, "a", failed.ID); err != nil {
			t.Fatal(err)
		}
		creates := f.clouds["a"].creates
		if _, err := f.up.Upload(ctx, jobs[0]); !errors.Is(err, ErrDropped) {
			t.Fatalf("stale job: %v, want ErrDropped", err)
		}
		if got := f.uploads(store.UploadFilter{Provider: "a"}); len(got) != 1 || got[0].State != store.Deleting {
			t.Fatalf("the release was overwritten: %+v", got)
		}
		if f.clouds["a"].creates != creates {
			t.Fatal("a dropped job created a cloud image")
		}
	})
	t.Run("dib-image-delete of the build it would upload", func(t *testing.T) {
		f := newFixture(t)
		b := f.addBuild("debian", "qcow2", "raw")
		jobs, err := f.up.Plan(ctx)
		if err != nil || len(jobs) != 2 {
			t.Fatalf("plan = %+v, %v", jobs, err)
		}
		if _, err := f.st.ReleaseBuild(ctx, b.ID, "dib-image-delete"); err != nil {
			t.Fatal(err)
		}
		for _, j := range jobs {
			if _, err := f.up.Upload(ctx, j); !errors.Is(err, ErrDropped) {
				t.Fatalf("job %s: %v, want ErrDropped", j, err)
			}
		}
		if n := len(f.uploads(store.UploadFilter{})); n != 0 {
			t.Fatalf("%d upload records made for a released build", n)
		}
		if f.clouds["a"].creates+f.clouds["b"].creates != 0 {
			t.Fatal("a released build was uploaded")
		}
	})
	t.Run("an upload already made", func(t *testing.T) {
		f := newFixture(t)
		f.addBuild("debian", "qcow2", "raw")
		jobs, _ := f.up.Plan(ctx)
		if err := f.step(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := f.up.Upload(ctx, jobs[0]); !errors.Is(err, ErrDropped) {
			t.Fatalf("duplicate job: %v, want ErrDropped", err)
		}
		if f.clouds["a"].creates != 1 {
			t.Fatalf("cloud a got %d creates, want 1", f.clouds["a"].creates)
		}
	})
}

// TestUnreachableCloudIsNotAnAttempt: a cloud that cannot be reached does not use
// up upload-attempts; the upload goes through once it answers.
func TestUnreachableCloudIsNotAnAttempt(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.cfg.Providers = f.cfg.Providers[:1]
	f.cfg.Builder.UploadAttempts = 2
	f.up.opts.RetryBase = time.Minute
	f.addBuild("debian", "qcow2")
	f.clouds["a"].unreachable = true
	for range 5 {
		err := f.step(ctx)
		if err == nil || !strings.Contains(err.Error(), "could not be reached") {
			t.Fatalf("step against an unreachable cloud: %v", err)
		}
		f.clock.Add(2 * time.Minute)
	}
	got := f.uploads(store.UploadFilter{Provider: "a"})
	if len(got) != 1 || got[0].State != store.Failed || got[0].Attempts != 0 {
		t.Fatalf("after five unreachable tries: %+v", got)
	}
	f.clouds["a"].unreachable = false
	if err := f.step(ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.uploads(store.UploadFilter{Provider: "a"}); got[0].State != store.Ready || got[0].Attempts != 1 {
		t.Fatalf("once the cloud answered: %+v", got)
	}
}

func TestPostUploadHook(t *testing.T) {
	f := newFixture(t)
	dir := t.TempDir()
	out := filepath.Join(dir, "args")
	hook := filepath.Join(dir, "hook")
	os.WriteFile(hook, []byte("#!/bin/sh\necho \"$@\" > "+out+"\nexit ${HOOK_EXIT:-0}\n"), 0o755)
	f.cfg.Providers[0].PostUploadHook = hook
	b := f.addBuild("debian", "qcow2", "raw")
	if err := f.step(context.Background()); err != nil {
		t.Fatal(err)
	}
	up := f.uploads(store.UploadFilter{Provider: "a"})[0]
	args, _ := os.ReadFile(out)
	want := "a " + up.ExternalID + " " + mustPath(f.st.FilePath("debian", b.ID, "qcow2"))
	if strings.TrimSpace(string(args)) != want {
		t.Fatalf("hook args = %q, want %q", args, want)
	}

	failing := filepath.Join(dir, "failing")
	os.WriteFile(failing, []byte("#!/bin/sh\necho image is bad >&2\nexit 3\n"), 0o755)
	f.cfg.Providers[0].PostUploadHook = failing
	f.addBuild("debian", "qcow2", "raw")
	err := f.step(context.Background())
	if err == nil || !strings.Contains(err.Error(), "image is bad") {
		t.Fatalf("failing hook: %v", err)
	}
	// Only the first build's image stays in cloud a: every failed attempt's image went.
	if n := f.clouds["a"].count(); n != 1 {
		t.Fatalf("cloud a holds %d images after failing hooks", n)
	}
}

func TestDeleteAfterUploadKeepsKeepFormats(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.cfg.ZuulImages = nil
	f.cfg.DiskImages = []config.DiskImage{{Name: "debian", DeleteAfterUpload: true, KeepFormats: []string{"qcow2"}}}
	b := f.addBuild("debian", "qcow2", "raw")
	f.clouds["b"].failUpload = 100
	f.step(ctx)
	// Not uploaded everywhere yet: nothing is removed.
	if _, err := os.Stat(mustPath(f.st.FilePath("debian", b.ID, "raw"))); err != nil {
		t.Fatal("file removed before every provider had its upload")
	}
	f.clouds["b"].failUpload = 0
	f.addBuild("debian", "qcow2", "raw") // a new build gets uploads everywhere
	if err := f.step(ctx); err != nil {
		t.Fatal(err)
	}
	newest, _ := f.st.Builds(ctx, store.BuildFilter{Image: "debian", State: store.Ready})
	nb := newest[0]
	if _, err := os.Stat(mustPath(f.st.FilePath("debian", nb.ID, "raw"))); !os.IsNotExist(err) {
		t.Fatal("raw kept after upload to every provider")
	}
	if _, err := os.Stat(mustPath(f.st.FilePath("debian", nb.ID, "qcow2"))); err != nil {
		t.Fatal("a keep-formats file was removed")
	}
	if got := strings.Join(nb.Formats(), ","); got != "qcow2" {
		t.Fatalf("formats on disk = %s", got)
	}
	// The removed format still counts as uploaded: nothing is uploaded again.
	creates := f.clouds["b"].creates
	if err := f.step(ctx); err != nil {
		t.Fatal(err)
	}
	if f.clouds["b"].creates != creates {
		t.Fatal("a build whose file was removed after upload was uploaded again")
	}
}

func TestDeletingBuildTakesLateUploadsWithIt(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	b := f.addBuild("debian", "qcow2", "raw")
	if err := f.step(ctx); err != nil {
		t.Fatal(err)
	}
	// The build was released while its uploads were under way; they finished ready.
	b, _ = f.st.Build(ctx, b.ID)
	if err := f.raw.SetBuildState(ctx, &b, store.Deleting, "test"); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := f.up.Delete(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.st.Build(ctx, b.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("build still recorded: %v", err)
	}
	if f.clouds["a"].count()+f.clouds["b"].count() != 0 {
		t.Fatal("uploads of the deleted build left in the clouds")
	}
}

// TestAnotherBuildersDeletingBuild: with a shared state, the uploads of another
// builder's deleting build are deleted here, but its record stays for that
// builder, which removes its files first.
func TestAnotherBuildersDeletingBuild(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	b := f.addBuild("debian", "qcow2", "raw")
	if err := f.step(ctx); err != nil {
		t.Fatal(err)
	}
	b, _ = f.st.Build(ctx, b.ID)
	b.BuilderID = "another-builder"
	b.SetState(store.Deleting, f.st.Now())
	if err := f.raw.Write(ctx, store.PutBuild(&b)); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := f.up.Delete(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if f.clouds["a"].count()+f.clouds["b"].count() != 0 {
		t.Fatal("uploads of the deleting build left in the clouds")
	}
	if ups := f.uploads(store.UploadFilter{BuildID: b.ID}); len(ups) != 0 {
		t.Fatalf("upload records left: %+v", ups)
	}
	got, err := f.st.Build(ctx, b.ID)
	if err != nil || got.State != store.Deleting {
		t.Fatalf("another builder's build = %+v, %v; want its record left deleting", got, err)
	}
	if _, err := os.Stat(mustPath(f.st.FilePath("debian", b.ID, "qcow2"))); err != nil {
		t.Fatalf("files in this images-dir of a build recorded as another's were removed: %v", err)
	}
}

// TestAskedUploadRetriesAtOnce: an upload an operator asks for is tried now,
// even after upload-attempts were used up, and reports its progress.
func TestAskedUploadRetriesAtOnce(t *testing.T) {
	f := newFixture(t)
	var mu sync.Mutex
	var sent []int64
	f.up.opts.OnSent = func(j Planned, n, total int64) {
		mu.Lock()
		defer mu.Unlock()
		if j.Provider == "a" && total > 0 {
			sent = append(sent, n)
		}
	}
	b := f.addBuild("debian", "qcow2", "raw")
	f.clouds["a"].failUpload = 100
	for range 3 {
		f.step(context.Background())
	}
	failed := f.uploads(store.UploadFilter{Provider: "a"})
	if len(failed) != 1 || failed[0].State != store.Failed || failed[0].Attempts != 3 {
		t.Fatalf("a uploads = %+v, want one failed after 3 attempts", failed)
	}
	f.clouds["a"].failUpload = 0
	// The plan leaves it failed; a job that was asked for takes it up again.
	if jobs, _ := f.up.Plan(context.Background()); slices.ContainsFunc(jobs, func(j Planned) bool { return j.Provider == "a" }) {
		t.Fatalf("plan after attempts used up = %+v, want no job for a", jobs)
	}
	up, err := f.up.Upload(context.Background(), Planned{Build: b, Provider: "a", Format: "qcow2", Asked: true})
	if err != nil || up.State != store.Ready || up.ID != failed[0].ID || up.Attempts != 4 {
		t.Fatalf("asked upload = %+v, %v; want upload %s ready on attempt 4", up, err, failed[0].ID)
	}
	mu.Lock()
	defer mu.Unlock()
	size, _ := b.File("qcow2")
	if len(sent) == 0 || sent[len(sent)-1] != size.Size {
		t.Errorf("progress reported %v, want it to end at %d bytes", sent, size.Size)
	}
}

// TestUploadStatsdNames: an upload that becomes ready sends nodepool's
// image_update timer and counter to a real UDP socket; a failed one sends
// nothing, as in nodepool.
func TestUploadStatsdNames(t *testing.T) {
	f := newFixture(t)
	sd := testenv.NewStatsd(t)
	m, err := metrics.New(metrics.Options{Getenv: sd.Getenv("")})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	f.metrics = m
	f.newUploader()
	f.clouds["b"].failUpload = 1
	f.addBuild("debian", "qcow2", "raw")
	if err := f.step(context.Background()); err == nil {
		t.Fatal("the upload to b did not fail")
	}
	want := []string{"nodepool.image_update.debian.a:*", "nodepool.image_update.debian.a:1|c"}
	got := sd.Wait(t, 5*time.Second, want...)
	if extra := sd.Quiet(200 * time.Millisecond); len(got) != 2 || len(extra) > 0 {
		t.Fatalf("statsd lines = %q then %q, want only %q", got, extra, want)
	}
	for _, l := range got {
		if strings.HasSuffix(l, "|c") {
			continue
		}
		ms, ok := strings.CutSuffix(strings.TrimPrefix(l, "nodepool.image_update.debian.a:"), "|ms")
		if _, err := strconv.Atoi(ms); !ok || err != nil {
			t.Errorf("timer line %q: want <ms>|ms", l)
		}
	}
}

// TestInterruptedUploadIsNoFailure: an upload whose context ends (the builder
// stops, the config drops it, its lock is lost) deletes its half-made image and
// leaves no failed record, no used attempt and no failure in the metrics; it
// says it is due work not done; the next step makes it at once.
func TestInterruptedUploadIsNoFailure(t *testing.T) {
	f := newFixture(t)
	m, err := metrics.New(metrics.Options{})
	if err != nil {
		t.Fatal(err)
	}
	f.metrics = m
	f.newUploader()
	b := f.addBuild("debian", "qcow2", "raw")
	jobs, err := f.up.Plan(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var job Planned
	for _, j := range jobs {
		if j.Provider == "a" {
			job = j
		}
	}
	// Glance takes the data but never makes the image active: the stop comes
	// while the upload waits for it.
	cloud := f.clouds["a"]
	cloud.neverReady = true
	ctx, cancel := context.WithCancel(context.Background())
	cloud.sent = cancel
	_, err = f.up.Upload(ctx, job)
	var nd interface{ NotDone() }
	if !errors.As(err, &nd) || !strings.Contains(err.Error(), "interrupted") {
		t.Fatalf("Upload = %v, want an interruption, due work not done", err)
	}
	if ups := f.uploads(store.UploadFilter{BuildID: b.ID, Provider: "a"}); len(ups) != 0 {
		t.Fatalf("uploads after the interruption: %+v; want none", ups)
	}
	if cloud.count() != 0 || cloud.creates != 1 {
		t.Fatalf("cloud a holds %d images after %d creates; want the half-made one deleted", cloud.count(), cloud.creates)
	}
	fams := metricstest.Scrape(t, m.Handler())
	for _, reason := range []string{"cancelled", "other", "cloud", "timeout"} {
		if v, ok := fams.Value("nodepool_builder_failures_total", "step", "upload", "reason", reason); ok && v != 0 {
			t.Errorf("failures_total{step=upload,reason=%s} = %v after an interrupted upload, want none", reason, v)
		}
	}
	if v, ok := fams.Value("nodepool_builder_upload_duration_seconds", "image", "debian", "provider", "a", "state", "failed"); ok && v != 0 {
		t.Errorf("an interrupted upload counts as %v failed upload attempts", v)
	}

	cloud.neverReady, cloud.sent = false, nil
	if err := f.step(context.Background()); err != nil {
		t.Fatal(err)
	}
	ups := f.uploads(store.UploadFilter{BuildID: b.ID, Provider: "a"})
	if len(ups) != 1 || ups[0].State != store.Ready || ups[0].Attempts != 1 {
		t.Fatalf("uploads after the next step: %+v; want one ready at its first attempt", ups)
	}
}

// TestPostUploadHookOutputBoundedAndRedacted: a failed hook's output is kept as
// the upload's reason only as its last whole lines, at most hookOutputMax bytes,
// saying it was cut, and without secrets: neither the values of variables, HTTP
// headers and openstack's flags that name one nor the userinfo of URLs,
// wherever in what is kept they are.
func TestPostUploadHookOutputBoundedAndRedacted(t *testing.T) {
	const (
		password = "hunter2-e8a1"
		early    = "early-secret-0c3f" // printed first, then cut away
	)
	f := newFixture(t)
	dir := t.TempDir()
	hook := filepath.Join(dir, "hook")
	script := "#!/bin/sh\n" +
		"echo OS_PASSWORD=" + early + "\n" +
		"i=0; while [ $i -lt 2000 ]; do echo \"checking block $i of the image\"; i=$((i+1)); done\n" +
		"echo OS_PASSWORD=" + password + "\n" +
		"echo 'clouds: {c: {auth: {password: " + password + "}}}'\n" +
		"echo export ZUUL_AUTH_TOKEN=" + password + "\n" +
		"echo fetched https://ci:" + password + "@mirror.example.org/debian\n" +
		"echo '> Authorization: Bearer " + password + "'\n" +
		"echo '+ openstack --os-password " + password + " image set x'\n" +
		"echo '+ openstack --os-application-credential-secret " + password + " image list'\n" +
		"echo image is bad >&2\nexit 3\n"
	os.WriteFile(hook, []byte(script), 0o755)
	f.cfg.Providers[0].PostUploadHook = hook
	f.addBuild("debian", "qcow2", "raw")
	err := f.step(context.Background())
	if err == nil || !strings.Contains(err.Error(), "image is bad") {
		t.Fatalf("failing hook: %v", err)
	}
	reason := f.uploads(store.UploadFilter{Provider: "a"})[0].LastError
	for _, want := range []string{"post-upload-hook " + hook + ": exit status 3: output cut to its last ", "checking block 1999 of the image",
		"OS_PASSWORD=REDACTED", "password: REDACTED", "ZUUL_AUTH_TOKEN=REDACTED", "fetched https://mirror.example.org/debian",
		"> Authorization: REDACTED", "+ openstack --os-password REDACTED", "--os-application-credential-secret REDACTED", "image is bad"} {
		if !strings.Contains(reason, want) {
			t.Errorf("the reason does not say %q:\n%s", want, reason)
		}
	}
	for _, secret := range []string{password, early} {
		if strings.Contains(reason, secret) || strings.Contains(err.Error(), secret) {
			t.Errorf("%q shows in the reason or the error:\n%s", secret, reason)
		}
	}
	if len(reason) > hookOutputMax+200 {
		t.Errorf("the reason holds %d bytes, want about %d at most", len(reason), hookOutputMax)
	}
	if out := reason[strings.Index(reason, "bytes: ")+len("bytes: "):]; !strings.HasPrefix(out, "checking block ") {
		t.Errorf("the kept output does not begin with a whole line: %.60q", out)
	}
}

// TestHookOutputTail: what tail keeps of output of any length and however it
// is written: all of a short one, the last whole lines of a long one, and
// never more than twice its bound in memory.
func TestHookOutputTail(t *testing.T) {
	lines := func(from, to int) []string { // 10 bytes each
		var out []string
		for i := from; i < to; i++ {
			out = append(out, fmt.Sprintf("line %04d\n", i))
		}
		return out
	}
	tests := []struct {
		name   string
		writes []string
		want   string
	}{
		{"nothing", nil, ""},
		{"blank", []string{"\n \n"}, ""},
		{"short", []string{"a\n", "b"}, ": a\nb"},
		{"exactly the bound", []string{strings.Repeat("x", 99) + "\n"}, ": " + strings.Repeat("x", 99)},
		{"cut to whole lines", lines(0, 50), ": output cut to its last 90 of 500 bytes: " + strings.TrimSpace(strings.Join(lines(41, 50), ""))},
		{"one long line", []string{strings.Repeat("y", 1000)}, ": its output of 1000 bytes is not shown: the last 100 hold no whole line"},
		{"a large write", []string{"first\n", strings.Repeat("z", 500) + "\nlast"}, ": output cut to its last 4 of 511 bytes: last"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tl := &tail{max: 100}
			for _, w := range tt.writes {
				if n, err := tl.Write([]byte(w)); n != len(w) || err != nil {
					t.Fatalf("Write = %d, %v", n, err)
				}
				if len(tl.buf) > 2*tl.max {
					t.Fatalf("tail holds %d bytes, more than twice its bound", len(tl.buf))
				}
			}
			if got := tl.shown(); got != tt.want {
				t.Errorf("shown() =\n  %q, want\n  %q", got, tt.want)
			}
		})
	}
}

// TestPostUploadHookEnvironment: the hook gets the documented allowlist of the
// daemon's environment and nothing else: no cloud password or token, nor any
// other variable the daemon was started with.
func TestPostUploadHookEnvironment(t *testing.T) {
	kept := map[string]string{
		"HOME": "/home/nodepool", "USER": "nodepool", "LOGNAME": "nodepool", "LANG": "C.UTF-8", "LANGUAGE": "en",
		"LC_TIME": "C", "TZ": "UTC", "TMPDIR": t.TempDir(), "https_proxy": "http://proxy.example.com:3128",
		"NO_PROXY": "localhost", "SSL_CERT_FILE": "/etc/ssl/ca.pem", "OS_CLIENT_CONFIG_FILE": "/etc/openstack/clouds.yaml",
		"OS_CLOUD": "c1", "XDG_CONFIG_HOME": "/etc/nodepool-xdg",
	}
	dropped := map[string]string{
		"OS_PASSWORD": "hunter2", "OS_TOKEN": "tok", "OS_APPLICATION_CREDENTIAL_SECRET": "acs",
		"ZUUL_AUTH_TOKEN": "zt", "NODEPOOL_MQTT_PASSWORD": "mp", "AWS_SECRET_ACCESS_KEY": "aws", "GEARMAN_NOTE": "x",
	}
	for k, v := range kept {
		t.Setenv(k, v)
	}
	for k, v := range dropped {
		t.Setenv(k, v)
	}
	f := newFixture(t)
	dir := t.TempDir()
	out := filepath.Join(dir, "env")
	hook := filepath.Join(dir, "hook")
	os.WriteFile(hook, []byte("#!/bin/sh\nenv > "+out+"\n"), 0o755)
	f.cfg.Providers[0].PostUploadHook = hook
	f.addBuild("debian", "qcow2", "raw")
	if err := f.step(context.Background()); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatalf("the hook did not run: %v", err)
	}
	env := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		k, v, _ := strings.Cut(line, "=")
		env[k] = v
	}
	kept["PATH"] = os.Getenv("PATH")
	for k, v := range kept {
		if env[k] != v {
			t.Errorf("the hook's %s = %q, want %q", k, env[k], v)
		}
	}
	for k := range dropped {
		if v, ok := env[k]; ok {
			t.Errorf("the hook got %s=%s", k, v)
		}
	}
}
