package main

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/progress"
	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

// onceWithin runs --once and fails the test when it has not ended within d:
// a run that writes or reads terabytes must not be waited for.
func (e *env) onceWithin(d time.Duration, wantCode int) result {
	e.t.Helper()
	done := make(chan result, 1)
	go func() { done <- e.run("--once") }()
	select {
	case r := <-done:
		if r.code != wantCode {
			e.t.Fatalf("--once exited %d, want %d\nstderr:\n%s", r.code, wantCode, r.stderr)
		}
		return r
	case <-time.After(d):
		e.t.Fatalf("--once still running after %s", d)
		return result{}
	}
}

// failedSaying runs --once, which must fail saying each of says, and checks
// that zb is recorded failed with a reason saying them too, that Glance holds
// nothing and that no file of the build stays.
func (e *env) failedSaying(zb zuultest.Build, says []string) result {
	e.t.Helper()
	r := e.onceWithin(2*time.Minute, exitFailed)
	for _, s := range says {
		if !strings.Contains(r.stderr, s) {
			e.t.Errorf("--once does not say %q:\n%s", s, r.stderr)
		}
	}
	b, ok := e.zuulBuildOf(zb.UUID)
	if !ok || b.State != "failed" {
		e.t.Fatalf("the Zuul build is not recorded failed: %+v", e.buildsJSON())
	}
	for _, s := range says {
		if !strings.Contains(b.Reason, s) {
			e.t.Errorf("the failed build's reason does not say %q: %s", s, b.Reason)
		}
	}
	if imgs, err := e.cloud.List(context.Background(), nil); err != nil || len(imgs) != 0 {
		e.t.Fatalf("Glance holds %d images after a refusal (%v): %+v", len(imgs), err, imgs)
	}
	for _, pattern := range []string{"debian-*", ".debian-*"} {
		if files, _ := filepath.Glob(filepath.Join(e.imagesDir(), pattern)); len(files) != 0 {
			e.t.Errorf("files of a failed build stay: %v", files)
		}
	}
	return r
}

// TestHugeDiskInTinyQcow2Refused: a qcow2 of a few hundred KiB holding a disk
// of 8 TiB, published for a provider that takes raw, is refused against
// builder.max-image-size before anything converts it: nothing is written,
// hashed or uploaded, and the failed build says which limit it broke.
func TestHugeDiskInTinyQcow2Refused(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	huge := filepath.Join(e.dir, "huge.qcow2")
	if out, err := exec.Command(e.qemuImg, "create", "-q", "-f", "qcow2", huge, "8T").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v: %s", err, out)
	}
	e.oneProvider("raw", "", "  max-image-size: 1G\n")
	zb := e.addBuild(image{}, zuultest.BuildSpec{Artifacts: []zuultest.ArtifactSpec{
		{Name: "debian qcow2", Path: huge, Metadata: zuulImageMeta("qcow2")},
	}})
	says := []string{"debian qcow2", "virtual size of 8.0 TiB (8796093022208 bytes)", "builder.max-image-size is 1073741824 bytes"}

	r := e.failedSaying(zb, says)
	if strings.Contains(r.stderr, "converting") {
		t.Errorf("the image was converted:\n%s", r.stderr)
	}
	// Refused for good: the next run does not fetch it again.
	path := e.artifact(zb, "debian qcow2").Path
	served := e.zuul.BytesServed(path)
	e.onceWithin(2*time.Minute, 0)
	if again := e.zuul.BytesServed(path); again != served {
		t.Errorf("a refused artifact was fetched again: %d bytes served, then %d", served, again)
	}
}

// TestConversionNeedsRoomForTheDisk: with a limit that lets a disk of
// terabytes through, its conversion to raw still does not start on an
// images-dir with less than that free; the build fails saying so and nothing
// is uploaded.
func TestConversionNeedsRoomForTheDisk(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	huge := filepath.Join(e.dir, "huge.qcow2")
	size := testenv.HugerThanFree(t, e.dir)
	if out, err := exec.Command(e.qemuImg, "create", "-q", "-f", "qcow2", huge, strconv.FormatInt(size, 10)).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v: %s", err, out)
	}
	e.oneProvider("raw", "", fmt.Sprintf("  max-image-size: %d\n", 2*size))
	zb := e.addBuild(image{}, zuultest.BuildSpec{Artifacts: []zuultest.ArtifactSpec{
		{Name: "debian qcow2", Path: huge, Metadata: zuulImageMeta("qcow2")},
	}})
	says := []string{"not enough free space", fmt.Sprintf("need %d bytes", size), "a disk of " + progress.Bytes(size)}

	e.failedSaying(zb, says)
}
