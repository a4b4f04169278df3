package uploader_test

import (
	"bytes"
	"crypto/md5"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/internal/benchkit"
	"github.com/nodepool-builder/nodepool-builder/internal/follow"
	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/uploader"
	"github.com/nodepool-builder/nodepool-builder/uploader/openstack"
)

// artifactServer serves an image as a Zuul build's artifact, with a
// Content-Length as object stores answer (Glance's web-download fails
// without one), and counts its GETs.
type artifactServer struct {
	*httptest.Server
	gets atomic.Int32
}

func newArtifactServer(t *testing.T, data []byte) *artifactServer {
	t.Helper()
	a := &artifactServer{}
	a.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			a.gets.Add(1)
		}
		if r.URL.Path != "/image.raw" {
			http.NotFound(w, r)
			return
		}
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(data))
	}))
	t.Cleanup(a.Close)
	return a
}

// webSetup is a provider "web" of raw images whose upload-method is
// web-download, its cloud a real Glance behind Keystone that takes the
// import methods given, an artifact server that holds the image, and a
// building build of debian.
type webSetup struct {
	glanceSetup
	cloud    *openstack.Cloud
	art      *artifactServer
	up       *uploader.Uploader
	logs     *bytes.Buffer
	build    store.Build
	declared store.File
}

func newWebSetup(t *testing.T, cloud *openstack.Cloud) *webSetup {
	t.Helper()
	s := &webSetup{glanceSetup: newGlanceSetup(t, "web", "import", 2*time.Minute, 2), cloud: cloud, logs: &bytes.Buffer{}}
	s.cfg.Builder.Providers = map[string]config.BuilderProvider{"web": {Name: "web", UploadMethod: config.UploadWebDownload}}
	path := filepath.Join(t.TempDir(), "image.raw")
	benchkit.WriteDiskImage(t, path, 4<<20)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m, h := md5.Sum(data), sha256.Sum256(data)
	s.declared = store.File{Format: "raw", Size: int64(len(data)), MD5: hex.EncodeToString(m[:]), SHA256: hex.EncodeToString(h[:])}
	s.art = newArtifactServer(t, data)
	s.up = uploader.New(uploader.Options{Store: s.st, Config: s.cfg, Clouds: map[string]uploader.Cloud{"web": cloud},
		PollInterval: 100 * time.Millisecond, RetryBase: time.Hour, CleanupGrace: 30 * time.Second,
		Logger: slog.New(slog.NewTextHandler(s.logs, nil))})
	if s.build, err = s.st.CreateBuild(t.Context(), store.Build{Image: "debian", Source: store.SourceZuul}); err != nil {
		t.Fatal(err)
	}
	return s
}

// ready records the build ready with its raw format at url, never
// downloaded, as the poller records a format only clouds that fetch it
// themselves need.
func (s *webSetup) ready(t *testing.T, url string) {
	t.Helper()
	f := s.declared
	f.URL, f.Present = url, false
	s.build.SetFile(f)
	if err := s.raw.SetBuildState(t.Context(), &s.build, store.Ready, ""); err != nil {
		t.Fatal(err)
	}
}

// job is the one upload the uploader plans.
func (s *webSetup) job(t *testing.T) uploader.Planned {
	t.Helper()
	jobs, err := s.up.Plan(t.Context())
	if err != nil || len(jobs) != 1 {
		t.Fatalf("plan: %v, %v; want one job", jobs, err)
	}
	return jobs[0]
}

// upload is the build's one upload record.
func (s *webSetup) upload(t *testing.T) store.Upload {
	t.Helper()
	ups, err := s.st.Uploads(t.Context(), store.UploadFilter{BuildID: s.build.ID})
	if err != nil || len(ups) != 1 {
		t.Fatalf("uploads of the build: %+v, %v; want one", ups, err)
	}
	return ups[0]
}

// images are the images of the build in the cloud.
func (s *webSetup) images(t *testing.T) []uploader.CloudImage {
	t.Helper()
	imgs, err := s.cloud.List(t.Context(), map[string]string{uploader.PropBuildID: s.build.ID})
	if err != nil {
		t.Fatal(err)
	}
	return imgs
}

