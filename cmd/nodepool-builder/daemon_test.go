package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/listing"
	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

// TestMain lets a test run this binary's main as a child process, so the daemon
// can be stopped with a real SIGTERM.
func TestMain(m *testing.M) {
	if os.Getenv("NODEPOOL_BUILDER_TEST_MAIN") == "1" {
		main()
		return
	}
	code := m.Run()
	if err := testenv.StopSharedKeystone(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	os.Exit(code)
}

// killOnLine passes a child's output on, and kills the child with SIGKILL the
// moment the output holds line. exec.Cmd makes one Write at a time when Stdout
// and Stderr are the same writer.
type killOnLine struct {
	out  io.Writer
	cmd  *exec.Cmd
	line []byte
	tail []byte // a line may come in two writes
}

func (k *killOnLine) Write(p []byte) (int, error) {
	seen := append(k.tail, p...)
	if bytes.Contains(seen, k.line) {
		k.cmd.Process.Signal(syscall.SIGKILL)
	}
	k.tail = append([]byte(nil), seen[max(0, len(seen)-len(k.line)):]...)
	return k.out.Write(p)
}

func TestDaemonUploadsAsBuildsArriveAndStopsOnSIGTERM(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	e.writeConfig("    poll-interval: 1\n")
	e.addBuild(e.makeImage(1), zuultest.BuildSpec{})

	pidFile := filepath.Join(e.dir, "run", "nodepool-builder.pid")
	d := startDaemon(t, e.cfgPath, "-p", pidFile)
	logs := d.logs
	if pid, err := os.ReadFile(pidFile); err != nil || strings.TrimSpace(string(pid)) != fmt.Sprint(d.cmd.Process.Pid) {
		t.Errorf("pid file holds %q (%v), want %d", pid, err, d.cmd.Process.Pid)
	}

	ready := func(n int) func() bool {
		return func() bool {
			count := 0
			for _, row := range e.uploadsJSON() {
				if row.State == "ready" {
					count++
				}
			}
			return count == n && len(e.images("cloud-q")) == n/2 && len(e.images("cloud-r")) == n/2
		}
	}
	testenv.WaitFor(t, 60*time.Second, "the first build's uploads", ready(2), logs.String)

	// A second instance is refused while the daemon runs.
	if r := e.run("--once"); r.code != exitLocked {
		t.Fatalf("second builder exited %d, want %d: %s", r.code, exitLocked, r.stderr)
	}

	// New builds are picked up on the next poll and rotated.
	e.addBuild(e.makeImage(2), zuultest.BuildSpec{})
	testenv.WaitFor(t, 60*time.Second, "the second build's uploads", ready(4), logs.String)
	e.addBuild(e.makeImage(3), zuultest.BuildSpec{})
	testenv.WaitFor(t, 60*time.Second, "rotation to the third build", func() bool {
		builds := e.buildsJSON()
		return ready(4)() && len(builds) == 2 && builds[0].State == "ready"
	}, logs.String)

	d.stop(t, 30*time.Second)
	if !strings.Contains(logs.String(), "msg=stopped") {
		t.Errorf("daemon did not log a clean stop:\n%s", logs.String())
	}
	if _, err := os.Stat(pidFile); !os.IsNotExist(err) {
		t.Errorf("the pid file outlived the daemon: %v", err)
	}
}

// daemon is the real main running in a child process.
type daemon struct {
	cmd    *exec.Cmd
	logs   *testenv.Buffer // its stdout and stderr
	exited chan struct{}   // closed once it has exited
	err    error           // how it exited; set before exited is closed
}

// startDaemon runs the real main as a daemon in a child process and waits until
// it has opened its store. At cleanup, a daemon still running is stopped with
// SIGTERM, or killed after 30 s.
func startDaemon(t *testing.T, cfgPath string, args ...string) *daemon {
	t.Helper()
	d := startMain(t, "", append([]string{"-c", cfgPath}, args...)...)
	// The listings read the state the daemon creates: wait until it has.
	testenv.WaitFor(t, 30*time.Second, "the daemon to open its store", func() bool {
		select {
		case <-d.exited:
			t.Fatalf("the daemon exited at start: %v\n%s", d.err, d.logs.String())
		default:
		}
		return strings.Contains(d.logs.String(), `msg="builder ready"`)
	}, d.logs.String)
	return d
}

// startMain runs the real main with args in a child process. When killOn is
// set, the child is killed with SIGKILL the moment it logs a line holding it.
func startMain(t *testing.T, killOn string, args ...string) *daemon {
	t.Helper()
	return startChild(t, func(cmd *exec.Cmd, logs io.Writer) io.Writer {
		if killOn == "" {
			return logs
		}
		return &killOnLine{out: logs, cmd: cmd, line: []byte(killOn)}
	}, args...)
}

// startChild runs the real main with args in a child process, its output
// going through what wrap puts in front of the daemon's logs. At cleanup the
// child is stopped (let go on first, should a test have stopped it) and what
// the race detector found in it fails the test.
func startChild(t *testing.T, wrap func(cmd *exec.Cmd, logs io.Writer) io.Writer, args ...string) *daemon {
	t.Helper()
	d := &daemon{cmd: exec.Command(os.Args[0], args...), logs: &testenv.Buffer{}, exited: make(chan struct{})}
	d.cmd.Env = append(os.Environ(), "NODEPOOL_BUILDER_TEST_MAIN=1")
	out := wrap(d.cmd, d.logs)
	d.cmd.Stdout, d.cmd.Stderr = out, out
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		d.err = d.cmd.Wait()
		close(d.exited)
	}()
	t.Cleanup(func() {
		d.cmd.Process.Signal(syscall.SIGCONT)
		d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.exited:
		case <-time.After(30 * time.Second):
			d.cmd.Process.Kill()
			<-d.exited
		}
		// Under -race the child is instrumented too: what it found fails the test.
		if races := raceReports(d.logs.String()); len(races) > 0 {
			t.Errorf("the race detector reported in the child %v:\n%s", args, d.logs.String())
		}
	})
	return d
}

