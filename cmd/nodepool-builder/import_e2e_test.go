package main

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/uploader"
	"github.com/nodepool-builder/nodepool-builder/uploader/openstack"
	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

// importConfig is one zuul-image on two providers of a Glance behind
// Keystone that takes images by import: cloud-w's cloud fetches the qcow2,
// published plain, itself (web-download); cloud-g is staged the raw,
// published as .raw.zst, and imports it (glance-direct).
const importConfig = `images-dir: {{IMAGES}}
zuul-images:
{{DEBIAN}}providers:
  - name: cloud-w
    cloud: import
    image-format: qcow2
    diskimages:
      - name: debian
  - name: cloud-g
    cloud: import
    image-format: raw
    diskimages:
      - name: debian
builder:
  keep-builds: 2
  keep-uploads: 2
  providers:
    - name: cloud-w
      upload-method: web-download
    - name: cloud-g
      upload-method: glance-direct
`

// TestOnceImports: a --once run takes a Zuul build to a cloud by
// web-download, the builder reading nothing of the artifact the cloud
// fetches, and to another by glance-direct, staged as it downloads; the
// next run fetches nothing, the format the cloud fetched being no format
// the build lacks.
func TestOnceImports(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	ks := testenv.SharedKeystone(t)
	g := testenv.NewGlanceWithImport(t, ks, testenv.GlanceImportOptions{Methods: []string{"glance-direct", "web-download"}})
	account := ks.NewAccount(t)
	plain, err := os.ReadFile(e.glance.CloudsFile)
	if err != nil {
		t.Fatal(err)
	}
	clouds := filepath.Join(e.dir, "clouds.yaml")
	if err := os.WriteFile(clouds, append(plain, ks.CloudEntry("import", g.Endpoint, account)...), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("OS_CLIENT_CONFIG_FILE", clouds)
	cloud, err := openstack.Open(context.Background(), openstack.Options{Cloud: "import", CloudsFile: clouds})
	if err != nil {
		t.Fatal(err)
	}
	e.writeYAML(importConfig)
	img := e.makeImage(11)
	zb := e.addBuild(img, zuultest.BuildSpec{})
	qcow2 := e.artifact(zb, "debian qcow2")

	r := e.once(0)
	for _, want := range [][]string{
		{`msg="not downloading a format only clouds that fetch it themselves need (web-download)"`, "format=qcow2"},
		{`msg="upload started"`, "provider=cloud-w ", "from=url method=web-download"},
		{`msg="upload started"`, "provider=cloud-g ", "from=download method=glance-direct"},
	} {
		if !containsLine(r.stderr, want...) {
			t.Errorf("no line of the run holds %q:\n%s", want, r.stderr)
		}
	}
	b, ok := e.zuulBuildOf(zb.UUID)
	if !ok {
		t.Fatalf("no build of Zuul build %s: %+v", zb.UUID, e.buildsJSON())
	}
	for p, file := range map[string]string{"cloud-w": img.qcow2, "cloud-g": img.raw} {
		if _, ready := e.readyUpload(b.BuildID, p); !ready {
			t.Errorf("the upload to %s is not ready: %+v", p, e.uploadsJSON())
			continue
		}
		imgs, err := cloud.List(context.Background(), map[string]string{uploader.PropProvider: p, uploader.PropBuildID: b.BuildID})
		if err != nil || len(imgs) != 1 || imgs[0].Status != "active" || imgs[0].Checksum != md5Of(t, file) {
			t.Errorf("images of %s: %+v, %v; want one active, of md5 %s", p, imgs, err, md5Of(t, file))
		}
	}
	cloudGets := 0
	for _, req := range e.zuul.ArtifactRequests(qcow2.Path) {
		if strings.HasPrefix(req.UserAgent, "nodepool-builder") {
			t.Errorf("the builder requested the artifact the cloud fetches: %+v", req)
			continue
		}
		cloudGets++
	}
	if cloudGets == 0 {
		t.Error("the cloud did not fetch the qcow2 artifact")
	}
	if _, err := os.Stat(filepath.Join(e.imagesDir(), "debian-"+b.BuildID+".qcow2")); !os.IsNotExist(err) {
		t.Errorf("a qcow2 file of the build is on disk (%v); want none downloaded", err)
	}

	// The next run lacks nothing: it neither downloads the qcow2 nor uploads.
	requests := len(e.zuul.ArtifactRequests(qcow2.Path))
	r = e.once(0)
	if n := len(e.zuul.ArtifactRequests(qcow2.Path)); n != requests {
		t.Errorf("the next run requested the qcow2 artifact %d more times:\n%s", n-requests, r.stderr)
	}
	if strings.Contains(r.stderr, `msg="upload started"`) {
		t.Errorf("the next run uploaded:\n%s", r.stderr)
	}
}

// md5Of is the md5 of a file, as Glance's checksum says it.
func md5Of(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := md5.Sum(data)
	return hex.EncodeToString(sum[:])
}