// TestWebDownload: a provider whose upload-method is web-download has its
// cloud fetch a Zuul build's artifact itself, as the build is fetched or
// later from the URL the build records: the builder reads nothing of it,
// and what the cloud stored is checked against what the artifact declares.
// An import the cloud fails, and a fetch that is not what was declared, are
// failed uploads, their images deleted.
func TestWebDownload(t *testing.T) {
	cloud := importGlance(t, testenv.GlanceImportOptions{Methods: []string{"glance-direct", "web-download"}})

	t.Run("as the build is fetched", func(t *testing.T) {
		s := newWebSetup(t, cloud)
		url := s.art.URL + "/image.raw"
		src := follow.New()
		streams, download := s.up.Stream(t.Context(), s.build, uploader.Artifact{Declared: s.declared, URL: url}, src)
		if streams == nil || download {
			t.Fatalf("Stream = %v, download %v; want the cloud fetching the artifact, nothing downloaded", streams, download)
		}
		testenv.WaitFor(t, time.Minute, "the fetched image active", func() bool {
			imgs := s.images(t)
			return len(imgs) == 1 && imgs[0].Status == "active"
		}, s.logs.String)
		if up := s.upload(t); up.State != store.Uploading {
			t.Fatalf("upload before its build is ready: %+v; want uploading", up)
		}
		s.ready(t, url)
		streams.Settle(true, nil)
		streams.Wait()
		if err := streams.Err(); err != nil {
			t.Fatal(err)
		}
		up := s.upload(t)
		img, err := cloud.Get(t.Context(), up.ExternalID)
		if up.State != store.Ready || err != nil || img.Checksum != s.declared.MD5 || img.Size != s.declared.Size {
			t.Fatalf("upload %+v, image %+v, %v; want ready, the declared md5 and size", up, img, err)
		}
		if img.Properties["owner_specified.openstack.sha256"] != s.declared.SHA256 {
			t.Errorf("the image is tagged %q; want the declared sha256", img.Properties["owner_specified.openstack.sha256"])
		}
		if n := s.art.gets.Load(); n < 1 {
			t.Errorf("the artifact was fetched %d times; want the cloud's fetch", n)
		}
		if !strings.Contains(s.logs.String(), "from=url method=web-download") {
			t.Errorf("no upload started from the URL by web-download in the log:\n%s", s.logs.String())
		}
	})

	t.Run("later, from the URL the build records", func(t *testing.T) {
		s := newWebSetup(t, cloud)
		s.ready(t, s.art.URL+"/image.raw")
		up, err := s.up.Upload(t.Context(), s.job(t)) // of the format never downloaded
		if err != nil || up.State != store.Ready {
			t.Fatalf("upload: %+v, %v; want ready", up, err)
		}
		if n := s.art.gets.Load(); n < 1 {
			t.Errorf("the artifact was fetched %d times; want the cloud's fetch", n)
		}
	})

	t.Run("not what was declared", func(t *testing.T) {
		s := newWebSetup(t, cloud)
		s.declared.MD5 = strings.Repeat("0", 32)
		s.ready(t, s.art.URL+"/image.raw")
		up, err := s.up.Upload(t.Context(), s.job(t))
		if err == nil || !strings.Contains(err.Error(), "not the one declared") {
			t.Fatalf("upload of an artifact that is not what it declares: %v", err)
		}
		if up.State != store.Failed || up.ExternalID != "" {
			t.Fatalf("the upload: %+v; want failed, its image deleted", up)
		}
		if imgs := s.images(t); len(imgs) != 0 {
			t.Fatalf("images left in Glance: %+v", imgs)
		}
	})

	t.Run("an import the cloud fails", func(t *testing.T) {
		s := newWebSetup(t, cloud)
		s.ready(t, s.art.URL+"/missing.raw")
		up, err := s.up.Upload(t.Context(), s.job(t))
		if err == nil || !strings.Contains(err.Error(), "import failed") {
			t.Fatalf("upload of a missing artifact: %v; want the cloud's import failed", err)
		}
		if up.State != store.Failed || up.ExternalID != "" || !strings.Contains(up.LastError, "import failed") {
			t.Fatalf("the upload: %+v; want failed with the cloud's reason, its image deleted", up)
		}
		if imgs := s.images(t); len(imgs) != 0 {
			t.Fatalf("images left in Glance: %+v", imgs)
		}
	})

	t.Run("a file on disk is sent", func(t *testing.T) {
		// The format was downloaded (another provider needed it): an upload
		// made once the build is fetched stages it, said once.
		s := newWebSetup(t, cloud)
		b := s.readyBuild(t, "", func(path string) error {
			return os.WriteFile(path, bytes.Repeat([]byte{7}, 1<<20), 0o644)
		})
		for range 2 {
			up, err := s.up.Upload(t.Context(), s.job(t))
			if err != nil || up.State != store.Ready {
				t.Fatalf("upload: %+v, %v; want ready", up, err)
			}
			if !strings.Contains(s.logs.String(), "method=glance-direct") {
				t.Errorf("the upload of a file on disk did not stage it:\n%s", s.logs.String())
			}
			// Uploaded again once deleted, as an image-delete would.
			if err := cloud.Delete(t.Context(), up.ExternalID); err != nil {
				t.Fatal(err)
			}
			if err := s.st.RemoveUpload(t.Context(), up); err != nil {
				t.Fatal(err)
			}
		}
		if n := strings.Count(s.logs.String(), "upload-method web-download not used"); n != 1 {
			t.Errorf("the fallback was said %d times; want once:\n%s", n, s.logs.String())
		}
		if n := s.art.gets.Load(); n != 0 {
			t.Errorf("the artifact was fetched %d times; the build %s has its file", n, b.ID)
		}
	})
}

// TestWebDownloadNotOffered: a cloud that does not offer web-download is
// sent the file: the build's format is downloaded for it, its upload
// follows the download by glance-direct, and why is said.
func TestWebDownloadNotOffered(t *testing.T) {
	cloud := importGlance(t, testenv.GlanceImportOptions{Methods: []string{"glance-direct"}})
	s := newWebSetup(t, cloud)
	src := follow.New()
	a := uploader.Artifact{Declared: s.declared, URL: s.art.URL + "/image.raw"}
	streams, download := s.up.Stream(t.Context(), s.build, a, src)
	if streams == nil || !download {
		t.Fatalf("Stream = %v, download %v; want the format downloaded, its upload following the download", streams, download)
	}
	testenv.WaitFor(t, time.Minute, "the upload to begin", func() bool { return len(s.images(t)) == 1 }, s.logs.String)
	streams.Settle(false, errors.New("the test ends the build"))
	streams.Wait()
	for _, want := range []string{"upload-method web-download not used", `does not offer the image import method \"web-download\"`,
		"from=download method=glance-direct"} {
		if !strings.Contains(s.logs.String(), want) {
			t.Errorf("the log does not say %q:\n%s", want, s.logs.String())
		}
	}
	if n := s.art.gets.Load(); n != 0 {
		t.Errorf("the artifact was fetched %d times; want none", n)
	}
	if imgs := s.images(t); len(imgs) != 0 {
		t.Fatalf("images left in Glance: %+v", imgs)
	}
}
