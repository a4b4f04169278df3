//go:build packaging

package packaging

import (
	"debug/buildinfo"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
)

// Where the package puts things, and where the operator's config goes.
const (
	installedBinary = "/usr/bin/nodepool-builder"
	installedUnit   = "/lib/systemd/system/nodepool-builder.service"
	sudoersDropIn   = "/etc/sudoers.d/nodepool-builder"
	stateDir        = "/var/lib/nodepool"
	logDir          = "/var/log/nodepool"
	configDir       = "/etc/nodepool"
	examplesDir     = "/usr/share/doc/nodepool-builder/examples"
)

// TestDeb installs the package on this machine as an operator does, checks
// what it installed, runs the builder --once as its user against a stand-in
// Zuul and a real Glance, upgrades it, removes it and purges it; then puts
// the machine back as it was.
func TestDeb(t *testing.T) {
	deb := required(t, "PACKAGE_DEB")
	if os.Getuid() != 0 {
		testenv.Unavailable(t, "installing a package needs root")
	}
	dpkg := testenv.RequireBinary(t, "dpkg")
	if status(t) != "not-installed" {
		t.Fatalf("nodepool-builder is already installed here (%s); the test installs its own: dpkg -P nodepool-builder first", status(t))
	}
	for _, name := range []string{"nodepool.yaml", "nodepool-builder.yaml", "clouds.yaml"} {
		if _, err := os.Stat(filepath.Join(configDir, name)); err == nil {
			t.Fatalf("%s/%s exists: the test would write over it", configDir, name)
		}
	}
	restoreMachine(t)
	st := newStage(t)

	run(t, dpkg, "-i", deb)
	if got := status(t); got != "installed" {
		t.Fatalf("after dpkg -i the package is %q", got)
	}
	checkInstalled(t, deb)
	nodepool := lookupUser(t)
	st.writeConfig(t, configDir, filepath.Join(stateDir, "images"), nodepool.gid)
	out, err := asNodepool(t, nodepool, "-c", filepath.Join(configDir, "nodepool.yaml"), "--once").CombinedOutput()
	if err != nil {
		t.Fatalf("nodepool-builder --once as the nodepool user: %v\n%s", err, out)
	}
	t.Logf("nodepool-builder --once:\n%s", out)
	st.activeImage(t)

	// The operator's edit of the package's conffile and their config
	// survive an upgrade, a remove, and (the config) a purge.
	edited := append(readFile(t, sudoersDropIn), "# the operator's\n"...)
	if err := os.WriteFile(sudoersDropIn, edited, 0o440); err != nil {
		t.Fatal(err)
	}
	upgrade(t, deb, nodepool)
	if got := readFile(t, sudoersDropIn); string(got) != string(edited) {
		t.Errorf("the upgrade replaced the operator's %s:\n%s", sudoersDropIn, got)
	}

	run(t, dpkg, "-r", "nodepool-builder")
	if got := status(t); got != "config-files" {
		t.Errorf("after dpkg -r the package is %q, want config-files", got)
	}
	mustNotExist(t, installedBinary, installedUnit)
	mustExist(t, sudoersDropIn, filepath.Join(configDir, "nodepool.yaml"), filepath.Join(stateDir, "images"))

	run(t, dpkg, "-P", "nodepool-builder")
	if got := status(t); got != "not-installed" {
		t.Errorf("after dpkg -P the package is %q, want not-installed", got)
	}
	mustNotExist(t, sudoersDropIn)
	// What the package did not put there is not the package's to remove: the
	// operator's config, the images and state (which name cloud images), the user.
	mustExist(t, filepath.Join(configDir, "nodepool.yaml"), filepath.Join(stateDir, "images"))
	if _, err := user.Lookup("nodepool"); err != nil {
		t.Errorf("the purge removed the nodepool user: %v", err)
	}
}

