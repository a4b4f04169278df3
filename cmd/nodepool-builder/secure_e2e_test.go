package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/listing"
	"github.com/nodepool-builder/nodepool-builder/state"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/store/storetest"
)

// secureSecret is a value only a secure file holds: it must show nowhere.
const secureSecret = "s3cret-only-in-the-secure-file"

// TestConfigValidateReadsTheSecureFile: config-validate takes nodepool's
// -s (and --secure), says it read the file, warns of what it ignores there
// and of a file others may read, and refuses what nodepool's loader refuses,
// naming the file, the line and the key, never a value of it.
func TestConfigValidateReadsTheSecureFile(t *testing.T) {
	dir := t.TempDir()
	np := writeFileT(t, filepath.Join(dir, "nodepool.yaml"), "images-dir: "+filepath.Join(dir, "images")+"\n"+
		"build-log-dir: "+filepath.Join(dir, "logs")+"\ndiskimages:\n  - name: debian\n    elements: [vm]\n")
	secureAt := func(name, text string, mode os.FileMode) string {
		path := writeFileT(t, filepath.Join(dir, name), text)
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		return path
	}
	good := secureAt("secure.conf", "diskimages:\n  - name: debian\n    env-vars: {DIB_PASSWORD: "+secureSecret+"}\n", 0o600)

	for _, flag := range []string{"-s", "--secure"} {
		r := runCmd("-c", np, flag, good, "config-validate")
		if want := np + " and the secure file " + good + " are valid: 1 diskimages"; r.code != exitOK || !strings.Contains(r.stdout, want) {
			t.Errorf("config-validate with %s exited %d, want %d and %q:\n%s%s", flag, r.code, exitOK, want, r.stdout, r.stderr)
		}
		if strings.Contains(r.stderr, "warning") {
			t.Errorf("config-validate with %s warns:\n%s", flag, r.stderr)
		}
	}

	ignored := secureAt("ignored.conf", "zookeeper-timeout: 60.0\ndiskimages: []\n", 0o644)
	r := runCmd("-c", np, "-s", ignored, "config-validate")
	for _, want := range []string{
		"nodepool-builder: warning: " + ignored + ":1: zookeeper-timeout: nodepool reads only zookeeper-servers, zookeeper-tls and the env-vars of diskimages",
		"nodepool-builder: warning: the secure file " + ignored + " can be read by every user of the host (mode 0644): chmod 600 " + ignored,
	} {
		if r.code != exitOK || !strings.Contains(r.stderr, want) {
			t.Errorf("config-validate exited %d, want %d and the warning %q:\n%s", r.code, exitOK, want, r.stderr)
		}
	}

	for _, c := range []struct{ name, text, says string }{
		{"an unknown diskimage", "diskimages:\n  - name: fedora\n    env-vars: {DIB_PASSWORD: " + secureSecret + "}\n",
			":2: diskimages[0].name: \"fedora\" is not a diskimage of " + np},
		{"a value where a mapping belongs", "diskimages:\n  - name: debian\n    env-vars: DIB_PASSWORD=" + secureSecret + "\n",
			":3: diskimages[0].env-vars: expected a mapping of names to values"},
	} {
		bad := secureAt("bad.conf", c.text, 0o600)
		r := runCmd("-c", np, "-s", bad, "config-validate")
		if r.code != exitUsage || !strings.Contains(r.stderr, bad+c.says) {
			t.Errorf("%s: config-validate exited %d, want %d and %q:\n%s", c.name, r.code, exitUsage, bad+c.says, r.stderr)
		}
		if strings.Contains(r.stdout+r.stderr, secureSecret) {
			t.Errorf("%s: config-validate shows a value of the secure file:\n%s%s", c.name, r.stdout, r.stderr)
		}
	}

	missing := filepath.Join(dir, "missing.conf")
	if r := runCmd("-c", np, "-s", missing, "config-validate"); r.code != exitUsage || !strings.Contains(r.stderr, "read secure config "+missing) {
		t.Errorf("config-validate with a missing secure file exited %d, want %d naming it:\n%s", r.code, exitUsage, r.stderr)
	}
}

