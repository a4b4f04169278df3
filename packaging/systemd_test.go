//go:build packaging

package packaging

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/systemd"
	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
)

// systemdPackages are what the container's Debian holds besides minbase and
// the package's dependencies: systemd as PID 1, D-Bus for systemd-run, sudo for
// diskimage-builder. What the package uses and does not depend on is missing.
var systemdPackages = []string{"systemd", "systemd-sysv", "dbus", "sudo"}

// systemdRepo is where podman keeps the container's base image, tagged by
// the packages it holds.
const systemdRepo = "localhost/nodepool-builder-test-systemd"

// In the container: the test's files, the package's config and the unit.
const (
	shared     = "/srv/test"
	configFile = configDir + "/nodepool.yaml"
	unitName   = systemd.Unit
)

// TestSystemd runs the package under a real systemd, as PID 1 of a podman
// container that enforces the unit's sandbox, as an operator does: install
// it, write a config whose images-dir is outside ReadWritePaths and that
// builds a diskimage, see the documented pre-flight check and the start both
// refuse it and say why, add the drop-ins they name, see the service build
// the diskimage with a dib-cmd that becomes root through sudo, reload a
// changed config, stop it during a build, upgrade it, remove and purge it.
func TestSystemd(t *testing.T) {
	deb := required(t, "PACKAGE_DEB")
	if os.Getuid() != 0 {
		testenv.Unavailable(t, "podman runs systemd in a container here as root")
	}
	podman := testenv.RequireBinary(t, "podman")
	share := t.TempDir()
	if err := os.Chmod(share, 0o755); err != nil {
		t.Fatal(err)
	}
	copyFile(t, deb, filepath.Join(share, "nodepool-builder.deb"), 0o644)
	later, laterVersion := laterDeb(t, deb, share)
	copyFile(t, filepath.Join("..", "dib", "testdata", "fake-disk-image-create"), filepath.Join(share, "fake-disk-image-create"), 0o755)
	writeShared(t, share, "paths.conf", "[Service]\nReadWritePaths=/opt/nodepool/images\n")
	preflight := preflightCheck(t)

	c := startSystemd(t, podman, systemdBase(t, podman, depends(t, deb)), share)
	c.run("dpkg", "-i", shared+"/nodepool-builder.deb")

	// The operator's part: a config that builds a diskimage into a
	// directory of the nodepool user's, outside the unit's ReadWritePaths,
	// and the sudoers rule uncommented.
	c.run("install", "-d", "-o", "nodepool", "-g", "nodepool", "-m", "0750", "/opt/nodepool/images")
	c.writeConfig(share, "dib")
	c.run("sed", "-i", "s/^#nodepool ALL=/nodepool ALL=/", sudoersDropIn)
	// Outside the sandbox all seems well...
	c.run("runuser", "-u", "nodepool", "--", installedBinary, "-c", configFile, "config-validate")
	// ...but the check of the docs, which runs in the unit's sandbox, sees
	// what the service will: the images-dir read-only, sudo unable to gain root.
	readOnly := []string{"images-dir /opt/nodepool/images is on a read-only file system (/opt/nodepool/images)",
		"ReadWritePaths=/opt/nodepool/images", systemd.DropInDir + "/paths.conf"}
	noRoot := []string{"no_new_privs set, so sudo cannot gain root", "ln -s " + systemd.DIBDropIn + " " + systemd.DropInDir + "/"}
	out, code := c.exec("sh", "-c", preflight)
	if code != 2 || !containsAll(out, slices.Concat(readOnly, noRoot)) {
		t.Fatalf("the pre-flight check of the docs exited %d, want 2 and the images-dir read-only and sudo refused:\n%s", code, out)
	}

	// The start says the same, and systemd does not restart the service.
	c.startRun("enable", "--now")
	c.waitFailed(2, slices.Concat(readOnly, noRoot)...)

	// The drop-in the message gives for the path: the images-dir is
	// written; sudo is still refused.
	c.run("mkdir", "-p", systemd.DropInDir)
	c.run("install", "-m", "0644", shared+"/paths.conf", systemd.DropInDir+"/paths.conf")
	c.run("systemctl", "daemon-reload")
	c.startRun("restart")
	if j := c.waitFailed(2, noRoot...); strings.Contains(j, "read-only") {
		t.Errorf("with the path in ReadWritePaths, the start still finds it read-only:\n%s", j)
	}

	// The DIB drop-in, as the message gives it: the check passes, and the
	// service builds, its dib-cmd mounting as root through sudo.
	c.run("ln", "-s", systemd.DIBDropIn, systemd.DropInDir+"/")
	c.run("systemctl", "daemon-reload")
	if out, code := c.exec("sh", "-c", preflight); code != 0 {
		t.Fatalf("with both drop-ins the pre-flight check of the docs exited %d:\n%s", code, out)
	}
	c.startRun("restart")
	c.waitBuilt("dib")
	if log := c.run("sh", "-c", "cat /var/log/nodepool/builds/dib-*.log"); !strings.Contains(log, "mounted, wrote and unmounted as root through sudo") {
		t.Errorf("the build log does not show the dib-cmd root through sudo:\n%s", log)
	}
	pid := c.mainPID()
	if status := c.run("cat", fmt.Sprintf("/proc/%d/status", pid)); !strings.Contains(status, "\nNoNewPrivs:\t0\n") {
		t.Errorf("the service runs with no_new_privs under the DIB drop-in:\n%s", status)
	}
	// The sandbox is enforced (podman's systemd skips it silently without
	// CAP_SYS_ADMIN): the service's root is read-only, its paths are not.
	mounts := c.mountOptions(pid)
	for path, want := range map[string]string{"/": "ro", "/opt/nodepool/images": "rw", "/var/lib/nodepool": "rw"} {
		if got := mounts[path]; got != want {
			t.Errorf("the service sees %s mounted %q, want %s (its mounts: %v)", path, got, want, mounts)
		}
	}

	// systemctl reload applies a changed config without a restart.
	c.writeConfig(share, "dib", "dib2")
	c.run("systemctl", "reload", unitName)
	c.waitLog(`"config reloaded", reason "reload signal", 2 diskimages`, func(r logRecord) bool {
		return r.Msg == "config reloaded" && r.Reason == "reload signal" && r.DiskImages == 2
	})
	c.waitBuilt("dib2")
	if now := c.mainPID(); now != pid {
		t.Errorf("the reload restarted the service: pid %d, then %d", pid, now)
	}

	// systemctl stop during a build ends it within TimeoutStopSec.
	c.writeConfig(share, "dib", "dib2", "slow")
	c.run("systemctl", "reload", unitName)
	testenv.WaitFor(t, time.Minute, "the slow build to start", func() bool {
		_, code := c.exec("test", "-e", "/var/lib/nodepool/slow-never.started")
		return code == 0
	}, c.status)
	limit := c.duration("TimeoutStopUSec")
	start := time.Now()
	c.run("systemctl", "stop", unitName)
	took := time.Since(start)
	if state, result := c.prop("ActiveState"), c.prop("Result"); state != "inactive" || result != "success" || took >= limit {
		t.Errorf("systemctl stop took %s (TimeoutStopSec %s), leaving the service %s with result %s", took, limit, state, result)
	}
	t.Logf("systemctl stop during a build took %s", took.Round(time.Millisecond))

	// An upgrade restarts the running service on the new binary.
	c.startRun("start")
	c.waitActive()
	pid = c.mainPID()
	c.run("dpkg", "-i", shared+"/"+filepath.Base(later))
	if got := strings.TrimSpace(c.run("dpkg-query", "-W", "-f", "${Version}", "nodepool-builder")); got != laterVersion {
		t.Errorf("after the upgrade the installed version is %s, want %s", got, laterVersion)
	}
	c.waitActive()
	if now := c.mainPID(); now == pid {
		t.Errorf("the upgrade left the service running as pid %d", pid)
	} else if exe := strings.TrimSpace(c.run("runuser", "-u", "nodepool", "--", "readlink", fmt.Sprintf("/proc/%d/exe", now))); exe != installedBinary {
		// A process left on the replaced binary would show it "(deleted)".
		t.Errorf("after the upgrade the service runs %q, want %s", exe, installedBinary)
	}

	// Remove stops it and leaves the conffile; purge takes that too, and
	// leaves the operator's config and the nodepool user.
	c.run("dpkg", "-r", "nodepool-builder")
	if state := c.prop("ActiveState"); state != "inactive" {
		t.Errorf("after dpkg -r the service is %s", state)
	}
	c.mustNotExist(installedBinary, installedUnit, systemd.DIBDropIn)
	c.mustExist(sudoersDropIn, configFile)
	c.run("dpkg", "-P", "nodepool-builder")
	if got, _ := c.exec("dpkg-query", "-W", "-f", "${db:Status-Status}", "nodepool-builder"); strings.TrimSpace(got) == "installed" || strings.TrimSpace(got) == "config-files" {
		t.Errorf("after dpkg -P the package is %s", got)
	}
	c.mustNotExist(sudoersDropIn)
	c.mustExist(configFile, stateDir)
	c.run("id", "nodepool")
}