// stop ends the child with SIGTERM, as systemd stops the unit, and fails the
// test unless it exits cleanly within the time given.
func (d *daemon) stop(t *testing.T, within time.Duration) {
	t.Helper()
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.exited:
		if d.err != nil {
			t.Fatalf("daemon exited with %v after SIGTERM\n%s", d.err, d.logs.String())
		}
	case <-time.After(within):
		t.Fatalf("daemon did not stop within %s of SIGTERM\n%s", within, d.logs.String())
	}
}

// kill ends the child with SIGKILL and waits for it.
func (d *daemon) kill() {
	d.cmd.Process.Signal(syscall.SIGKILL)
	<-d.exited
}

// waitLog waits until the child has logged a line holding s.
func (d *daemon) waitLog(t *testing.T, timeout time.Duration, s string) {
	t.Helper()
	testenv.WaitFor(t, timeout, "the log to say "+s, func() bool { return strings.Contains(d.logs.String(), s) }, d.logs.String)
}

func TestDaemonReloadsConfig(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	ownPath := filepath.Join(filepath.Dir(e.cfgPath), config.BuilderFileName)
	// nodepool.yaml declares the zuul-image when declared is set; the
	// builder's own file beside it holds the zuul-images.
	write := func(qImages, rImages string, declared bool) {
		declaration := "diskimages: []\n"
		if declared {
			declaration = "diskimages:\n  - name: debian\n    pause: true\n"
		}
		cfg := fmt.Sprintf(`images-dir: %s
%sproviders:
  - name: cloud-q
    cloud: %s
    image-format: qcow2
    diskimages:
%s  - name: cloud-r
    cloud: %s
    image-format: raw
    diskimages:
%s`, filepath.Join(e.dir, "images"), declaration, e.glance.Cloud, qImages, e.glance.Cloud, rImages)
		if err := os.WriteFile(e.cfgPath, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeOwn := func(images string) {
		if err := os.WriteFile(ownPath, []byte("zuul-images:\n"+images), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	image := fmt.Sprintf("  - name: debian\n    api-url: %s\n    tenant: example\n    project: org/images\n    job: build-debian\n    poll-interval: 1\n", e.zuul.URL())
	listed := "      - name: debian\n"
	write(listed, "      []\n", true)
	writeOwn(image)
	e.addBuild(e.makeImage(1), zuultest.BuildSpec{})
	d := startDaemon(t, e.cfgPath)
	logs := d.logs
	count := func(p string) func() bool {
		return func() bool { return len(e.images(p)) == 1 }
	}
	testenv.WaitFor(t, 60*time.Second, "the upload to cloud-q", count("cloud-q"), logs.String)

	// A provider newly listing the image gets the current build (its format fetched now).
	write(listed, listed, true)
	testenv.WaitFor(t, 60*time.Second, "the upload to the newly listing cloud-r (file change)", count("cloud-r"), logs.String)
	if n := len(e.buildsJSON()); n != 1 {
		t.Fatalf("a new build was made for the new provider: %d builds", n)
	}

	// An image removed from a provider's list: its uploads there go (SIGHUP).
	write("      []\n", listed, true)
	d.cmd.Process.Signal(syscall.SIGHUP)
	testenv.WaitFor(t, 60*time.Second, "the uploads in cloud-q to go", func() bool { return len(e.images("cloud-q")) == 0 }, logs.String)
	if len(e.images("cloud-r")) != 1 {
		t.Fatal("cloud-r's upload went too")
	}

	// A broken config is reported and the running one stays.
	os.WriteFile(e.cfgPath, []byte("providers: [\n"), 0o644)
	refusals := func() int { return strings.Count(logs.String(), "config not reloaded") }
	testenv.WaitFor(t, 30*time.Second, "the broken config to be reported", func() bool { return refusals() == 1 }, logs.String)

	// A zuul-image whose declaration left nodepool.yaml is refused, naming
	// what to add: the running config stays.
	write("      []\n", "      []\n", false)
	testenv.WaitFor(t, 30*time.Second, "the undeclared zuul-image to be reported", func() bool {
		return refusals() == 2 && strings.Contains(logs.String(), `\"debian\" is not declared in `+e.cfgPath)
	}, logs.String)
	if len(e.images("cloud-r")) != 1 {
		t.Fatal("cloud-r's upload went on a config that was refused")
	}

	// An image removed from the config, the builder's own file changing
	// last: its uploads, files and records go once SIGHUP confirms it (it
	// releases every upload of the image and of cloud-r).
	writeOwn("  []\n")
	d.cmd.Process.Signal(syscall.SIGHUP)
	testenv.WaitFor(t, 60*time.Second, "everything of the removed image to go", func() bool {
		files, _ := filepath.Glob(filepath.Join(e.dir, "images", "debian-*"))
		return len(e.images("cloud-r")) == 0 && len(e.buildsJSON()) == 0 && len(e.uploadsJSON()) == 0 && len(files) == 0
	}, logs.String)
}

// raceReports returns the race detector's reports in a child's output.
func raceReports(logs string) []string {
	var races []string
	for _, block := range strings.Split(logs, "==================\n") {
		if strings.HasPrefix(block, "WARNING: DATA RACE") {
			races = append(races, block)
		}
	}
	return races
}

// TestDaemonHoldsConfigCutShort: a config file cut short (by a full disk, a
// killed config run) and left so holds still, and may load with a provider
// listing no image. The file watcher never applies a config that releases a
// provider's every upload; SIGHUP, the operator's act, does. An emptied file
// is refused, SIGHUP or not.
func TestDaemonHoldsConfigCutShort(t *testing.T) {
	for _, c := range []struct {
		name string
		cut  func(cfg string) string
		// applies: SIGHUP applies the cut config (and cloud-q's upload goes).
		applies bool
	}{
		{"cut after a provider's image-format", func(cfg string) string {
			at := strings.Index(cfg, "    image-format: qcow2\n")
			return cfg[:at+len("    image-format: qcow2\n")]
		}, true},
		{"emptied", func(string) string { return "" }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
			e.writeConfig("    poll-interval: 1\n")
			e.addBuild(e.makeImage(1), zuultest.BuildSpec{})
			d := startDaemon(t, e.cfgPath)
			logs := d.logs
			testenv.WaitFor(t, 60*time.Second, "the uploads", func() bool {
				return len(e.images("cloud-q")) == 1 && len(e.images("cloud-r")) == 1
			}, logs.String)
			before := e.images("cloud-q")[0]

			data, err := os.ReadFile(e.cfgPath)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(e.cfgPath, []byte(c.cut(string(data))), 0o644); err != nil {
				t.Fatal(err)
			}
			// The watcher has read the cut file twice and said what it does.
			said := func() int {
				s := logs.String()
				return strings.Count(s, "config reloaded") + strings.Count(s, "config change held") + strings.Count(s, "config not reloaded")
			}
			testenv.WaitFor(t, 30*time.Second, "the watcher to judge the cut file", func() bool { return said() == 1 }, logs.String)
			if strings.Contains(logs.String(), "config reloaded") {
				t.Fatalf("the file watcher applied the cut config:\n%s", logs.String())
			}
			if c.applies && !strings.Contains(logs.String(), "SIGHUP") {
				t.Errorf("the log does not say how to apply the held config:\n%s", logs.String())
			}
			if !c.applies && !strings.Contains(logs.String(), "holds no config") {
				t.Errorf("the log does not say the file is empty:\n%s", logs.String())
			}
			still := e.images("cloud-q")
			if len(still) != 1 || still[0].ID != before.ID || still[0].Status != "active" {
				t.Fatalf("cloud-q holds %+v after the cut config, want %s active", still, before.ID)
			}
			if c.applies { // image-list reads the config too
				for _, u := range e.uploadsJSON() {
					if u.State != "ready" {
						t.Errorf("upload %+v is no longer ready", u)
					}
				}
			}

			// SIGHUP applies what the file holds, drops included; never an empty file.
			d.cmd.Process.Signal(syscall.SIGHUP)
			if c.applies {
				// cloud-r left the config: its uploads are no longer this builder's to release.
				testenv.WaitFor(t, 60*time.Second, "the cut config's drops to be applied", func() bool {
					return len(e.images("cloud-q")) == 0
				}, logs.String)
				return
			}
			testenv.WaitFor(t, 30*time.Second, "SIGHUP's reload to be refused", func() bool {
				return strings.Count(logs.String(), "config not reloaded") == 2
			}, logs.String)
			if still := e.images("cloud-q"); len(still) != 1 || still[0].Status != "active" {
				t.Fatalf("cloud-q holds %+v after SIGHUP on an empty config, want its image active", still)
			}
		})
	}
}

// TestDaemonHoldsBuilderFileCutOrRemoved: the builder's own file cut short
// (here its builder section lost, as a file with zuul-images first loses it)
// or removed would bring every setting back to its default: gearman's
// image-upload and image-delete functions that gearman-functions left out,
// keep-builds down to 2. The file watcher applies neither; the log names the
// keys that would change. SIGHUP, the operator's act, applies it.
func TestDaemonHoldsBuilderFileCutOrRemoved(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	gd := testenv.NewGearmand(t)
	e.writeYAML(`images-dir: {{IMAGES}}
diskimages:
  - name: debian
    pause: true
providers:
  - name: cloud-q
    cloud: {{CLOUD}}
    image-format: qcow2
    diskimages:
      - name: debian
`)
	own := filepath.Join(e.dir, config.BuilderFileName)
	text := fmt.Sprintf(`zuul-images:
  - name: debian
    api-url: %s
    tenant: example
    project: org/images
    job: build-debian
    poll-interval: 1
builder:
  keep-builds: 3
  gearman-servers:
    - host: 127.0.0.1
      port: %d
  gearman-functions: [image-build]
`, e.zuul.URL(), gd.Port)
	writeFileT(t, own, text)
	ready := func() []string {
		var ids []string
		for _, b := range e.buildsOf("debian") {
			if b.State == "ready" {
				ids = append(ids, b.BuildID)
			}
		}
		slices.Sort(ids)
		return ids
	}
	var made []string // the ready builds, oldest first
	for seed := range int64(3) {
		e.addBuild(e.makeImage(seed+1), zuultest.BuildSpec{})
		e.once(0)
		for _, id := range ready() {
			if !slices.Contains(made, id) {
				made = append(made, id)
			}
		}
	}
	builds := ready()
	if len(made) != 3 || len(builds) != 3 {
		t.Fatalf("ready builds %v, want 3", builds)
	}
	oldest, newest := made[0], made[2]

	d := startDaemon(t, e.cfgPath)
	logs := d.logs
	waitWorkers(t, gd, d, "image-build:debian", 1)
	served := func(what string) {
		t.Helper()
		for fn, n := range workers(t, gd) {
			if n > 0 && !strings.HasPrefix(fn, "image-build:") {
				t.Errorf("%s: gearadmin --status lists %d workers of %s; gearman-functions lists image-build alone", what, n, fn)
			}
		}
		if got := ready(); !slices.Equal(got, builds) {
			t.Errorf("%s: ready builds %v, want the 3 that keep-builds keeps: %v", what, got, builds)
		}
	}
	served("at start")
	said := func() int {
		s := logs.String()
		return strings.Count(s, "config reloaded") + strings.Count(s, "config change held") + strings.Count(s, "config not reloaded")
	}
	held := func(what string, n int, keys ...string) {
		t.Helper()
		testenv.WaitFor(t, 30*time.Second, "the watcher to judge "+what, func() bool { return said() == n }, logs.String)
		if strings.Contains(logs.String(), "config reloaded") || strings.Count(logs.String(), "config change held") != n {
			t.Fatalf("the file watcher applied %s:\n%s", what, logs.String())
		}
		line := logs.String()[strings.LastIndex(logs.String(), "config change held"):]
		line = line[:strings.IndexByte(line, '\n')]
		for _, key := range keys {
			if !strings.Contains(line, key) {
				t.Errorf("the held change does not name %s: %s", key, line)
			}
		}
		if !strings.Contains(line, "SIGHUP") || strings.Contains(line, e.zuul.URL()) {
			t.Errorf("the held change does not say how to apply it, or names a value: %s", line)
		}
		served("after " + what)
	}

	writeFileT(t, own, text[:strings.Index(text, "builder:")])
	held("the builder section cut off", 1, "builder.gearman-functions", "builder.keep-builds")
	if err := os.Remove(own); err != nil {
		t.Fatal(err)
	}
	held("the builder's file removed", 2, "zuul-images[debian]", "builder.gearman-functions", "builder.keep-builds")

	// SIGHUP applies it: every function is served, and keep-builds is 2.
	d.cmd.Process.Signal(syscall.SIGHUP)
	d.waitLog(t, 30*time.Second, "config reloaded")
	waitWorkers(t, gd, d, "image-upload:"+newest, 1)
	testenv.WaitFor(t, 60*time.Second, "the oldest build to go", func() bool {
		got := e.buildsOf("debian")
		return len(got) == 2 && !slices.ContainsFunc(got, func(b listing.Build) bool { return b.BuildID == oldest })
	}, logs.String)
}
