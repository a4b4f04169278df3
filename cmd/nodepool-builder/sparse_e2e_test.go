package main

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

// TestSparseImageReachesGlanceWhole: a mostly-zero raw is kept with holes in
// the images-dir, and Glance still receives every byte of it.
func TestSparseImageReachesGlanceWhole(t *testing.T) {
	for _, c := range []struct{ name, compress string }{{"plain", ""}, {"zst", "zst"}, {"gz", "gz"}} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
			e.writeYAML(`images-dir: {{IMAGES}}
zuul-images:
{{DEBIAN}}providers:
  - name: cloud-r
    cloud: {{CLOUD}}
    image-format: raw
    diskimages:
      - name: debian
`)
			const size = 64 << 20
			img := e.makeImageSized(1, size) // its first MiB random, the rest zeros
			zb := e.addBuild(img, zuultest.BuildSpec{Artifacts: []zuultest.ArtifactSpec{
				{Name: "debian raw", Path: img.raw, Compress: c.compress, Metadata: zuulImageMeta("raw")},
			}})
			e.once(0)
			b, ok := e.zuulBuildOf(zb.UUID)
			if !ok || b.State != "ready" {
				t.Fatalf("build of Zuul build %s: %+v, %v", zb.UUID, b, ok)
			}
			path := filepath.Join(e.imagesDir(), "debian-"+b.BuildID+".raw")
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			used := fi.Sys().(*syscall.Stat_t).Blocks * 512
			if fi.Size() != size || used > size/8 {
				t.Errorf("%s: size %d, %d bytes on disk; want %d with the zeros as holes", path, fi.Size(), used, size)
			}
			up, ok := e.readyUpload(b.BuildID, "cloud-r")
			if !ok {
				t.Fatalf("no ready upload to cloud-r")
			}
			if got := e.glanceData(up.ExternalID); got != img.rawSum {
				t.Errorf("Glance serves sha256 %s, the image is %s", got, img.rawSum)
			}
		})
	}
}
