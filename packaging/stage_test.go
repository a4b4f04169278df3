//go:build packaging

package packaging

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/uploader"
	"github.com/nodepool-builder/nodepool-builder/uploader/openstack"
	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

// stage is what an installed builder runs against: a real Glance and a
// stand-in Zuul with one build of the image job.
type stage struct {
	glance *testenv.Glance
	cloud  *openstack.Cloud
	zuul   *zuultest.Server
}

func newStage(t *testing.T) *stage {
	t.Helper()
	s := &stage{glance: testenv.NewGlance(t)}
	cloud, err := openstack.Open(context.Background(), openstack.Options{Cloud: s.glance.Cloud, CloudsFile: s.glance.CloudsFile})
	if err != nil {
		t.Fatal(err)
	}
	s.cloud = cloud
	s.zuul = zuultest.NewServer(zuultest.ServerOptions{})
	t.Cleanup(s.zuul.Close)

	// A disk of 3 MiB, 1 MiB of it random, as qcow2.
	dir := t.TempDir()
	raw, qcow2 := filepath.Join(dir, "disk.raw"), filepath.Join(dir, "disk.qcow2")
	data := make([]byte, 3<<20)
	rand.New(rand.NewSource(time.Now().UnixNano())).Read(data[:1<<20])
	if err := os.WriteFile(raw, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(testenv.RequireBinary(t, "qemu-img"), "convert", "-f", "raw", "-O", "qcow2", raw, qcow2).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img convert: %v: %s", err, out)
	}
	meta := map[string]any{"type": "zuul_image", "image_name": "debian", "format": "qcow2"}
	if _, err := s.zuul.AddBuild(zuultest.BuildSpec{Job: "build-debian",
		Artifacts: []zuultest.ArtifactSpec{{Name: "debian qcow2", Path: qcow2, Metadata: meta}}}); err != nil {
		t.Fatal(err)
	}
	return s
}

// writeConfig writes into dir the configs an operator writes: a nodepool.yaml
// that keeps the Zuul build in the Glance, with images-dir as the builder sees
// it, the nodepool-builder.yaml beside it with the zuul-image, and the
// clouds.yaml it names; all readable by gid.
func (s *stage) writeConfig(t *testing.T, dir, imagesDir string, gid int) {
	t.Helper()
	nodepool := fmt.Sprintf(`images-dir: %s
diskimages:
  - name: debian
    pause: true
providers:
  - name: glance
    cloud: %s
    diskimages:
      - name: debian
`, imagesDir, s.glance.Cloud)
	builder := fmt.Sprintf(`zuul-images:
  - name: debian
    api-url: %s
    tenant: %s
    project: org/images
    job: build-debian
`, s.zuul.URL(), s.zuul.Tenant())
	clouds, err := os.ReadFile(s.glance.CloudsFile)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string]string{"nodepool.yaml": nodepool, "nodepool-builder.yaml": builder, "clouds.yaml": string(clouds)} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(data), 0o640); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(path, 0, gid); err != nil {
			t.Fatal(err)
		}
	}
}

// activeImage fails the test unless Glance holds exactly one image of the
// builder's, active.
func (s *stage) activeImage(t *testing.T) {
	t.Helper()
	imgs, err := s.cloud.List(context.Background(), map[string]string{uploader.PropProvider: "glance"})
	if err != nil {
		t.Fatal(err)
	}
	if len(imgs) != 1 || imgs[0].Status != "active" {
		t.Fatalf("Glance holds %+v; want one active image", imgs)
	}
}

// run runs a command with a deadline and returns its combined output,
// failing the test when it fails.
func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := command(t, name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
	return string(out)
}

// command is the named program, stopped when the test's deadline nears.
func command(t *testing.T, name string, args ...string) *exec.Cmd {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	t.Cleanup(cancel)
	return exec.CommandContext(ctx, name, args...)
}

// required is a value make package-test passes in the environment.
func required(t *testing.T, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		t.Fatalf("%s is not set: run make package-test", name)
	}
	return v
}

// writeShared writes a file, readable by everyone, for a container to read.
func writeShared(t *testing.T, share, name, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(share, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func copyFile(t *testing.T, from, to string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(to, readFile(t, from), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(to, mode); err != nil {
		t.Fatal(err)
	}
}