// depends are the packages the package depends on, the first of each
// alternative.
func depends(t *testing.T, deb string) []string {
	t.Helper()
	var names []string
	for _, d := range strings.Split(run(t, "dpkg-deb", "-f", deb, "Depends"), ",") {
		if name := strings.Fields(strings.TrimSpace(d)); len(name) > 0 {
			names = append(names, strings.TrimSpace(strings.Split(name[0], "|")[0]))
		}
	}
	return names
}

// systemdBase returns the base image of the systemd container: Debian's
// minbase with systemdPackages and extra, made with mmdebstrap when podman
// does not have it yet. podman keeps it; bases of other packages are removed.
func systemdBase(t *testing.T, podman string, extra []string) string {
	t.Helper()
	packages := slices.Concat(systemdPackages, extra)
	sum := sha256.Sum256([]byte(strings.Join(packages, ",")))
	name := systemdRepo + ":" + hex.EncodeToString(sum[:6])
	if command(t, podman, "image", "exists", name).Run() == nil {
		return name
	}
	tar := filepath.Join(t.TempDir(), "base.tar")
	run(t, testenv.RequireBinary(t, "mmdebstrap"), "--quiet", "--variant=minbase", "--include="+strings.Join(packages, ","),
		"--format=tar", "bookworm", tar)
	run(t, podman, "import", "--change", `CMD ["/sbin/init"]`, "--message", "the package test's systemd base: "+strings.Join(packages, " "), tar, name)
	for _, other := range strings.Fields(run(t, podman, "images", "--noheading", "--filter", "reference="+systemdRepo, "--format", "{{.Repository}}:{{.Tag}}")) {
		if other != name {
			command(t, podman, "rmi", other).Run()
		}
	}
	return name
}

