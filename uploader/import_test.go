package uploader_test

import (
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/internal/benchkit"
	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/uploader"
	"github.com/nodepool-builder/nodepool-builder/uploader/openstack"
)

// importGlance opens a Glance behind the shared Keystone that takes images by
// import as opts says, through an account of its own.
func importGlance(t *testing.T, opts testenv.GlanceImportOptions) *openstack.Cloud {
	t.Helper()
	ks := testenv.SharedKeystone(t)
	g := testenv.NewGlanceWithImport(t, ks, opts)
	a := ks.NewAccount(t)
	clouds := filepath.Join(t.TempDir(), "clouds.yaml")
	if err := os.WriteFile(clouds, []byte("clouds:\n"+ks.CloudEntry("import", g.Endpoint, a)), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := openstack.Open(t.Context(), openstack.Options{Cloud: "import", CloudsFile: clouds})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// importUpload uploads a ready build of debian in format, whose file put
// writes, to a provider of cloud whose upload-method is glance-direct.
func importUpload(t *testing.T, cloud *openstack.Cloud, format string, put func(path string) error) (store.Upload, error) {
	t.Helper()
	setup := newGlanceSetup(t, "cloud", "import", 2*time.Minute, 1)
	setup.cfg.Providers[0].ImageFormat = format
	setup.cfg.Builder.Providers = map[string]config.BuilderProvider{
		"cloud": {Name: "cloud", UploadMethod: config.UploadGlanceDirect}}
	b, err := setup.st.CreateBuild(t.Context(), store.Build{Image: "debian", Source: store.SourceZuul})
	if err != nil {
		t.Fatal(err)
	}
	path := mustPath(setup.st.FilePath("debian", b.ID, format))
	if err := put(path); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	b.SetFile(store.File{Format: format, Size: fi.Size(), MD5: fileMD5(t, path), Present: true})
	if err := setup.raw.SetBuildState(t.Context(), &b, store.Ready, ""); err != nil {
		t.Fatal(err)
	}
	up := uploader.New(uploader.Options{Store: setup.st, Config: setup.cfg, Clouds: map[string]uploader.Cloud{"cloud": cloud},
		PollInterval: 100 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	jobs, err := up.Plan(t.Context())
	if err != nil || len(jobs) != 1 {
		t.Fatalf("plan: %v, %v; want one job", jobs, err)
	}
	return up.Upload(t.Context(), jobs[0])
}

// TestUploadByGlanceDirect: a provider whose upload-method is glance-direct
// stages the file and has Glance import it: as it is, or converted where the
// cloud converts on import; an import Glance fails is an upload failed with
// Glance's words, its image deleted.
func TestUploadByGlanceDirect(t *testing.T) {
	qemuImg := testenv.RequireBinary(t, "qemu-img")
	cloud := importGlance(t, testenv.GlanceImportOptions{Methods: []string{"glance-direct"}, Convert: "raw"})
	raw := filepath.Join(t.TempDir(), "disk.raw")
	benchkit.WriteDiskImage(t, raw, 4<<20)

	t.Run("raw", func(t *testing.T) {
		rec, err := importUpload(t, cloud, "raw", func(path string) error {
			data, err := os.ReadFile(raw)
			if err != nil {
				return err
			}
			return os.WriteFile(path, data, 0o644)
		})
		if err != nil {
			t.Fatal(err)
		}
		img, err := cloud.Get(t.Context(), rec.ExternalID)
		if err != nil || img.Status != "active" || img.DiskFormat != "raw" || img.Checksum != fileMD5(t, raw) {
			t.Fatalf("the imported image: %+v, %v; want active raw, the file's md5", img, err)
		}
	})
	t.Run("qcow2 converted to raw", func(t *testing.T) {
		rec, err := importUpload(t, cloud, "qcow2", func(path string) error {
			out, err := exec.Command(qemuImg, "convert", "-f", "raw", "-O", "qcow2", raw, path).CombinedOutput()
			if err != nil {
				return fmt.Errorf("%v: %s", err, out)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		img, err := cloud.Get(t.Context(), rec.ExternalID)
		if err != nil || img.Status != "active" || img.DiskFormat != "raw" || img.Checksum != fileMD5(t, raw) {
			t.Fatalf("the imported image: %+v, %v; want it active, converted to the raw disk", img, err)
		}
	})
	t.Run("a qcow2 Glance cannot convert", func(t *testing.T) {
		rec, err := importUpload(t, cloud, "qcow2", func(path string) error {
			// A qcow2 header, and then nothing it describes.
			return os.WriteFile(path, append([]byte("QFI\xfb\x00\x00\x00\x03"), make([]byte, 1<<20)...), 0o644)
		})
		if err == nil || !strings.Contains(err.Error(), "import failed") || !strings.Contains(err.Error(), "Glance's import task") {
			t.Fatalf("the upload of a qcow2 Glance cannot convert: %v; want the import failed, in Glance's words", err)
		}
		if rec.State != store.Failed || rec.ExternalID != "" {
			t.Fatalf("the failed upload: %+v; want failed, its image deleted", rec)
		}
		imgs, err := cloud.List(t.Context(), map[string]string{uploader.PropUploadID: rec.ID, uploader.PropBuildID: rec.BuildID})
		if err != nil || len(imgs) != 0 {
			t.Fatalf("images of the failed upload left in Glance: %+v, %v", imgs, err)
		}
	})
}

// TestUploadByAnImportTheCloudDoesNotOffer: an upload-method the cloud does
// not offer fails the upload before any image is made, naming what it offers.
func TestUploadByAnImportTheCloudDoesNotOffer(t *testing.T) {
	cloud := importGlance(t, testenv.GlanceImportOptions{Methods: []string{"web-download"}})
	rec, err := importUpload(t, cloud, "raw", func(path string) error {
		benchkit.WriteDiskImage(t, path, 1<<20)
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), `does not offer the image import method "glance-direct": it offers web-download`) {
		t.Fatalf("an upload by a method the cloud does not offer: %v", err)
	}
	if rec.State != store.Failed || rec.ExternalID != "" {
		t.Fatalf("the upload: %+v; want failed, no image made", rec)
	}
	imgs, err := cloud.List(t.Context(), nil)
	if err != nil || len(imgs) != 0 {
		t.Fatalf("images made in a cloud that does not offer the method: %+v, %v", imgs, err)
	}
}