// TestDebKeepsDirsInUse: a directory of the package's (/etc/nodepool,
// /var/lib/nodepool, /var/log/nodepool) that already holds files, a Python
// nodepool's read by another user, keeps its owner and mode when the package
// is installed: closing its config would lock that nodepool out, and its
// build logs the web server that publishes them.
func TestDebKeepsDirsInUse(t *testing.T) {
	deb := required(t, "PACKAGE_DEB")
	if os.Getuid() != 0 {
		testenv.Unavailable(t, "installing a package needs root")
	}
	dpkg := testenv.RequireBinary(t, "dpkg")
	if status(t) != "not-installed" {
		t.Fatalf("nodepool-builder is already installed here (%s); the test installs its own: dpkg -P nodepool-builder first", status(t))
	}
	// Another user's, as a Python nodepool's directories are.
	const owner = 4242
	inUse := map[string]string{
		configDir: "launcher.yaml",
		stateDir:  "images/debian-0000000001.qcow2",
		logDir:    "builds/debian-0000000001.log",
	}
	for dir := range inUse {
		if _, err := os.Stat(dir); err == nil {
			t.Fatalf("%s exists: the test makes its own", dir)
		}
	}
	restoreMachine(t)
	for dir, file := range inUse {
		path := filepath.Join(dir, file)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte("Python nodepool's\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(dir, owner, owner); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	run(t, dpkg, "-i", deb)
	for dir, file := range inUse {
		fi, err := os.Stat(dir)
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); fi.Mode() != fs.ModeDir|0o755 || st.Uid != owner || st.Gid != owner {
			t.Errorf("the install made %s, which held %s, mode %v owner %d:%d; want it left 0755 %d:%d",
				dir, file, fi.Mode(), st.Uid, st.Gid, owner, owner)
		}
	}
}

// TestDebExamplesRunTheInstalledBinary: the examples the package ships in
// its docs run the binary where the package puts it, /usr/bin, as the unit
// it installs does: none names /usr/local/bin, where a binary built from
// source goes, and the example unit is the installed one. It reads the
// package's files without installing it.
func TestDebExamplesRunTheInstalledBinary(t *testing.T) {
	deb := required(t, "PACKAGE_DEB")
	tree := t.TempDir()
	run(t, "dpkg-deb", "-x", deb, tree)
	examples := filepath.Join(tree, examplesDir)
	found := 0
	err := filepath.WalkDir(examples, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		found++
		if data := readFile(t, path); strings.Contains(string(data), "/usr/local/bin") {
			rel, _ := filepath.Rel(tree, path)
			t.Errorf("/%s names /usr/local/bin; the package's binary is %s", rel, installedBinary)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if found == 0 {
		t.Fatalf("the package has no examples in %s", examplesDir)
	}
	unit := readFile(t, filepath.Join(tree, installedUnit))
	if example := readFile(t, filepath.Join(examples, "nodepool-builder.service")); string(example) != string(unit) {
		t.Errorf("the example unit differs from the installed %s:\n%s", installedUnit, example)
	}
	if !strings.Contains(string(unit), "\nExecStart="+installedBinary+" ") {
		t.Errorf("the installed unit does not run %s:\n%s", installedBinary, unit)
	}
}

// TestLintian: Debian's package checker finds no error in the package.
func TestLintian(t *testing.T) {
	deb := required(t, "PACKAGE_DEB")
	out, err := command(t, testenv.RequireBinary(t, "lintian"), "--fail-on", "error", deb).CombinedOutput()
	t.Logf("lintian:\n%s", out)
	if err != nil {
		t.Errorf("lintian %s: %v", deb, err)
	}
}

// checkInstalled checks the files, modes, user and unit the package installed.
func checkInstalled(t *testing.T, deb string) {
	t.Helper()
	version := strings.TrimSpace(run(t, "dpkg-deb", "-f", deb, "Version"))
	if got := run(t, installedBinary, "--version"); !strings.HasPrefix(got, "nodepool-builder version "+version+" ") {
		t.Errorf("--version prints %q; the package's version is %s", got, version)
	}
	checkNoCgo(t, installedBinary)
	u := lookupUser(t)
	if u.uid >= 1000 || u.home != stateDir {
		t.Errorf("nodepool user: uid %d, home %s; want a system user (uid below 1000) at home in %s", u.uid, u.home, stateDir)
	}
	for _, f := range []struct {
		path  string
		mode  fs.FileMode
		owner int
	}{
		{installedBinary, 0o755, 0},
		{installedUnit, 0o644, 0},
		{sudoersDropIn, 0o440, 0},
		{stateDir, fs.ModeDir | 0o750, u.uid},
		{logDir, fs.ModeDir | 0o750, u.uid},
		{filepath.Join(examplesDir, "nodepool.yaml"), 0o644, 0},
		{filepath.Join(examplesDir, "nodepool-builder.yaml"), 0o644, 0},
		{filepath.Join(examplesDir, "logrotate.d", "nodepool-builder"), 0o644, 0},
		{"/usr/share/nodepool-builder/dib.conf", 0o644, 0},
		{"/usr/share/doc/nodepool-builder/copyright", 0o644, 0},
		{"/usr/share/doc/nodepool-builder/docs/installation.md.gz", 0o644, 0},
		{"/usr/share/doc/nodepool-builder/CHANGELOG.md.gz", 0o644, 0},
	} {
		fi, err := os.Stat(f.path)
		if err != nil {
			t.Error(err)
			continue
		}
		if fi.Mode() != f.mode || int(fi.Sys().(*syscall.Stat_t).Uid) != f.owner {
			t.Errorf("%s: mode %v, owner %d; want %v, %d", f.path, fi.Mode(), fi.Sys().(*syscall.Stat_t).Uid, f.mode, f.owner)
		}
	}
	checkConfigDir(t, u)
	if conffiles := run(t, "dpkg-query", "--control-show", "nodepool-builder", "conffiles"); strings.TrimSpace(conffiles) != sudoersDropIn {
		t.Errorf("conffiles: %q; want %s alone", conffiles, sudoersDropIn)
	}
	run(t, testenv.RequireBinary(t, "visudo"), "-c", "-f", sudoersDropIn)

	unit := string(readFile(t, installedUnit))
	for _, want := range []string{"\nUser=nodepool\n", "\nExecStart=/usr/bin/nodepool-builder ", "\nReadWritePaths=/var/lib/nodepool /var/log/nodepool\n"} {
		if !strings.Contains(unit, want) {
			t.Errorf("the installed unit lacks %q", strings.TrimSpace(want))
		}
	}
	if code, about := testenv.VerifyUnit(t, installedUnit); code != 0 || about != "" {
		t.Errorf("systemd-analyze verify of the installed unit exited %d saying:\n%s", code, about)
	}
	if code, out := testenv.SystemdAnalyze(t, "security", "--offline=yes", "--threshold=20", installedUnit); code != 0 {
		t.Errorf("the installed unit is exposed above 2.0:\n%s", out)
	}
}

// checkConfigDir checks that /etc/nodepool, which holds the secrets, is
// root's and the nodepool group's alone, as installation.md says.
func checkConfigDir(t *testing.T, u account) {
	t.Helper()
	fi, err := os.Stat(configDir)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if fi.Mode() != fs.ModeDir|0o750 || st.Uid != 0 || int(st.Gid) != u.gid {
		t.Errorf("%s: mode %v, owner %d:%d; want %v, root:nodepool (0:%d)", configDir, fi.Mode(), st.Uid, st.Gid, fs.ModeDir|0o750, u.gid)
	}
}

// checkNoCgo checks that the binary was built without cgo, and so with a
// SQLite driver in Go: it needs no C library.
func checkNoCgo(t *testing.T, binary string) {
	t.Helper()
	info, err := buildinfo.ReadFile(binary)
	if err != nil {
		t.Fatal(err)
	}
	cgo := ""
	for _, s := range info.Settings {
		if s.Key == "CGO_ENABLED" {
			cgo = s.Value
		}
	}
	if cgo != "0" {
		t.Errorf("%s was built with CGO_ENABLED=%q, want 0", binary, cgo)
	}
	for _, d := range info.Deps {
		if d.Path == "github.com/mattn/go-sqlite3" {
			t.Errorf("%s links %s, a SQLite driver in C", binary, d.Path)
		}
	}
}

// upgrade installs the same package under a later version, as an operator
// upgrades: the user, its files and the images stay.
func upgrade(t *testing.T, deb string, before account) {
	t.Helper()
	next, version := laterDeb(t, deb, t.TempDir())
	run(t, "dpkg", "-i", next)
	if got := strings.TrimSpace(run(t, "dpkg-query", "-W", "-f", "${Version}", "nodepool-builder")); got != version {
		t.Errorf("after the upgrade the installed version is %s, want %s", got, version)
	}
	if after := lookupUser(t); after != before {
		t.Errorf("the upgrade changed the nodepool user from %+v to %+v", before, after)
	}
	mustExist(t, filepath.Join(stateDir, "images"))
	if fi, err := os.Stat(stateDir); err != nil || int(fi.Sys().(*syscall.Stat_t).Uid) != before.uid {
		t.Errorf("after the upgrade %s is not the nodepool user's: %v", stateDir, err)
	}
	checkConfigDir(t, before)
}

// laterDeb writes into dir the package deb under a later version, and returns
// its path and that version: the same files, as an upgrade brings them.
func laterDeb(t *testing.T, deb, dir string) (path, version string) {
	t.Helper()
	tree := t.TempDir()
	run(t, "dpkg-deb", "-R", deb, tree)
	control := filepath.Join(tree, "DEBIAN", "control")
	was := strings.TrimSpace(run(t, "dpkg-deb", "-f", deb, "Version"))
	version = was + "+later"
	later := strings.Replace(string(readFile(t, control)), "\nVersion: "+was+"\n", "\nVersion: "+version+"\n", 1)
	if err := os.WriteFile(control, []byte(later), 0o644); err != nil {
		t.Fatal(err)
	}
	path = filepath.Join(dir, "nodepool-builder_"+version+".deb")
	run(t, "dpkg-deb", "--root-owner-group", "-b", tree, path)
	return path, version
}

// account is the nodepool user as the test needs it.
type account struct {
	uid, gid int
	home     string
}

func lookupUser(t *testing.T) account {
	t.Helper()
	u, err := user.Lookup("nodepool")
	if err != nil {
		t.Fatalf("the package made no nodepool user: %v", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if g, err := user.LookupGroup("nodepool"); err != nil || g.Gid != u.Gid {
		t.Errorf("the nodepool user's group is not nodepool: %v", err)
	}
	return account{uid, gid, u.HomeDir}
}

// asNodepool is the installed builder run as the nodepool user, with the
// environment the unit gives it.
func asNodepool(t *testing.T, u account, args ...string) *exec.Cmd {
	cmd := command(t, installedBinary, args...)
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + u.home,
		"OS_CLIENT_CONFIG_FILE=" + filepath.Join(configDir, "clouds.yaml")}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(u.uid), Gid: uint32(u.gid), Groups: []uint32{}}}
	return cmd
}

// status is the package's state in dpkg's database: installed,
// config-files, not-installed...
func status(t *testing.T) string {
	t.Helper()
	out, err := command(t, "dpkg-query", "-W", "-f", "${db:Status-Status}", "nodepool-builder").Output()
	if err != nil || len(out) == 0 {
		return "not-installed" // dpkg-query knows no package of that name
	}
	return string(out)
}

// restoreMachine purges the package when the test ends, and removes what
// purging leaves by design (the user, the state and the operator's config)
// when the test made it.
func restoreMachine(t *testing.T) {
	t.Helper()
	_, userErr := user.Lookup("nodepool")
	existed := map[string]bool{}
	for _, dir := range []string{stateDir, logDir, configDir} {
		_, err := os.Stat(dir)
		existed[dir] = err == nil
	}
	t.Cleanup(func() {
		if status(t) != "not-installed" {
			if out, err := command(t, "dpkg", "-P", "nodepool-builder").CombinedOutput(); err != nil {
				t.Errorf("dpkg -P nodepool-builder: %v\n%s", err, out)
			}
		}
		for _, name := range []string{"nodepool.yaml", "nodepool-builder.yaml", "clouds.yaml"} {
			os.Remove(filepath.Join(configDir, name))
		}
		for dir, had := range existed {
			if !had {
				os.RemoveAll(dir)
			}
		}
		if userErr != nil {
			if out, err := command(t, "deluser", "--quiet", "--system", "nodepool").CombinedOutput(); err != nil {
				t.Errorf("deluser nodepool: %v\n%s", err, out)
			}
			if _, err := user.LookupGroup("nodepool"); err == nil {
				command(t, "delgroup", "--quiet", "--system", "nodepool").Run()
			}
		}
	})
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func mustExist(t *testing.T, paths ...string) {
	t.Helper()
	for _, p := range paths {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s is gone: %v", p, err)
		}
	}
}

func mustNotExist(t *testing.T, paths ...string) {
	t.Helper()
	for _, p := range paths {
		if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s is still there (%v)", p, err)
		}
	}
}
