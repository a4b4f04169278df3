package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/internal/systemd"
	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
)

// writeFileT writes a file for a test, making its directory.
func writeFileT(t *testing.T, path, content string) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// runCmd runs the command with args and returns what it printed.
func runCmd(args ...string) result {
	var out, errb bytes.Buffer
	code := run(context.Background(), append([]string{"nodepool-builder"}, args...), &out, &errb)
	return result{code, out.String(), errb.String()}
}

// TestCloudsSearchNamedOnce: with the systemd unit's OS_CLIENT_CONFIG_FILE,
// /etc/openstack/clouds.yaml is both the file named and a place the search
// looks anyway; what the command prints names every file once.
func TestCloudsSearchNamedOnce(t *testing.T) {
	if _, err := os.Stat("/etc/openstack/clouds.yaml"); err == nil {
		testenv.Unavailable(t, "this machine has /etc/openstack/clouds.yaml, which every clouds.yaml search finds: move it aside to run this test")
	}
	dir := t.TempDir()
	work, home := filepath.Join(dir, "work"), filepath.Join(dir, "home")
	if err := os.MkdirAll(work, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Chdir(work)
	t.Setenv("HOME", home)
	t.Setenv("XDG_CONFIG_HOME", "")
	t.Setenv("OS_CLIENT_CONFIG_FILE", "/etc/openstack/clouds.yaml")
	cfg := writeFileT(t, filepath.Join(dir, "nodepool.yaml"), `images-dir: `+filepath.Join(dir, "images")+`
zuul-images:
  - name: debian
    api-url: https://zuul.example.com/
    tenant: example
    project: org/images
    job: build-debian
providers:
  - name: cloud-a
    cloud: cloud-a
    diskimages:
      - name: debian
`)
	places := []string{"/etc/openstack/clouds.yaml", filepath.Join(work, "clouds.yaml"), filepath.Join(home, ".config/openstack/clouds.yaml")}
	for _, tt := range []struct {
		name  string
		files []string // clouds.yaml files that exist, defining another cloud
		want  string
	}{
		{name: "no clouds.yaml", want: "no clouds.yaml found"},
		{name: "cloud missing", files: []string{places[1], places[2]}, want: `cloud "cloud-a" is not defined in ` + places[1]},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for _, f := range tt.files {
				writeFileT(t, f, "clouds:\n  other: {auth_type: none, image_endpoint_override: http://x}\n")
				os.Chmod(f, 0o600) // no warning that names it a second time
				t.Cleanup(func() { os.Remove(f) })
			}
			for _, args := range [][]string{{"-c", cfg, "--once"}, {"-c", cfg, "config-validate"}} {
				r := runCmd(args...)
				if r.code != exitUsage || !strings.Contains(r.stderr, tt.want) {
					t.Fatalf("%s exited %d, want %d and %q:\n%s", strings.Join(args, " "), r.code, exitUsage, tt.want, r.stderr)
				}
				for _, p := range places {
					if n := strings.Count(r.stderr, p); n != 1 {
						t.Errorf("%s names %s %d times, want once:\n%s", strings.Join(args, " "), p, n, r.stderr)
					}
				}
			}
		})
	}
}