// TestSecureFileHoldsTheZooKeeperSettings: with zookeeper-servers and
// zookeeper-tls only in the secure file, as sites keep them, the commands
// given -s keep the state in ZooKeeper over TLS; without -s the config has no
// ZooKeeper, and the listings look for a SQLite state that is not there.
func TestSecureFileHoldsTheZooKeeperSettings(t *testing.T) {
	z := testenv.NewZooKeeper(t, testenv.ZooKeeperOptions{TLS: true})
	ctx := t.Context()
	dir := t.TempDir()
	host, port, _ := strings.Cut(z.Addr, ":")
	secure := writeFileT(t, filepath.Join(dir, "secure.conf"), fmt.Sprintf("zookeeper-servers:\n  - host: %s\n    port: %s\n    chroot: %s\n"+
		"zookeeper-tls:\n  cert: %s\n  key: %s\n  ca: %s\n", host, port, zkChroot, z.ClientCert, z.ClientKey, z.CA))
	os.Chmod(secure, 0o600)
	np := writeFileT(t, filepath.Join(dir, "nodepool.yaml"), fmt.Sprintf("images-dir: %s\nbuild-log-dir: %s\nzookeeper-timeout: %d.0\n"+
		"diskimages:\n  - name: debian\n    dib-cmd: /bin/false\n", filepath.Join(dir, "not-here"), filepath.Join(dir, "logs"), zkSessionTimeout))

	// A builder with the same pair wrote a build there.
	cfg, err := config.Load(config.Files{Nodepool: np, Secure: secure})
	if err != nil {
		t.Fatal(err)
	}
	zb, err := state.OpenZooKeeper(ctx, cfg.ZooKeeper, state.Options{Access: store.Create})
	if err != nil {
		t.Fatal(err)
	}
	st, raw := storetest.Open(t, store.Options{ImagesDir: filepath.Join(dir, "images"), Access: store.Create, Backend: zb})
	b, err := st.CreateBuild(ctx, store.Build{Image: "debian", Source: store.SourceDIB})
	if err == nil {
		err = raw.SetBuildState(ctx, &b, store.Ready, "")
	}
	if err != nil {
		t.Fatal(err)
	}
	st.Close()

	r := runCmd("-c", np, "-s", secure, "dib-image-list", "--json")
	var builds []listing.Build
	if err := json.Unmarshal([]byte(r.stdout), &builds); r.code != exitOK || err != nil || len(builds) != 1 || builds[0].BuildID != b.ID {
		t.Errorf("dib-image-list -s exited %d (%v), builds %+v; want build %s from ZooKeeper\n%s", r.code, err, builds, b.ID, r.stderr)
	}
	if r := runCmd("-c", np, "--secure", secure, "image-status"); r.code != exitOK || !strings.Contains(r.stdout, "debian") {
		t.Errorf("image-status --secure exited %d, want %d and debian:\n%s%s", r.code, exitOK, r.stdout, r.stderr)
	}
	if r := runCmd("-c", np, "dib-image-list"); r.code != exitUsage || !strings.Contains(r.stderr, filepath.Join(dir, "not-here")) {
		t.Errorf("dib-image-list without -s exited %d, want %d: the state would be SQLite in the images-dir:\n%s", r.code, exitUsage, r.stderr)
	}
}

// TestDaemonReloadsTheSecureFile: the daemon given -s builds with the secure
// file's env-vars, and a change of that file alone is reloaded as a change of
// nodepool.yaml is: the next build (asked for by image-build with -s) gets the
// new value. The values show in no log line and no listing.
func TestDaemonReloadsTheSecureFile(t *testing.T) {
	testenv.RequireBinary(t, "qemu-img")
	dir := t.TempDir()
	record := filepath.Join(dir, "dib-record")
	np := writeFileT(t, filepath.Join(dir, "nodepool.yaml"), fmt.Sprintf(`images-dir: %s
build-log-dir: %s
diskimages:
  - name: dib-image
    dib-cmd: %s
    elements: [debian-minimal]
    formats: [raw]
    rebuild-age: 604800
    env-vars:
      FAKE_DIB_RECORD: %s
      TEST_PUBLIC: from-nodepool-yaml
      TEST_SECRET: overridden
`, filepath.Join(dir, "images"), filepath.Join(dir, "logs"), fakeDIBCmd(t), record))
	writeSecure := func(value string) string {
		return writeFileT(t, filepath.Join(dir, "secure.conf"),
			"diskimages:\n  - name: dib-image\n    env-vars:\n      TEST_SECRET: "+value+"\n")
	}
	first, second := secureSecret+"-first", secureSecret+"-second"
	secure := writeSecure(first)
	os.Chmod(secure, 0o600)
	recorded := func(line string) bool {
		data, _ := os.ReadFile(record)
		return strings.Contains(string(data), line)
	}

	d := startDaemon(t, np, "-s", secure)
	testenv.WaitFor(t, 60*time.Second, "the first build, with the secure file's value", func() bool {
		return recorded("env: TEST_SECRET=" + first)
	}, d.logs.String)
	if !recorded("env: TEST_PUBLIC=from-nodepool-yaml") {
		t.Errorf("the build lacks nodepool.yaml's own env-vars")
	}
	testenv.WaitFor(t, 60*time.Second, "the first build to be ready", func() bool {
		r := runCmd("-c", np, "-s", secure, "dib-image-list", "--json")
		var builds []listing.Build
		return json.Unmarshal([]byte(r.stdout), &builds) == nil && len(builds) == 1 && builds[0].State == "ready"
	}, d.logs.String)

	writeSecure(second)
	d.waitLog(t, 30*time.Second, "config reloaded")
	if r := runCmd("-c", np, "-s", secure, "image-build", "dib-image"); r.code != exitOK {
		t.Fatalf("image-build -s exited %d:\n%s", r.code, r.stderr)
	}
	testenv.WaitFor(t, 60*time.Second, "the requested build, with the new value", func() bool {
		return recorded("env: TEST_SECRET=" + second)
	}, d.logs.String)

	// A broken secure file is reported, and the running config stays.
	writeFileT(t, secure, "diskimages:\n  - name: nope\n    env-vars: {TEST_SECRET: "+secureSecret+"}\n")
	testenv.WaitFor(t, 30*time.Second, "the broken secure file to be reported", func() bool {
		return strings.Contains(d.logs.String(), "config not reloaded") && strings.Contains(d.logs.String(), secure+":2: diskimages[0].name")
	}, d.logs.String)
	d.cmd.Process.Signal(syscall.SIGHUP)
	testenv.WaitFor(t, 30*time.Second, "SIGHUP's reload of the broken file to be refused", func() bool {
		return strings.Count(d.logs.String(), "config not reloaded") == 2
	}, d.logs.String)

	var shown []string
	for _, args := range [][]string{{"dib-image-list", "--json"}, {"image-status", "--json"}, {"image-list", "--json"}} {
		r := runCmd(append([]string{"-c", np}, args...)...)
		shown = append(shown, r.stdout, r.stderr)
	}
	if all := d.logs.String() + strings.Join(shown, ""); strings.Contains(all, secureSecret) {
		t.Errorf("a value of the secure file shows in the daemon's log or a listing:\n%s", all)
	}
}
