package dib

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/diskimage"
	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/uploader"
	"github.com/nodepool-builder/nodepool-builder/uploader/openstack"
)

// TestRealBuildAndUpload builds a debian-minimal qcow2 with the real
// diskimage-builder, the way nodepool runs it, and uploads it to a real Glance.
// It takes a few minutes: debootstrap fetches Debian from the mirror.
//
// The image is a bare filesystem, without the vm element's partition table and
// boot loader: partitioning needs device-mapper (kpartx), which the kernels of
// build containers often lack.
func TestRealBuildAndUpload(t *testing.T) {
	if testing.Short() && os.Getenv("CI") != "true" {
		t.Skip("a real DIB build takes minutes")
	}
	for _, bin := range []string{"disk-image-create", "sudo", "qemu-img"} {
		testenv.RequireBinary(t, bin)
	}
	if os.Geteuid() != 0 {
		// DIB mounts, chroots and loop-mounts through sudo; without root it would ask for a password.
		testenv.Unavailable(t, "a real DIB build needs root")
	}
	g := testenv.NewGlance(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Minute)
	defer cancel()

	dir := t.TempDir()
	images := filepath.Join(dir, "images")
	logs := filepath.Join(dir, "logs")
	// The host is Debian 12; a debootstrap that knows bookworm builds it.
	text := `
images-dir: ` + images + `
build-log-dir: ` + logs + `
diskimages:
  - name: debian-bookworm
    elements: [debian-minimal]
    release: bookworm
    build-timeout: 1800
    env-vars:
      DIB_DEBIAN_SECURITY_MIRROR: http://deb.debian.org/debian-security
      DIB_DEBIAN_SECURITY_SUBPATH: -security
      # DIB shares its apt archives between builds on the host; apt-get of
      # another build running on it (another test run) holds their lock,
      # and fails this one with exit 100.
      DIB_APT_LOCAL_CACHE: "0"
providers:
  - name: glance
    cloud: ` + g.Cloud + `
    diskimages: [{name: debian-bookworm}]
`
	cfg, err := config.Parse("nodepool.yaml", []byte(text), nil)
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(ctx, store.Options{ImagesDir: images})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	logger := slog.New(slog.NewTextHandler(testWriter{t}, nil))

	b := inCore(New(Options{Store: st, Config: cfg, Logger: logger}), nil)
	if reason, err := b.Due(ctx, "debian-bookworm"); err != nil || reason != "no ready build" {
		t.Fatalf("due = %q, %v; want no ready build", reason, err)
	}
	if _, err := b.Step(ctx, "debian-bookworm"); err != nil {
		t.Fatalf("build: %v", err)
	}
	builds, err := st.Builds(ctx, store.BuildFilter{Image: "debian-bookworm", State: store.Ready})
	if err != nil || len(builds) != 1 {
		t.Fatalf("ready builds = %+v, %v; want one", builds, err)
	}
	bd := builds[0]
	file, ok := bd.File("qcow2")
	if !ok || len(file.SHA256) != 64 || len(file.MD5) != 32 || file.Size == 0 {
		t.Fatalf("qcow2 file = %+v, want checksums and a size", file)
	}
	path := mustPath(st.FilePath(bd.Image, bd.ID, "qcow2"))
	out, err := exec.CommandContext(ctx, "qemu-img", "info", "--output=json", path).Output()
	if err != nil {
		t.Fatalf("qemu-img info %s: %v", path, err)
	}
	var info struct {
		Format         string `json:"format"`
		FormatSpecific struct {
			Data struct {
				Compat string `json:"compat"`
			} `json:"data"`
		} `json:"format-specific"`
	}
	if err := json.Unmarshal(out, &info); err != nil {
		t.Fatalf("qemu-img info: %v\n%s", err, out)
	}
	if info.Format != "qcow2" || info.FormatSpecific.Data.Compat != "0.10" {
		t.Errorf("qemu-img info: format %q compat %q, want qcow2 0.10 (nodepool's --qemu-img-options)", info.Format, info.FormatSpecific.Data.Compat)
	}
	logData, err := os.ReadFile(diskimage.LogPath(logs, bd.Image, bd.ID))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(string(logData), "\nExit code: 0\n") {
		t.Errorf("build log does not end with Exit code: 0")
	}

	cloud, err := openstack.Open(ctx, openstack.Options{Cloud: g.Cloud, CloudsFile: g.CloudsFile, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	u := uploader.New(uploader.Options{
		Store:        st,
		Config:       cfg,
		Clouds:       map[string]uploader.Cloud{"glance": cloud},
		Logger:       logger,
		PollInterval: time.Second,
	})
	jobs, err := u.Plan(ctx)
	if err != nil || len(jobs) != 1 {
		t.Fatalf("plan = %+v, %v; want one upload", jobs, err)
	}
	if _, err := u.Upload(ctx, jobs[0]); err != nil {
		t.Fatalf("upload: %v", err)
	}
	ups, err := st.Uploads(ctx, store.UploadFilter{BuildID: bd.ID, Provider: "glance"})
	if err != nil || len(ups) != 1 || ups[0].State != store.Ready {
		t.Fatalf("uploads = %+v, %v; want one ready", ups, err)
	}
	img, err := cloud.Get(ctx, ups[0].ExternalID)
	if err != nil {
		t.Fatal(err)
	}
	if img.Status != "active" || img.DiskFormat != "qcow2" || img.Size != file.Size {
		t.Errorf("glance image = %s %s %d bytes; want active qcow2 of %d bytes", img.Status, img.DiskFormat, img.Size, file.Size)
	}
	if img.Properties["owner_specified.openstack.sha256"] != file.SHA256 {
		t.Errorf("glance image sha256 property = %q, want DIB's %s", img.Properties["owner_specified.openstack.sha256"], file.SHA256)
	}
}

// testWriter sends log lines to the test log, so a failed run shows its progress.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}
