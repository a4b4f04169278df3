package uploader_test

import (
	"context"
	"crypto/md5"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/internal/benchkit"
	"github.com/nodepool-builder/nodepool-builder/internal/follow"
	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/progress"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/uploader"
	"github.com/nodepool-builder/nodepool-builder/uploader/openstack"
)

// streamSetup is a real Glance reached by two providers, fast and slow: slow
// through a proxy whose rate a test may cut, so that it stalls; and a
// building build of debian whose raw file a test writes as a download does.
type streamSetup struct {
	glanceSetup
	g        *testenv.Glance
	proxy    *testenv.Proxy
	clouds   map[string]uploader.Cloud
	tracker  *progress.Tracker
	up       *uploader.Uploader
	build    store.Build
	image    string // the image the "download" writes
	path     string // where it writes it
	declared store.File
}

func newStreamSetup(t *testing.T, size int64, slowTimeout time.Duration) *streamSetup {
	t.Helper()
	g := testenv.NewGlance(t)
	ctx := t.Context()
	s := &streamSetup{g: g, glanceSetup: newGlanceSetup(t, "fast", g.Cloud, time.Minute, 3)}
	s.cfg.Providers = append(s.cfg.Providers, config.Provider{Name: "slow", Cloud: g.Cloud, ImageFormat: "raw",
		ImageUploadTimeout: slowTimeout, DiskImages: []config.ProviderImage{{Name: "debian"}}})
	fast, err := openstack.Open(ctx, openstack.Options{Cloud: g.Cloud, CloudsFile: g.CloudsFile})
	if err != nil {
		t.Fatal(err)
	}
	u, _ := strings.CutPrefix(g.Endpoint, "http://")
	s.proxy = testenv.NewProxy(t, u)
	var d net.Dialer
	viaProxy := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return d.DialContext(ctx, network, s.proxy.Addr)
	}}}
	slow, err := openstack.Open(ctx, openstack.Options{Cloud: g.Cloud, CloudsFile: g.CloudsFile, HTTPClient: viaProxy})
	if err != nil {
		t.Fatal(err)
	}
	s.clouds = map[string]uploader.Cloud{"fast": fast, "slow": slow}
	s.tracker = progress.NewTracker()
	s.up = uploader.New(uploader.Options{Store: s.st, Config: s.cfg, Clouds: s.clouds, Progress: s.tracker,
		PollInterval: 50 * time.Millisecond, RetryBase: time.Hour, CleanupGrace: 30 * time.Second,
		Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if s.build, err = s.st.CreateBuild(ctx, store.Build{Image: "debian", Source: store.SourceZuul}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	s.image, s.path = filepath.Join(dir, "image.raw"), filepath.Join(dir, "download.raw")
	benchkit.WriteDiskImage(t, s.image, size)
	data, err := os.ReadFile(s.image)
	if err != nil {
		t.Fatal(err)
	}
	m, h := md5.Sum(data), sha256.Sum256(data)
	s.declared = store.File{Format: "raw", Size: size, MD5: hex.EncodeToString(m[:]), SHA256: hex.EncodeToString(h[:])}
	return s
}

// write copies the image's bytes [from, to) into the download, telling src.
func (s *streamSetup) write(t *testing.T, src *follow.File, from, to int64) {
	t.Helper()
	in, err := os.Open(s.image)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(s.path, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if from == 0 {
		if err := src.Start(s.path, 0); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]byte, 1<<20)
	for pos := from; pos < to; {
		n, err := in.ReadAt(buf[:min(int64(len(buf)), to-pos)], pos)
		if n > 0 {
			if _, err := out.WriteAt(buf[:n], pos); err != nil {
				t.Fatal(err)
			}
			pos += int64(n)
			src.Written(pos)
		}
		if err != nil && err != io.EOF {
			t.Fatal(err)
		}
	}
}

// sent is how many bytes the upload to provider has sent, -1 when it does
// not run.
func (s *streamSetup) sent(provider string) int64 {
	for _, st := range s.tracker.Running() {
		if st.Kind == progress.Upload && strings.HasSuffix(st.Subject, " to "+provider) {
			return st.Done
		}
	}
	return -1
}

// uploads are the build's upload records, by provider.
func (s *streamSetup) uploads(t *testing.T) map[string]store.Upload {
	t.Helper()
	ups, err := s.st.Uploads(t.Context(), store.UploadFilter{BuildID: s.build.ID})
	if err != nil {
		t.Fatal(err)
	}
	byProvider := map[string]store.Upload{}
	for _, up := range ups {
		byProvider[up.Provider] = up
	}
	return byProvider
}

// images are the build's images in Glance.
func (s *streamSetup) images(t *testing.T) []uploader.CloudImage {
	t.Helper()
	imgs, err := s.clouds["fast"].List(t.Context(), map[string]string{uploader.PropBuildID: s.build.ID})
	if err != nil {
		t.Fatal(err)
	}
	return imgs
}

// TestStreamFollowsTheDownload: the uploads of a build being downloaded start
// with the download, each provider's at its own pace from the file on disk;
// none completes before the download is verified (Glance holds every image
// saving, the file's end held back), and they turn ready, with Glance's
// checksum the file's, only once the build is.
func TestStreamFollowsTheDownload(t *testing.T) {
	const size = 24 << 20
	s := newStreamSetup(t, size, time.Minute)
	ctx := t.Context()
	src := follow.New()
	streams, _ := s.up.Stream(ctx, s.build, uploader.Artifact{Declared: s.declared}, src)
	if streams == nil {
		t.Fatal("no uploads started for two providers that take the format")
	}
	// A third of the file: both uploads send it, but for what is held back at
	// the end of what is written, before any more is written.
	s.write(t, src, 0, size/3)
	testenv.WaitFor(t, 30*time.Second, "both uploads sending the first third", func() bool {
		return s.sent("fast") == size/3-follow.HoldBack && s.sent("slow") == size/3-follow.HoldBack
	})
	s.write(t, src, size/3, size)
	testenv.WaitFor(t, 30*time.Second, "both uploads at the held-back end", func() bool {
		return s.sent("fast") == size-follow.HoldBack && s.sent("slow") == size-follow.HoldBack
	})
	for _, img := range s.images(t) {
		if img.Status == "active" {
			t.Fatalf("image %s is active before the download was verified", img.ID)
		}
	}
	for p, up := range s.uploads(t) {
		if up.State != store.Uploading || up.ExternalID == "" {
			t.Fatalf("upload to %s before the download was verified: %+v; want uploading, its image recorded", p, up)
		}
	}
	verified := s.declared
	verified.Present = true
	streams.Verified(verified)
	// Active, but not ready before the build is.
	testenv.WaitFor(t, 30*time.Second, "both images active", func() bool {
		imgs := s.images(t)
		return len(imgs) == 2 && imgs[0].Status == "active" && imgs[1].Status == "active"
	})
	for p, up := range s.uploads(t) {
		if up.State != store.Uploading {
			t.Fatalf("upload to %s is %s before its build is ready", p, up.State)
		}
	}
	b := s.build
	b.SetFile(verified)
	if err := s.raw.SetBuildState(ctx, &b, store.Ready, ""); err != nil {
		t.Fatal(err)
	}
	streams.Settle(true, nil)
	streams.Wait()
	if err := streams.Err(); err != nil {
		t.Fatal(err)
	}
	ups := s.uploads(t)
	for _, p := range []string{"fast", "slow"} {
		up := ups[p]
		if up.State != store.Ready {
			t.Fatalf("upload to %s: %+v; want ready", p, up)
		}
		img, err := s.clouds[p].Get(ctx, up.ExternalID)
		if err != nil || img.Status != "active" || img.Checksum != s.declared.MD5 || img.Size != size {
			t.Fatalf("image of the upload to %s: %+v, %v; want active, %d bytes of md5 %s", p, img, err, size, s.declared.MD5)
		}
		if img.Properties["owner_specified.openstack.sha256"] != s.declared.SHA256 {
			t.Errorf("image of the upload to %s is tagged %q; want the declared sha256", p, img.Properties["owner_specified.openstack.sha256"])
		}
	}
}

// TestStreamOfAFailedBuild: a download that turns out not to match its
// checksum fails the build; the uploads that followed it are cut before
// their end, their images deleted, and nothing is recorded of them, though
// all but the held-back end was sent.
func TestStreamOfAFailedBuild(t *testing.T) {
	const size = 8 << 20
	s := newStreamSetup(t, size, time.Minute)
	src := follow.New()
	streams, _ := s.up.Stream(t.Context(), s.build, uploader.Artifact{Declared: s.declared}, src)
	s.write(t, src, 0, size)
	testenv.WaitFor(t, 30*time.Second, "both uploads at the held-back end", func() bool {
		return s.sent("fast") == size-follow.HoldBack && s.sent("slow") == size-follow.HoldBack
	})
	if n := len(s.images(t)); n != 2 {
		t.Fatalf("%d images in Glance while the uploads run; want 2", n)
	}
	streams.Settle(false, errors.New("sha256 expected 00, got 11"))
	streams.Wait()
	if err := streams.Err(); err != nil {
		t.Errorf("the uploads of a failed build report %v; want no failed upload", err)
	}
	if ups := s.uploads(t); len(ups) != 0 {
		t.Errorf("upload records of a failed build: %+v; want none", ups)
	}
	if imgs := s.images(t); len(imgs) != 0 {
		t.Errorf("images of a failed build left in Glance: %+v", imgs)
	}
}

// TestStreamWithAStalledProvider: a provider that stalls holds up neither
// the download nor the other provider, which turns ready; the stalled one
// fails at its image-upload-timeout, its image deleted, and is retried later
// from the file.
func TestStreamWithAStalledProvider(t *testing.T) {
	// More than the socket buffers between the uploader and the stalled
	// Glance hold.
	const size = 32 << 20
	s := newStreamSetup(t, size, 10*time.Second)
	ctx := t.Context()
	src := follow.New()
	streams, _ := s.up.Stream(ctx, s.build, uploader.Artifact{Declared: s.declared}, src)
	testenv.WaitFor(t, 30*time.Second, "both uploads started", func() bool {
		return s.sent("fast") >= 0 && s.sent("slow") >= 0
	})
	s.proxy.SetRate(16 << 10)
	s.write(t, src, 0, size) // the writer never waits for a reader
	verified := s.declared
	verified.Present = true
	streams.Verified(verified)
	b := s.build
	b.SetFile(verified)
	if err := s.raw.SetBuildState(ctx, &b, store.Ready, ""); err != nil {
		t.Fatal(err)
	}
	streams.Settle(true, nil)
	testenv.WaitFor(t, 30*time.Second, "the fast upload ready", func() bool {
		return s.uploads(t)["fast"].State == store.Ready
	})
	if slow := s.uploads(t)["slow"]; slow.State != store.Uploading || s.sent("slow") >= size-follow.HoldBack {
		t.Fatalf("the stalled upload when the fast one was ready: %+v, %d bytes sent; want it still under way, behind",
			slow, s.sent("slow"))
	}
	streams.Wait()
	err := streams.Err()
	if err == nil || !strings.Contains(err.Error(), "image-upload-timeout") {
		t.Fatalf("the stalled upload ended with %v; want its image-upload-timeout", err)
	}
	slow := s.uploads(t)["slow"]
	if slow.State != store.Failed || slow.ExternalID != "" || !slow.NextAttempt.After(time.Now()) {
		t.Fatalf("the stalled upload: %+v; want failed, its image deleted, to be retried later", slow)
	}
	if imgs := s.images(t); len(imgs) != 1 {
		t.Fatalf("%d images in Glance; want the fast upload's alone", len(imgs))
	}
}
