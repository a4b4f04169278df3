package uploader_test

import (
	"crypto/md5"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/store/storetest"
)

// glanceSetup is what the tests and the bench that upload to a real Glance
// share: a store in a fresh images-dir and a config with one zuul-image,
// debian, uploaded as raw to one provider.
type glanceSetup struct {
	st  *store.Store
	raw storetest.Raw // writes the records a test sets up
	cfg *config.Config
}

// newGlanceSetup opens the store, closed when the test ends, and makes the
// config: provider on cloud, each upload bounded by timeout and tried attempts
// times.
func newGlanceSetup(tb testing.TB, provider, cloud string, timeout time.Duration, attempts int) glanceSetup {
	tb.Helper()
	images := filepath.Join(tb.TempDir(), "images")
	if err := os.Mkdir(images, 0o755); err != nil {
		tb.Fatal(err)
	}
	st, raw := storetest.Open(tb, store.Options{ImagesDir: images})
	tb.Cleanup(func() { st.Close() })
	return glanceSetup{st: st, raw: raw, cfg: &config.Config{
		ImagesDir:  images,
		ZuulImages: []config.ZuulImage{{Name: "debian"}},
		Providers: []config.Provider{{Name: provider, Cloud: cloud, ImageFormat: "raw", ImageUploadTimeout: timeout,
			DiskImages: []config.ProviderImage{{Name: "debian"}}}},
		Builder: config.Builder{UploadWorkers: 1, KeepBuilds: 2, KeepUploads: 2, UploadAttempts: attempts},
	}}
}

// readyBuild records a ready build of debian whose raw file put writes, with
// the file's size and md5: sum when given (a bench that links one image into
// every build knows it), else read from the file.
func (s glanceSetup) readyBuild(tb testing.TB, sum string, put func(path string) error) store.Build {
	tb.Helper()
	ctx := tb.Context()
	b, err := s.st.CreateBuild(ctx, store.Build{Image: "debian", Source: store.SourceZuul})
	if err != nil {
		tb.Fatal(err)
	}
	path := mustPath(s.st.FilePath("debian", b.ID, "raw"))
	if err := put(path); err != nil {
		tb.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		tb.Fatal(err)
	}
	if sum == "" {
		sum = fileMD5(tb, path)
	}
	b.SetFile(store.File{Format: "raw", Size: fi.Size(), MD5: sum, Present: true})
	if err := s.raw.SetBuildState(ctx, &b, store.Ready, ""); err != nil {
		tb.Fatal(err)
	}
	return b
}

// fileMD5 returns the md5 of a file, as the build record holds it.
func fileMD5(tb testing.TB, path string) string {
	tb.Helper()
	f, err := os.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	h := md5.New()
	if _, err := io.Copy(h, f); err != nil {
		tb.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}