// container is a podman container whose PID 1 is systemd.
type container struct {
	t            *testing.T
	podman, name string
	// runCursor is the journal's cursor before the service's current run began.
	runCursor string
}

// startSystemd starts a container of image with systemd as PID 1, the
// sandbox of its units enforced (CAP_SYS_ADMIN), share mounted read-only at
// /srv/test, and waits until systemd has booted. The test removes it.
func startSystemd(t *testing.T, podman, image, share string) *container {
	t.Helper()
	c := &container{t: t, podman: podman, name: fmt.Sprintf("nodepool-builder-test-systemd-%d", os.Getpid())}
	command(t, podman, "rm", "-f", "-t", "0", c.name).Run() // left by a test killed before its cleanup
	run(t, podman, "--runtime", "runc", "run", "-d", "--name", c.name, "--systemd=always", "--cap-add", "SYS_ADMIN",
		"--network=none", "-v", share+":"+shared+":ro", image, "/sbin/init")
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := c.exec("journalctl", "--no-pager", "-o", "short-precise", "-n", "200")
			t.Logf("the container's journal:\n%s", out)
		}
		command(t, podman, "rm", "-f", "-t", "0", c.name).Run()
	})
	testenv.WaitFor(t, 2*time.Minute, "systemd to boot in the container", func() bool {
		out, _ := c.exec("systemctl", "is-system-running", "--wait")
		state := strings.TrimSpace(out)
		return state == "running" || state == "degraded"
	}, func() string { out, _ := c.exec("systemctl", "--failed", "--no-pager"); return out })
	return c
}