// TestConfigValidateChecksWhatTheBuilderChecks: config-validate refuses (exit
// 2) what would stop the builder on this host, with the message the builder
// gives before its first step, and neither creates anything.
func TestConfigValidateChecksWhatTheBuilderChecks(t *testing.T) {
	dir := t.TempDir()
	clouds := writeFileT(t, filepath.Join(dir, "clouds.yaml"),
		"clouds:\n  cloud-a: {auth_type: none, image_endpoint_override: 'http://127.0.0.1:9/'}\n")
	notPEM := writeFileT(t, filepath.Join(dir, "not-a-cert.pem"), "not a certificate\n")
	aFile := writeFileT(t, filepath.Join(dir, "a-file"), "")
	images := filepath.Join(dir, "images")
	const (
		dibImage  = "diskimages:\n  - name: dib\n    dib-cmd: /bin/false\n"
		zuulImage = "zuul-images:\n  - name: zuul\n    api-url: https://zuul.example.com/\n    tenant: t\n    project: p\n    job: j\n"
	)
	provider := func(cloud string) string {
		return "providers:\n  - name: p1\n    cloud: " + cloud + "\n    diskimages:\n      - name: dib\n      - name: zuul\n"
	}
	base := func(extra ...string) string {
		s := "images-dir: " + images + "\nbuild-log-dir: " + filepath.Join(dir, "logs") + "\n" + dibImage + zuulImage + provider("cloud-a")
		for _, e := range extra {
			s += e
		}
		return s
	}
	tests := []struct {
		name     string
		config   string
		noClouds bool     // no clouds.yaml anywhere
		want     []string // in the message; nil: valid
		problems int      // the message lists this many (0: one, on the first line)
	}{
		{name: "valid", config: base()},
		{name: "cloud missing from clouds.yaml",
			config: strings.Replace(base(), "cloud: cloud-a", "cloud: cloud-b", 1),
			want:   []string{"provider p1", `cloud "cloud-b" is not defined in ` + clouds, "it defines: cloud-a"}},
		{name: "no clouds.yaml", config: base(), noClouds: true,
			want: []string{"provider p1 needs a clouds.yaml", "no clouds.yaml found", "OS_CLIENT_CONFIG_FILE"}},
		{name: "zookeeper-tls files",
			config: base("zookeeper-servers:\n  - host: 127.0.0.1\n    port: 2281\nzookeeper-tls:\n  cert: " + filepath.Join(dir, "absent.pem") +
				"\n  key: " + filepath.Join(dir, "absent.key") + "\n  ca: " + notPEM + "\n"),
			want: []string{"zookeeper-tls", "absent.pem", "absent.key", notPEM + " holds no PEM certificate"}},
		{name: "build-log-dir cannot be made",
			config: strings.Replace(base(), "build-log-dir: "+filepath.Join(dir, "logs"), "build-log-dir: "+filepath.Join(aFile, "logs"), 1),
			want:   []string{"build-log-dir " + filepath.Join(aFile, "logs") + " cannot be created", aFile + " is not a directory"}},
		{name: "zuul-image ca-cert",
			config: strings.Replace(base(), "    job: j\n", "    job: j\n    ca-cert: "+filepath.Join(dir, "absent-ca.pem")+"\n", 1),
			want:   []string{"zuul-image zuul", "ca-cert", "absent-ca.pem"}},
		{name: "images-dir not set", config: provider("cloud-a")[:strings.Index(provider("cloud-a"), "    diskimages:")],
			want: []string{"images-dir is not set"}},
		{name: "every problem at once",
			config: strings.NewReplacer("cloud: cloud-a", "cloud: cloud-b", "    job: j\n", "    job: j\n    ca-cert: "+notPEM+"\n",
				"build-log-dir: "+filepath.Join(dir, "logs"), "build-log-dir: "+filepath.Join(aFile, "logs")).Replace(
				base("zookeeper-servers:\n  - host: 127.0.0.1\n    port: 2281\nzookeeper-tls:\n  cert: " + notPEM + "\n  key: " + notPEM + "\n  ca: " + notPEM + "\n")),
			want:     []string{`cloud "cloud-b"`, "zuul-image zuul", "build-log-dir", "zookeeper-tls"},
			problems: 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("OS_CLIENT_CONFIG_FILE", clouds)
			if tt.noClouds {
				empty := t.TempDir()
				t.Chdir(empty)
				t.Setenv("HOME", empty)
				t.Setenv("XDG_CONFIG_HOME", "")
				t.Setenv("OS_CLIENT_CONFIG_FILE", filepath.Join(empty, "absent.yaml"))
				if _, err := os.Stat("/etc/openstack/clouds.yaml"); err == nil {
					testenv.Unavailable(t, "this machine has /etc/openstack/clouds.yaml, which every clouds.yaml search finds: move it aside to run this test")
				}
			}
			cfg := writeFileT(t, filepath.Join(t.TempDir(), "nodepool.yaml"), tt.config)
			validate := runCmd("-c", cfg, "config-validate")
			if tt.want == nil {
				if validate.code != exitOK {
					t.Fatalf("config-validate exited %d, want 0:\n%s", validate.code, validate.stderr)
				}
				return
			}
			once := runCmd("-c", cfg, "--once")
			for _, r := range []result{validate, once} {
				if r.code != exitUsage {
					t.Errorf("exited %d, want %d:\n%s%s", r.code, exitUsage, r.stdout, r.stderr)
				}
			}
			if validate.stderr != once.stderr {
				t.Errorf("config-validate and the builder say different things:\n%s\n%s", validate.stderr, once.stderr)
			}
			for _, s := range tt.want {
				if !strings.Contains(validate.stderr, s) {
					t.Errorf("the message does not say %q:\n%s", s, validate.stderr)
				}
			}
			if tt.problems > 0 && !strings.Contains(validate.stderr, fmt.Sprintf("(%d problems)", tt.problems)) {
				t.Errorf("the message does not list %d problems:\n%s", tt.problems, validate.stderr)
			}
			if _, err := os.Stat(images); !os.IsNotExist(err) {
				t.Errorf("the images-dir was created: %v", err)
			}
		})
	}
}

