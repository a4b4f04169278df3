//go:build packaging

package packaging

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
)

// imageUID is the nodepool user's uid and gid in the image, which the
// operator gives the mounted directories to.
const imageUID = 10001

// TestImage runs the image with podman as the README says to run it for
// zuul-images (no privileges, the host's network, the config and the state
// mounted) against a stand-in Zuul and a real Glance.
func TestImage(t *testing.T) {
	image := required(t, "PACKAGE_IMAGE")
	if os.Getuid() != 0 {
		testenv.Unavailable(t, "podman runs the image here as root")
	}
	podman := testenv.RequireBinary(t, "podman")
	podmanRun := func(args ...string) string {
		t.Helper()
		return run(t, podman, append([]string{"--runtime", "runc", "run", "--rm", "--network=host",
			"--security-opt", "no-new-privileges", "--cap-drop", "all"}, args...)...)
	}
	checkImageConfig(t, podman, image)
	version := strings.TrimSpace(run(t, podman, "image", "inspect", "--format", `{{index .Labels "org.opencontainers.image.version"}}`, image))
	if got := podmanRun(image, "--version"); !strings.HasPrefix(got, "nodepool-builder version "+version+" ") {
		t.Errorf("--version in the image prints %q; its label says %s", got, version)
	}

	st := newStage(t)
	config, state := t.TempDir(), t.TempDir()
	st.writeConfig(t, config, "/var/lib/nodepool/images", imageUID)
	for dir, mode := range map[string]os.FileMode{config: 0o750, state: 0o750} {
		if err := os.Chmod(dir, mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(config, 0, imageUID); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(state, imageUID, imageUID); err != nil {
		t.Fatal(err)
	}
	out := podmanRun("-v", config+":/etc/nodepool:ro", "-v", state+":/var/lib/nodepool", image, "--once")
	t.Logf("nodepool-builder --once in the image:\n%s", out)
	st.activeImage(t)
	images, err := filepath.Glob(filepath.Join(state, "images", "debian-*.qcow2"))
	if err != nil || len(images) != 1 {
		t.Errorf("the images-dir holds %v (%v); want the build's qcow2", images, err)
	}
	// The state is SQLite's, written by the binary built without cgo.
	mustExist(t, filepath.Join(state, "images", "builder.db"))
}

// checkImageConfig checks how the image runs: as the nodepool user, the
// binary as the entrypoint on the config in /etc/nodepool, the state a volume.
func checkImageConfig(t *testing.T, podman, image string) {
	t.Helper()
	var inspected []struct {
		Config struct {
			User       string
			Entrypoint []string
			Cmd        []string
			Volumes    map[string]struct{}
		}
	}
	if err := json.Unmarshal([]byte(run(t, podman, "image", "inspect", image)), &inspected); err != nil || len(inspected) != 1 {
		t.Fatalf("podman image inspect %s: %v", image, err)
	}
	c := inspected[0].Config
	if c.User != "nodepool" {
		t.Errorf("the image runs as %q, want nodepool", c.User)
	}
	if strings.Join(c.Entrypoint, " ") != "/usr/bin/nodepool-builder" || strings.Join(c.Cmd, " ") != "-c /etc/nodepool/nodepool.yaml" {
		t.Errorf("the image runs %q %q", c.Entrypoint, c.Cmd)
	}
	if _, ok := c.Volumes["/var/lib/nodepool"]; !ok {
		t.Errorf("the image's volumes are %v, want /var/lib/nodepool", c.Volumes)
	}
}

// TestImageUserCannotSudo: the image's user may not sudo, even run without
// no-new-privileges, with the capabilities sudo needs.
func TestImageUserCannotSudo(t *testing.T) {
	image := required(t, "PACKAGE_IMAGE")
	if os.Getuid() != 0 {
		testenv.Unavailable(t, "podman runs the image here as root")
	}
	podman := testenv.RequireBinary(t, "podman")
	for _, privileged := range []bool{false, true} {
		args := []string{"--runtime", "runc", "run", "--rm", "--network=none", "--entrypoint", "sudo"}
		if privileged {
			args = append(args, "--privileged")
		}
		out, err := command(t, podman, append(args, image, "-n", "true")...).CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || !strings.Contains(string(out), "a password is required") {
			t.Errorf("sudo -n true in the image (privileged %v): %v, want it refused for want of a password:\n%s", privileged, err, out)
		}
	}
}

// imageSudoers is the sudoers rule installation.md gives a builder of
// diskimages in the image, and where it is mounted.
const (
	imageSudoers      = "nodepool ALL=(ALL) NOPASSWD: ALL\n"
	imageSudoersMount = "/etc/sudoers.d/nodepool-builder"
)

// TestImageBuildsDiskImages runs the image as the docs say to run a builder of
// diskimages (privileged, the sudoers rule mounted), with a dib-cmd that
// becomes root through sudo as diskimage-builder does: the build is made, and
// its log written in the default build-log-dir, which the nodepool user could
// not create in /var/log. Without the rule, or with no-new-privileges, the
// builder refuses to start, saying why.
func TestImageBuildsDiskImages(t *testing.T) {
	image := required(t, "PACKAGE_IMAGE")
	if os.Getuid() != 0 {
		testenv.Unavailable(t, "podman runs the image here as root")
	}
	podman := testenv.RequireBinary(t, "podman")
	config, state, share := t.TempDir(), t.TempDir(), t.TempDir()
	copyFile(t, filepath.Join("..", "dib", "testdata", "fake-disk-image-create"), filepath.Join(share, "fake-disk-image-create"), 0o755)
	writeShared(t, config, "nodepool.yaml", `images-dir: /var/lib/nodepool/images
diskimages:
  - name: dib
    dib-cmd: bash /srv/test/fake-disk-image-create
    elements: [fake]
    formats: [qcow2]
    env-vars:
      FAKE_DIB_SUDO: "1"
`)
	for dir, owner := range map[string]int{config: 0, state: imageUID, share: 0} {
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(dir, owner, imageUID); err != nil {
			t.Fatal(err)
		}
	}
	// The rule, in a file of root's, mode 0440.
	sudoers := filepath.Join(t.TempDir(), "nodepool-image.sudoers")
	if err := os.WriteFile(sudoers, []byte(imageSudoers), 0o440); err != nil {
		t.Fatal(err)
	}
	run(t, testenv.RequireBinary(t, "visudo"), "-c", "-f", sudoers)
	rule := sudoers + ":" + imageSudoersMount + ":ro"
	podmanRun := func(args ...string) (string, error) {
		t.Helper()
		out, err := command(t, podman, append([]string{"--runtime", "runc", "run", "--rm", "--network=none",
			"-v", config + ":/etc/nodepool:ro", "-v", state + ":/var/lib/nodepool", "-v", share + ":/srv/test:ro"}, args...)...).CombinedOutput()
		return string(out), err
	}

	out, err := podmanRun("--security-opt", "no-new-privileges", "-v", rule, image, "--once")
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(out, "no_new_privs set, so sudo cannot gain root") ||
		!strings.Contains(out, "--security-opt no-new-privileges") {
		t.Errorf("--once with no-new-privileges: %v, want exit code 2 saying sudo cannot gain root:\n%s", err, out)
	}

	out, err = podmanRun("--privileged", image, "--once")
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(out, "sudo -n true, run as nodepool, fails") ||
		!strings.Contains(out, "-v <file>:"+imageSudoersMount+":ro") {
		t.Errorf("--once privileged without the sudoers rule: %v, want exit code 2 naming the rule to mount:\n%s", err, out)
	}

	out, err = podmanRun("--privileged", "-v", rule, image, "--once")
	t.Logf("nodepool-builder --once in the privileged image:\n%s", out)
	if err != nil {
		t.Fatalf("--once in the privileged image: %v", err)
	}
	images, err := filepath.Glob(filepath.Join(state, "images", "dib-*.qcow2"))
	if err != nil || len(images) != 1 {
		t.Errorf("the images-dir holds %v (%v); want the build's qcow2", images, err)
	}
	if !strings.Contains(out, `"log":"/var/log/nodepool/builds/dib-`) && !strings.Contains(out, "log=/var/log/nodepool/builds/dib-") {
		t.Errorf("the build did not log to the default build-log-dir:\n%s", out)
	}
}