// exec runs a command in the container and returns its output and exit code.
func (c *container) exec(args ...string) (string, int) {
	c.t.Helper()
	out, err := command(c.t, c.podman, append([]string{"--runtime", "runc", "exec", c.name}, args...)...).CombinedOutput()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	case err != nil:
		c.t.Fatalf("podman exec %v: %v\n%s", args, err, out)
	}
	return string(out), 0
}

// run runs a command in the container, failing the test when it fails.
func (c *container) run(args ...string) string {
	c.t.Helper()
	out, code := c.exec(args...)
	if code != 0 {
		c.t.Fatalf("%s in the container exited %d:\n%s", strings.Join(args, " "), code, out)
	}
	return out
}

// writeConfig installs, as the operator does, a nodepool.yaml that builds the
// diskimages named with the fake diskimage-builder, whose dib-cmd becomes
// root through sudo; "slow" waits for a file nobody makes.
func (c *container) writeConfig(share string, images ...string) {
	c.t.Helper()
	text := "images-dir: /opt/nodepool/images\ndiskimages:\n"
	for _, image := range images {
		text += "  - name: " + image + "\n    dib-cmd: bash " + shared + "/fake-disk-image-create\n    elements: [fake]\n" +
			"    formats: [qcow2]\n    env-vars:\n      FAKE_DIB_SUDO: \"1\"\n"
		if image == "slow" {
			text += "      FAKE_DIB_WAIT_FOR: /var/lib/nodepool/slow-never\n"
		}
	}
	writeShared(c.t, share, "nodepool.yaml", text)
	c.run("install", "-o", "root", "-g", "nodepool", "-m", "0640", shared+"/nodepool.yaml", configFile)
}

// prop is a property of the unit, as systemctl show gives it.
func (c *container) prop(name string) string {
	c.t.Helper()
	return strings.TrimSpace(c.run("systemctl", "show", "-P", name, unitName))
}

func (c *container) mainPID() int {
	c.t.Helper()
	pid, err := strconv.Atoi(c.prop("MainPID"))
	if err != nil || pid == 0 {
		c.t.Fatalf("the service has no main process (%q): %v\n%s", c.prop("MainPID"), err, c.status())
	}
	return pid
}

// duration is a time span property of the unit (e.g. "1min 30s").
func (c *container) duration(name string) time.Duration {
	c.t.Helper()
	v := c.prop(name)
	d, err := time.ParseDuration(strings.NewReplacer(" ", "", "min", "m").Replace(v))
	if err != nil {
		c.t.Fatalf("%s=%s: %v", name, v, err)
	}
	return d
}

// status is what systemctl status says of the unit, for failures.
func (c *container) status() string {
	out, _ := c.exec("systemctl", "status", "--no-pager", "-l", unitName)
	return out
}

// startRun runs systemctl verb on the unit, a verb that starts a new run of
// the service, and marks where that run's records begin in the journal.
func (c *container) startRun(verb ...string) {
	c.t.Helper()
	out := c.run("journalctl", "--no-pager", "-q", "-n", "0", "--show-cursor")
	cursor, ok := strings.CutPrefix(strings.TrimSpace(out), "-- cursor: ")
	if !ok {
		c.t.Fatalf("journalctl gave no cursor:\n%s", out)
	}
	c.runCursor = cursor
	c.run(slices.Concat([]string{"systemctl"}, verb, []string{unitName})...)
}

// journal is what the unit logged since its current (or last) run began.
// It reads the unit's records, not the run's invocation ID: journald finds
// that ID through the writing process and misses it on the last lines of a
// process that exits at once, as a refused start does. The unit is matched
// here rather than by journalctl, which (systemd 252) returns nothing for a
// field match after a cursor of a record the match does not take.
func (c *container) journal() string {
	c.t.Helper()
	out, _ := c.exec("journalctl", "--no-pager", "-o", "json", "--after-cursor", c.runCursor)
	var log strings.Builder
	for line := range strings.Lines(out) {
		var r struct {
			Unit    string `json:"_SYSTEMD_UNIT"`
			Message any    `json:"MESSAGE"`
		}
		if json.Unmarshal([]byte(line), &r) != nil || r.Unit != unitName {
			continue
		}
		if m, ok := r.Message.(string); ok {
			log.WriteString(m + "\n")
		}
	}
	return log.String()
}