// unprivileged runs the test binary's main as a user who owns none of the
// test's files: nobody, when the tests run as root (as they do here). It
// returns the user's name, its group's, and how to run the builder as it in
// dir, after the words of wrapper (a command that runs the builder, e.g.
// setpriv --no-new-privs) when there are any.
func unprivileged(t *testing.T) (name, group string, runAs func(wrapper []string, dir string, args ...string) result) {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Unavailable(t, "running the builder as another user needs root")
	}
	u, err := user.Lookup("nobody")
	if err != nil {
		testenv.Unavailable(t, "no user nobody to run the builder as: %v", err)
	}
	g, err := user.LookupGroupId(u.Gid)
	if err != nil {
		testenv.Unavailable(t, "no group %s for nobody: %v", u.Gid, err)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	// The test binary, where nobody may run it.
	bin := filepath.Join(publicDir(t), "nodepool-builder.test")
	data, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return u.Username, g.Name, func(wrapper []string, dir string, args ...string) result {
		t.Helper()
		argv := append(append(slices.Clone(wrapper), bin), args...)
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Dir = dir
		cmd.Env = []string{"NODEPOOL_BUILDER_TEST_MAIN=1", "HOME=/nonexistent", "PATH=/usr/bin:/bin"}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatalf("run %s as %s: %v", bin, u.Username, err)
		}
		return result{cmd.ProcessState.ExitCode(), out.String(), errb.String()}
	}
}

