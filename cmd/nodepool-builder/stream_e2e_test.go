package main

import (
	"strings"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

// streamConfig is a config of one zuul-image on four providers of the
// env's Glance: three take raw, published as .raw.zst, one qcow2, published
// plain; vhd, which no provider takes, is not fetched.
const streamConfig = `images-dir: {{IMAGES}}
zuul-images:
{{DEBIAN}}providers:
  - name: cloud-q
    cloud: {{CLOUD}}
    image-format: qcow2
    diskimages:
      - name: debian
  - name: raw-1
    cloud: {{CLOUD}}
    image-format: raw
    diskimages:
      - name: debian
  - name: raw-2
    cloud: {{CLOUD}}
    image-format: raw
    diskimages:
      - name: debian
  - name: raw-3
    cloud: {{CLOUD}}
    image-format: raw
    diskimages:
      - name: debian
builder:
  keep-builds: 2
  keep-uploads: 2
`

// TestOnceUploadsWhileDownloading: every provider's upload of a format a
// Zuul build publishes follows its download, read from Zuul once however
// many providers take it; each cloud image holds the build's bytes, and its
// upload is ready.
func TestOnceUploadsWhileDownloading(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	e.writeYAML(streamConfig)
	img := e.makeImage(7)
	zb := e.addBuild(img, zuultest.BuildSpec{})
	r := e.once(0)
	for _, p := range []string{"cloud-q", "raw-1", "raw-2", "raw-3"} {
		if !containsLine(r.stderr, `msg="upload started"`, "provider="+p+" ", " from=download") {
			t.Errorf("the upload to %s did not follow the download:\n%s", p, r.stderr)
		}
		imgs := e.images(p)
		if len(imgs) != 1 || imgs[0].Status != "active" {
			t.Fatalf("images of %s: %+v; want one, active", p, imgs)
		}
		want := img.rawSum
		if p == "cloud-q" {
			want = img.qcow2Sum
		}
		if got := e.glanceData(imgs[0].ID); got != want {
			t.Errorf("the image uploaded to %s holds other bytes than the build's", p)
		}
	}
	b, ok := e.zuulBuildOf(zb.UUID)
	if !ok {
		t.Fatalf("no build of Zuul build %s", zb.UUID)
	}
	for _, p := range []string{"cloud-q", "raw-1", "raw-2", "raw-3"} {
		if _, ready := e.readyUpload(b.BuildID, p); !ready {
			t.Errorf("the upload to %s is not ready: %+v", p, e.uploadsJSON())
		}
	}
	for _, name := range []string{"debian raw", "debian qcow2"} {
		a := e.artifact(zb, name)
		if served := e.zuul.BytesServed(a.Path); served != a.ServedSize {
			t.Errorf("%s: %d bytes served for a %d-byte file; want it read once", name, served, a.ServedSize)
		}
	}
}

// containsLine tells whether one line of text holds every part.
func containsLine(text string, parts ...string) bool {
	for line := range strings.SplitSeq(text, "\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			return true
		}
	}
	return false
}