// waitFailed waits until the service has exited with code and stays failed,
// and its run has logged each of says; it returns that run's log.
func (c *container) waitFailed(code int, says ...string) string {
	c.t.Helper()
	testenv.WaitFor(c.t, time.Minute, fmt.Sprintf("the service to fail with exit code %d", code), func() bool {
		return c.prop("ActiveState") == "failed" && c.prop("ExecMainStatus") == strconv.Itoa(code)
	}, c.status)
	var log string
	testenv.WaitFor(c.t, time.Minute, fmt.Sprintf("the failed run to log %q", says), func() bool {
		log = c.journal()
		return containsAll(log, says)
	}, c.journal)
	if restarts := c.prop("NRestarts"); restarts != "0" {
		c.t.Errorf("systemd restarted the service %s times after exit code %d", restarts, code)
	}
	return log
}

func (c *container) waitActive() {
	c.t.Helper()
	testenv.WaitFor(c.t, time.Minute, "the service to be active", func() bool {
		return c.prop("ActiveState") == "active" && c.prop("SubState") == "running"
	}, c.status)
}

// waitBuilt waits until the image has a ready build, as dib-image-list
// --json, run as the nodepool user, shows it.
func (c *container) waitBuilt(image string) {
	c.t.Helper()
	var listed string
	testenv.WaitFor(c.t, 2*time.Minute, "a ready build of "+image, func() bool {
		out, code := c.exec("runuser", "-u", "nodepool", "--", installedBinary, "-c", configFile, "dib-image-list", "--json")
		listed = out
		var builds []struct{ Image, State string }
		if code != 0 || json.Unmarshal([]byte(out), &builds) != nil {
			return false
		}
		return slices.ContainsFunc(builds, func(b struct{ Image, State string }) bool { return b.Image == image && b.State == "ready" })
	}, func() string { return listed }, c.journal)
}

// logRecord is what the tests read of the daemon's JSON log records.
type logRecord struct {
	Msg        string `json:"msg"`
	Reason     string `json:"reason"`
	DiskImages int    `json:"diskimages"`
}

// waitLog waits until the service's current run logs a record that match
// takes.
func (c *container) waitLog(what string, match func(logRecord) bool) {
	c.t.Helper()
	testenv.WaitFor(c.t, time.Minute, "the service to log "+what, func() bool {
		for line := range strings.Lines(c.journal()) {
			var r logRecord
			if json.Unmarshal([]byte(line), &r) == nil && match(r) {
				return true
			}
		}
		return false
	}, c.journal)
}

// mountOptions reads the mounts process pid sees: each mount point and
// whether it is mounted ro or rw.
func (c *container) mountOptions(pid int) map[string]string {
	c.t.Helper()
	mounts := map[string]string{}
	for line := range strings.Lines(c.run("cat", fmt.Sprintf("/proc/%d/mountinfo", pid))) {
		// id parent major:minor root mount-point options ...
		f := strings.Fields(line)
		if len(f) < 6 {
			continue
		}
		for _, o := range strings.Split(f[5], ",") {
			if o == "ro" || o == "rw" {
				mounts[f[4]] = o // a later mount on the same point hides an earlier one
			}
		}
	}
	return mounts
}

func (c *container) mustExist(paths ...string) {
	c.t.Helper()
	for _, p := range paths {
		if out, code := c.exec("test", "-e", p); code != 0 {
			c.t.Errorf("%s is gone from the container %s", p, out)
		}
	}
}

func (c *container) mustNotExist(paths ...string) {
	c.t.Helper()
	for _, p := range paths {
		if _, code := c.exec("test", "-e", p); code == 0 {
			c.t.Errorf("%s is still in the container", p)
		}
	}
}

// preflightCheck is the shell script of installation.md that runs
// config-validate in the unit's sandbox.
func preflightCheck(t *testing.T) string {
	t.Helper()
	doc := string(readFile(t, filepath.Join("..", "docs", "installation.md")))
	section, ok := testenv.MarkdownSection(doc, "### Check before starting")
	_, block, found := strings.Cut(section, "```sh\n")
	block, _, closed := strings.Cut(block, "```")
	if !ok || !found || !closed || !strings.Contains(block, "systemd-run") {
		t.Fatalf("docs/installation.md has no sh block running systemd-run under \"### Check before starting\"")
	}
	return block
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