// publicDir is a directory that every user may read and enter, removed when
// the test ends; t.TempDir's are the test user's alone.
func publicDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "nodepool-builder-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestImagesDirOfAnotherUser: a first start as root leaves the images-dir and
// its state root's; the service's user then gets, from the builder and from
// config-validate alike, exit code 2 and a message naming the paths, their
// owner, the user running and the chown that fixes it, not a bare "permission
// denied". An images-dir it cannot create is reported the same way, and
// nothing is made.
func TestImagesDirOfAnotherUser(t *testing.T) {
	name, group, runAs := unprivileged(t)
	base := publicDir(t)
	images := filepath.Join(base, "images")
	cfg := writeFileT(t, filepath.Join(base, "nodepool.yaml"), "images-dir: "+images+"\n")

	// Left by root: the state, the lock, the builder id, in an images-dir
	// closed to other users.
	if r := runCmd("-c", cfg, "--once"); r.code != exitOK {
		t.Fatalf("--once as root exited %d:\n%s", r.code, r.stderr)
	}
	var said []string
	for _, args := range [][]string{{"-c", cfg, "--once"}, {"-c", cfg, "config-validate"}} {
		r := runAs(nil, base, args...)
		if r.code != exitUsage {
			t.Errorf("%s as %s exited %d, want %d:\n%s", strings.Join(args, " "), name, r.code, exitUsage, r.stderr)
		}
		for _, s := range []string{"images-dir " + images + " cannot be written by " + name + " (uid ",
			images + " (owned by root, mode 0750)", "chown -R " + name + ": " + images} {
			if !strings.Contains(r.stderr, s) {
				t.Errorf("%s as %s does not say %q:\n%s", strings.Join(args, " "), name, s, r.stderr)
			}
		}
		// One problem: what cannot be read inside follows from it.
		if strings.Contains(r.stderr, "problems") || strings.Contains(r.stderr, "permission denied") {
			t.Errorf("%s as %s says more than the one problem:\n%s", strings.Join(args, " "), name, r.stderr)
		}
		said = append(said, r.stderr)
	}
	if said[0] != said[1] {
		t.Errorf("the builder and config-validate say different things:\n%s\n%s", said[0], said[1])
	}

	// An images-dir not made yet, in a directory of root's.
	fresh := filepath.Join(base, "fresh", "images")
	if err := os.Mkdir(filepath.Dir(fresh), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg = writeFileT(t, filepath.Join(base, "fresh.yaml"), "images-dir: "+fresh+"\n")
	r := runAs(nil, base, "-c", cfg, "--once")
	for _, s := range []string{"images-dir " + fresh + " does not exist", name + " (uid ", "cannot create it in " + filepath.Dir(fresh) +
		" (owned by root", "install -d -o " + name + " -g " + group + " " + fresh} {
		if r.code != exitUsage || !strings.Contains(r.stderr, s) {
			t.Errorf("--once as %s, images-dir not made: exited %d, want %d and %q:\n%s", name, r.code, exitUsage, s, r.stderr)
		}
	}
	if _, err := os.Stat(fresh); !os.IsNotExist(err) {
		t.Errorf("the images-dir was made: %v", err)
	}
}

// TestDiskImagesNeedRoot: a builder that builds diskimages checks, before its
// first step, that diskimage-builder can become root through sudo, instead of
// failing every build later. Under no_new_privs (set here by setpriv, as a
// systemd unit's sandbox or a container's no-new-privileges sets it) the
// builder and config-validate exit 2 and name it, and under systemd the
// drop-in that lifts it; a user whom sudoers does not let run sudo gets the
// rule to write. A builder whose diskimages are paused, or that leaves them
// to others, is never asked.
func TestDiskImagesNeedRoot(t *testing.T) {
	setpriv := testenv.RequireBinary(t, "setpriv")
	testenv.RequireBinary(t, "sudo")
	name, _, runAs := unprivileged(t)
	nobody, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(nobody.Uid)
	gid, _ := strconv.Atoi(nobody.Gid)
	base := publicDir(t)
	for _, d := range []string{"images", "logs"} {
		if err := os.Mkdir(filepath.Join(base, d), 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(filepath.Join(base, d), uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	config := func(file, extra string) string {
		return writeFileT(t, filepath.Join(base, file), "images-dir: "+filepath.Join(base, "images")+"\nbuild-log-dir: "+
			filepath.Join(base, "logs")+"\ndiskimages:\n  - name: dib\n    dib-cmd: /bin/false\n"+extra)
	}
	builds := config("builds.yaml", "")
	paused := config("paused.yaml", "    pause: true\n")
	leaves := config("leaves.yaml", "builder:\n  build-diskimages: false\n")
	noNewPrivs := []string{setpriv, "--no-new-privs"}
	underSystemd := append([]string{"/usr/bin/env", "INVOCATION_ID=0123456789abcdef0123456789abcdef"}, noNewPrivs...)

	for _, tt := range []struct {
		name    string
		wrapper []string
		config  string
		want    []string // nil: valid
		wantNot []string
	}{
		{name: "sudo refused", config: builds,
			want: []string{"sudo -n true, run as " + name + ", fails", "a password is required", name + " ALL=(ALL) NOPASSWD: ALL"}},
		{name: "no_new_privs", wrapper: noNewPrivs, config: builds,
			want: []string{"no_new_privs set, so sudo cannot gain root", "start it without"}, wantNot: []string{"drop-in", "sudo -n true"}},
		{name: "no_new_privs under systemd", wrapper: underSystemd, config: builds,
			want: []string{"no_new_privs set", "NoNewPrivileges=yes", "ln -s " + systemd.DIBDropIn + " " + systemd.DropInDir + "/"}},
		{name: "diskimages paused", wrapper: noNewPrivs, config: paused},
		{name: "build-diskimages false", wrapper: noNewPrivs, config: leaves},
	} {
		t.Run(tt.name, func(t *testing.T) {
			validate := runAs(tt.wrapper, base, "-c", tt.config, "config-validate")
			if tt.want == nil {
				if validate.code != exitOK {
					t.Fatalf("config-validate as %s exited %d, want 0:\n%s", name, validate.code, validate.stderr)
				}
				return
			}
			once := runAs(tt.wrapper, base, "-c", tt.config, "--once")
			for _, r := range []result{validate, once} {
				if r.code != exitUsage {
					t.Errorf("exited %d, want %d:\n%s", r.code, exitUsage, r.stderr)
				}
			}
			if validate.stderr != once.stderr {
				t.Errorf("config-validate and the builder say different things:\n%s\n%s", validate.stderr, once.stderr)
			}
			for _, s := range tt.want {
				if !strings.Contains(once.stderr, s) {
					t.Errorf("the builder does not say %q:\n%s", s, once.stderr)
				}
			}
			for _, s := range tt.wantNot {
				if strings.Contains(once.stderr, s) {
					t.Errorf("the builder says %q:\n%s", s, once.stderr)
				}
			}
			if strings.Contains(once.stderr, "problems") {
				t.Errorf("the builder finds more than the one problem:\n%s", once.stderr)
			}
		})
	}
}

// TestConfigValidateWarnsOfCredentialsOverHTTP: a Zuul token, an api-url's
// password or a cloud's login that would go over plain http is warned about by
// config-validate, which still passes the config, in the log format asked for,
// and without the password; --once, stopped by a problem, warns the same.
func TestConfigValidateWarnsOfCredentialsOverHTTP(t *testing.T) {
	const password = "pw-0a7d"
	dir := t.TempDir()
	clouds := writeFileT(t, filepath.Join(dir, "clouds.yaml"), `clouds:
  cloud-a:
    auth: {auth_url: 'http://ks:`+password+`@keystone.example.org:5000/v3', username: u, password: `+password+`,
           user_domain_name: Default, project_name: ci, project_domain_name: Default}
`)
	t.Setenv("OS_CLIENT_CONFIG_FILE", clouds)
	token := writeFileT(t, filepath.Join(dir, "zuul.token"), "tok\n")
	// Readable by the builder's user alone, so that only the warnings of plain http are given.
	for _, f := range []string{clouds, token} {
		if err := os.Chmod(f, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg := writeFileT(t, filepath.Join(dir, "nodepool.yaml"), "images-dir: "+filepath.Join(dir, "images")+`
diskimages:
  - name: zuul
    pause: true
providers:
  - name: p1
    cloud: cloud-a
    diskimages:
      - name: zuul
`)
	own := `zuul-images:
  - name: zuul
    api-url: http://ci:` + password + `@zuul.example.org/
    tenant: t
    project: p
    job: j
    auth-token-file: ` + token + `
`
	writeFileT(t, filepath.Join(dir, config.BuilderFileName), own)
	want := []string{
		"nodepool-builder: warning: provider p1 (cloud cloud-a): a login to this cloud sends auth.password and the user:password@ of auth_url over plain http:// to Keystone at http://keystone.example.org:5000/v3",
		"nodepool-builder: warning: zuul-image zuul: the Zuul token of auth-token-file is sent over plain http:// to http://zuul.example.org/",
		"nodepool-builder: warning: zuul-image zuul: the credentials in api-url (user:password@) are sent over plain http:// to http://zuul.example.org/",
	}
	text := runCmd("-c", cfg, "config-validate")
	if text.code != exitOK || !strings.Contains(text.stdout, "are valid") {
		t.Fatalf("config-validate exited %d, want 0 and the config valid:\n%s%s", text.code, text.stdout, text.stderr)
	}
	for _, w := range want {
		if !strings.Contains(text.stderr, w) {
			t.Errorf("config-validate does not warn %q:\n%s", w, text.stderr)
		}
	}
	js := runCmd("-c", cfg, "--log-format", "json", "config-validate")
	if js.code != exitOK || strings.Count(js.stderr, `"level":"WARN"`) != len(want) || !strings.Contains(js.stderr, `"msg":"zuul-image zuul: the Zuul token`) {
		t.Errorf("config-validate --log-format json exited %d, want 0 and %d JSON warnings:\n%s", js.code, len(want), js.stderr)
	}
	// A problem stops --once before it opens anything: it warns as config-validate does.
	broken := writeFileT(t, filepath.Join(dir, "broken.yaml"), strings.Replace(own, "    auth-token-file:", "    ca-cert: "+token+"\n    auth-token-file:", 1))
	validate := runCmd("-c", cfg, "--builder-config", broken, "config-validate")
	once := runCmd("-c", cfg, "--builder-config", broken, "--once")
	if validate.code != exitUsage || once.stderr != validate.stderr || !strings.Contains(once.stderr, want[0]) {
		t.Errorf("with a problem, config-validate (exit %d) and --once (exit %d) say different things, or no warning:\n%s\n%s",
			validate.code, once.code, validate.stderr, once.stderr)
	}
	if all := text.stderr + js.stderr + once.stderr; strings.Contains(all, password) {
		t.Errorf("the password shows:\n%s", all)
	}
}

// TestConfigValidateReadsBothFiles: config-validate reads nodepool.yaml and
// the builder's own file beside it, or the one --builder-config names, and
// says in which file each problem is; a named file that is missing is a usage
// error that names it.
func TestConfigValidateReadsBothFiles(t *testing.T) {
	dir := t.TempDir()
	np := writeFileT(t, filepath.Join(dir, "nodepool.yaml"), "images-dir: "+filepath.Join(dir, "images")+`
build-log-retention: many
diskimages:
  - name: zuul
    pause: true
`)
	own := writeFileT(t, filepath.Join(dir, config.BuilderFileName), `zuul-images:
  - name: zuul
    api-url: https://zuul.example.org/
    project: p
    job: j
builder:
  keep-builds: 0
`)
	r := runCmd("-c", np, "config-validate")
	for _, want := range []string{np + ":2: build-log-retention: ", own + ":7: builder.keep-builds: "} {
		if r.code != exitUsage || !strings.Contains(r.stderr, want) {
			t.Errorf("config-validate exited %d, want %d and an error starting %q:\n%s", r.code, exitUsage, want, r.stderr)
		}
	}
	missing := filepath.Join(dir, "elsewhere.yaml")
	r = runCmd("-c", np, "--builder-config", missing, "config-validate")
	if r.code != exitUsage || !strings.Contains(r.stderr, "read builder config "+missing) {
		t.Errorf("config-validate with a missing --builder-config exited %d, want %d and the file named:\n%s", r.code, exitUsage, r.stderr)
	}
}
