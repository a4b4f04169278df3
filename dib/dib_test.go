package dib

import (
	"bufio"
	"bytes"
	"context"
	"crypto/md5"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/diskimage"
	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/metrics"
	"github.com/nodepool-builder/nodepool-builder/source"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/store/storetest"
)

// fixture is an images-dir, a log dir and a store on a fake clock, with the fake
// disk-image-create as dib-cmd.
type fixture struct {
	t      *testing.T
	dir    string
	images string
	logs   string
	record string // where the fake DIB records its arguments and environment
	// elements is the config's {{ELEMENTS}}, an elements-dir.
	elements string
	clock    *storetest.Clock
	st       *store.Store
	raw      storetest.Raw // writes the records a test sets up
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	dir := t.TempDir()
	f := &fixture{
		t:        t,
		dir:      dir,
		images:   filepath.Join(dir, "images"),
		logs:     filepath.Join(dir, "logs", "builds"), // created by the builder
		record:   filepath.Join(dir, "record"),
		elements: filepath.Join(dir, "elements"),
		clock:    storetest.NewClockAt(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)),
	}
	st, raw := storetest.Open(t, store.Options{ImagesDir: f.images, Now: f.clock.Now})
	t.Cleanup(func() { st.Close() })
	f.st, f.raw = st, raw
	return f
}

// config parses a nodepool.yaml after filling in {{IMAGES}}, {{LOGS}}, {{DIB}}
// (the fake run through bash, which also exercises a dib-cmd with arguments),
// {{RECORD}} and {{ELEMENTS}}.
func (f *fixture) config(text string) *config.Config {
	f.t.Helper()
	script, err := filepath.Abs("testdata/fake-disk-image-create")
	if err != nil {
		f.t.Fatal(err)
	}
	r := strings.NewReplacer(
		"{{IMAGES}}", f.images,
		"{{LOGS}}", f.logs,
		"{{DIB}}", "bash "+shellQuote(script),
		"{{RECORD}}", f.record,
		"{{ELEMENTS}}", f.elements,
	)
	cfg, err := config.Parse("nodepool.yaml", []byte(r.Replace(text)), func(string) (string, bool) { return "", false })
	if err != nil {
		f.t.Fatalf("config: %v", err)
	}
	return cfg
}

// diskimages parses a nodepool.yaml of the fixture's images-dir and
// build-log-dir whose text goes on after "diskimages:": the entries of that
// list, then any other top-level keys (providers, elements-dir, ...). The
// placeholders are config's.
func (f *fixture) diskimages(text string) *config.Config {
	f.t.Helper()
	return f.config("images-dir: {{IMAGES}}\nbuild-log-dir: {{LOGS}}\ndiskimages:\n" + text)
}

func (f *fixture) builder(cfg *config.Config) core {
	return inCore(New(Options{
		Store:     f.st,
		Config:    cfg,
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
		Now:       f.clock.Now,
		KillGrace: 300 * time.Millisecond,
	}), nil)
}

// recording is what one run of the fake DIB recorded.
type recording struct {
	pid   int
	child int
	args  []string
	env   map[string]string
}

// recorded returns what the fake DIB recorded and forgets it for the next build.
func (f *fixture) recorded() recording {
	f.t.Helper()
	data, err := os.ReadFile(f.record)
	if err != nil {
		f.t.Fatalf("the fake DIB recorded nothing: %v", err)
	}
	os.Remove(f.record)
	r := recording{env: map[string]string{}}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		kind, val, _ := strings.Cut(sc.Text(), ": ")
		switch kind {
		case "pid":
			r.pid, _ = strconv.Atoi(val)
		case "child":
			r.child, _ = strconv.Atoi(val)
		case "arg":
			r.args = append(r.args, val)
		case "env":
			k, v, _ := strings.Cut(val, "=")
			r.env[k] = v
		}
	}
	return r
}

func (f *fixture) build(ctx context.Context, b core, image string) store.Build {
	f.t.Helper()
	bd, err := b.Build(ctx, image)
	if err != nil {
		f.t.Fatalf("build %s: %v\nlog:\n%s", image, err, f.lastLog(image))
	}
	return bd
}

func (f *fixture) lastLog(image string) string {
	bs, err := f.st.Builds(context.Background(), store.BuildFilter{Image: image})
	if err != nil || len(bs) == 0 {
		return "(no build)"
	}
	data, err := os.ReadFile(diskimage.LogPath(f.logs, image, bs[0].ID))
	if err != nil {
		return err.Error()
	}
	return string(data)
}

func due(t *testing.T, b core, image string) string {
	t.Helper()
	reason, err := b.Due(context.Background(), image)
	if err != nil {
		t.Fatalf("due %s: %v", image, err)
	}
	return reason
}

func fileSums(t *testing.T, path string) (sha, md string, size int64) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s, m := sha256.Sum256(data), md5.Sum(data)
	return hex.EncodeToString(s[:]), hex.EncodeToString(m[:]), int64(len(data))
}

// buildFiles lists the files of a build in the images-dir.
func buildFiles(t *testing.T, dir string, bd store.Build) []string {
	t.Helper()
	var out []string
	for _, n := range listDir(t, dir) {
		if strings.HasPrefix(n, bd.Name()+".") {
			out = append(out, n)
		}
	}
	return out
}

// processRunning tells whether pid is a live (not zombie) process.
func processRunning(pid int) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(data, ')')
	f := strings.Fields(string(data[i+1:]))
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

// TestBuildRunsDIB: a diskimage's config gives DIB its arguments and
// environment and the build its formats. Every build is recorded ready with
// DIB's pid and the sums of its files, keeps DIB's manifest dir, has a log of
// DIB's command line and output, and is due before it and not right after it.
func TestBuildRunsDIB(t *testing.T) {
	for _, tc := range []struct {
		name       string
		diskimages string // the config after "diskimages:" (fixture.diskimages)
		image      string
		args       []string          // DIB's arguments, all of them; {{OUT}} is the build's output path
		argsHave   []string          // arguments DIB is given, wherever they stand
		env        map[string]string // some of DIB's environment; {{OUT}} as in args, {{ELEMENTS}} as in the config
		unset      []string          // variables DIB is not given
		formats    []string
		then       func(t *testing.T, f *fixture, b core, bd store.Build) // checks of this case alone
	}{{
		name: "formats from providers",
		diskimages: `
  - name: debian
    dib-cmd: {{DIB}}
    elements: [debian-minimal, vm]
    release: bookworm
    env-vars:
      FAKE_DIB_RECORD: {{RECORD}}
      TEST_SETTING: "on"
elements-dir: {{ELEMENTS}}
providers:
  - name: cloud-a
    cloud: a
    diskimages: [{name: debian}]
  - name: cloud-b
    cloud: b
    image-format: raw
    diskimages: [{name: debian}]
`,
		image: "debian",
		args:  []string{"-x", "-t", "qcow2,raw", "--checksum", "--no-tmpfs", "--qemu-img-options", "compat=0.10", "-o", "{{OUT}}", "debian-minimal", "vm"},
		env: map[string]string{
			"DIB_RELEASE": "bookworm", "DIB_IMAGE_NAME": "debian", "DIB_IMAGE_FILENAME": "{{OUT}}",
			"ELEMENTS_PATH": "{{ELEMENTS}}", "TEST_SETTING": "on",
		},
		formats: []string{"qcow2", "raw"},
	}, {
		name: "tar without elements-dir",
		diskimages: `
  - name: rootfs
    dib-cmd: {{DIB}}
    elements: [ubuntu-minimal]
    formats: [tar]
    env-vars: {FAKE_DIB_RECORD: {{RECORD}}}
`,
		image:   "rootfs",
		args:    []string{"-x", "-t", "tar", "--checksum", "--no-tmpfs", "-o", "{{OUT}}", "ubuntu-minimal"},
		unset:   []string{"ELEMENTS_PATH"}, // no elements-dir
		formats: []string{"tar"},
	}, {
		name: "default format is qcow2",
		diskimages: `
  - name: plain
    dib-cmd: {{DIB}}
    elements: [centos-minimal]
    env-vars: {FAKE_DIB_RECORD: {{RECORD}}}
`,
		image:    "plain",
		argsHave: []string{"qcow2", "compat=0.10"}, // -t qcow2 with its qemu-img options
		formats:  []string{"qcow2"},
	}, {
		name: "parent abstract chain",
		diskimages: `
  - name: base
    abstract: true
    dib-cmd: {{DIB}}
    elements: [vm, simple-init]
    formats: [raw]
    env-vars:
      FAKE_DIB_RECORD: {{RECORD}}
      TEST_FROM_BASE: base
      TEST_OVERRIDDEN: base
  - name: debian-base
    abstract: true
    parent: base
    elements: [debian-minimal]
    release: "12"
    env-vars:
      TEST_OVERRIDDEN: debian-base
  - name: debian-bookworm
    parent: debian-base
    elements: [zuul-worker]
    env-vars:
      TEST_LEAF: leaf
`,
		image: "debian-bookworm",
		args:  []string{"-x", "-t", "raw", "--checksum", "--no-tmpfs", "-o", "{{OUT}}", "vm", "simple-init", "debian-minimal", "zuul-worker"},
		env: map[string]string{
			"TEST_FROM_BASE": "base", "TEST_OVERRIDDEN": "debian-base", "TEST_LEAF": "leaf",
			"DIB_RELEASE": "12", "DIB_IMAGE_NAME": "debian-bookworm",
		},
		formats: []string{"raw"},
		then: func(t *testing.T, f *fixture, b core, bd store.Build) {
			if _, err := b.Build(context.Background(), "base"); !errors.Is(err, ErrUnknownImage) {
				t.Errorf("building an abstract image: err = %v, want ErrUnknownImage", err)
			}
		},
	}, {
		name:       "checksums computed when DIB writes none",
		diskimages: strings.Replace(failing, `FAKE_DIB_EXIT: "3"`, `FAKE_DIB_NO_CHECKSUM: "1"`, 1),
		image:      "debian",
		formats:    []string{"qcow2", "raw"},
		then: func(t *testing.T, f *fixture, b core, bd store.Build) {
			for _, file := range bd.Files {
				path := mustPath(f.st.FilePath("debian", bd.ID, file.Format))
				sha, _, _ := fileSums(t, path)
				if got, _ := store.ReadSidecar(path + ".sha256"); got != sha {
					t.Errorf("%s.sha256 sidecar = %q, want %s", path, got, sha)
				}
			}
		},
	}, {
		name: "squashfs takes the store name",
		diskimages: `
  - name: live
    dib-cmd: {{DIB}}
    elements: [e]
    formats: [squashfs]
    env-vars: {FAKE_DIB_RECORD: {{RECORD}}}
`,
		image:   "live",
		formats: []string{"squashfs"},
		then: func(t *testing.T, f *fixture, b core, bd store.Build) {
			path := mustPath(f.st.FilePath("live", bd.ID, "squashfs"))
			sha, _, _ := fileSums(t, path)
			if file, ok := bd.File("squashfs"); !ok || file.SHA256 != sha {
				t.Errorf("squashfs file = %+v, want sha256 %s", file, sha)
			}
			data, err := os.ReadFile(path + ".sha256")
			if err != nil || !strings.HasSuffix(strings.TrimSpace(string(data)), filepath.Base(path)) {
				t.Errorf("sidecar %q (%v) does not name %s", data, err, filepath.Base(path))
			}
			if files := buildFiles(t, f.images, bd); slices.ContainsFunc(files, func(n string) bool { return strings.Contains(n, ".squash.") || strings.HasSuffix(n, ".squash") }) {
				t.Errorf("DIB's .squash names left: %q", files)
			}
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			b := f.builder(f.diskimages(tc.diskimages))
			if got := due(t, b, tc.image); got != "no ready build" {
				t.Fatalf("due = %q, want no ready build", got)
			}
			bd := f.build(context.Background(), b, tc.image)
			rec := f.recorded()
			out := mustPath(f.st.BuildPath(tc.image, bd.ID))
			expand := strings.NewReplacer("{{OUT}}", out, "{{ELEMENTS}}", f.elements).Replace

			args := rec.args
			if tc.args != nil {
				args = nil
				for _, a := range tc.args {
					args = append(args, expand(a))
				}
				if !slices.Equal(rec.args, args) {
					t.Errorf("DIB args\n got %q\nwant %q", rec.args, args)
				}
			}
			for _, a := range tc.argsHave {
				if !slices.Contains(rec.args, a) {
					t.Errorf("DIB args %q lack %q", rec.args, a)
				}
			}
			for k, want := range tc.env {
				if got, want := rec.env[k], expand(want); got != want {
					t.Errorf("DIB env %s=%q, want %q", k, got, want)
				}
			}
			for _, k := range tc.unset {
				if v, ok := rec.env[k]; ok {
					t.Errorf("DIB env has %s=%q, want it unset", k, v)
				}
			}

			if bd.State != store.Ready || bd.Source != store.SourceDIB || bd.Image != tc.image {
				t.Errorf("build = %+v, want a ready dib build of %s", bd, tc.image)
			}
			if bd.PID != rec.pid {
				t.Errorf("build PID = %d, want the DIB process %d", bd.PID, rec.pid)
			}
			if got := bd.Formats(); !slices.Equal(got, tc.formats) {
				t.Errorf("formats = %q, want %q", got, tc.formats)
			}
			for _, file := range bd.Files {
				sha, md, size := fileSums(t, mustPath(f.st.FilePath(tc.image, bd.ID, file.Format)))
				if file.SHA256 != sha || file.MD5 != md || file.Size != size {
					t.Errorf("%s: recorded sha256 %s md5 %s size %d; the file has %s %s %d", file.Format, file.SHA256, file.MD5, file.Size, sha, md, size)
				}
			}
			if _, err := os.Stat(out + ".d/elements"); err != nil {
				t.Errorf("DIB's manifest dir: %v", err)
			}

			log := f.lastLog(tc.image)
			lines := strings.Split(strings.TrimSuffix(log, "\n"), "\n")
			if !strings.HasPrefix(lines[0], "Building "+bd.Name()+" at 2026-03-01T12:00:00Z: bash ") ||
				!strings.Contains(lines[0], strings.Join(args, " ")) {
				t.Errorf("log header = %q, want the build, its time and DIB's command line %q", lines[0], strings.Join(args, " "))
			}
			if last := lines[len(lines)-1]; last != "Exit code: 0" {
				t.Errorf("last log line = %q, want Exit code: 0", last)
			}
			for _, want := range []string{"building " + tc.image + " (" + strings.Join(tc.formats, ",") + ")", "this line goes to stderr", "Build completed successfully"} {
				if !strings.Contains(log, want) {
					t.Errorf("log lacks DIB's output %q:\n%s", want, log)
				}
			}
			if got := due(t, b, tc.image); got != "" {
				t.Errorf("due right after a build = %q", got)
			}
			if tc.then != nil {
				tc.then(t, f, b, bd)
			}
		})
	}
}

// TestBuildHoldsBackNodepoolVariables: DIB, run for real, gets none of the
// daemon's NODEPOOL_* variables (where the configs' %(NODEPOOL_...) takes
// secrets from) but those the diskimage's env-vars set, and its log names the
// ones held back without their values.
func TestBuildHoldsBackNodepoolVariables(t *testing.T) {
	const secret = "repo-secret-5d1e"
	t.Setenv("NODEPOOL_REPO_PASSWORD", secret)
	t.Setenv("NODEPOOL_SCRIPTDIR", "/from/the/daemon")
	f := newFixture(t)
	b := f.builder(f.diskimages(`
  - name: debian
    dib-cmd: {{DIB}}
    elements: [e]
    env-vars:
      FAKE_DIB_RECORD: {{RECORD}}
      NODEPOOL_SCRIPTDIR: /etc/nodepool/scripts
`))
	f.build(context.Background(), b, "debian")
	rec := f.recorded()
	if v, ok := rec.env["NODEPOOL_REPO_PASSWORD"]; ok {
		t.Errorf("DIB got NODEPOOL_REPO_PASSWORD=%s from the daemon", v)
	}
	if got := rec.env["NODEPOOL_SCRIPTDIR"]; got != "/etc/nodepool/scripts" {
		t.Errorf("DIB got NODEPOOL_SCRIPTDIR=%q, want the env-vars' /etc/nodepool/scripts", got)
	}
	log := f.lastLog("debian")
	line := "Not passed from the builder's environment (a diskimage's env-vars may set them): "
	i := strings.Index(log, line)
	if i < 0 {
		t.Fatalf("the build log does not say what was held back from DIB:\n%s", log)
	}
	held := strings.Fields(strings.SplitN(log[i+len(line):], "\n", 2)[0])
	if !slices.Contains(held, "NODEPOOL_REPO_PASSWORD") || slices.Contains(held, "NODEPOOL_SCRIPTDIR") {
		t.Errorf("the build log names %q as held back, want NODEPOOL_REPO_PASSWORD and not NODEPOOL_SCRIPTDIR", held)
	}
	if strings.Contains(log, secret) {
		t.Errorf("the build log shows the value of NODEPOOL_REPO_PASSWORD:\n%s", log)
	}
}

func TestDueRebuildAge(t *testing.T) {
	f := newFixture(t)
	b := f.builder(f.diskimages(`
  - name: debian
    dib-cmd: {{DIB}}
    elements: [debian-minimal]
    rebuild-age: 3600
`))
	f.build(context.Background(), b, "debian")
	f.clock.Add(59 * time.Minute)
	if got := due(t, b, "debian"); got != "" {
		t.Errorf("due before rebuild-age = %q", got)
	}
	f.clock.Add(time.Minute)
	if got := due(t, b, "debian"); !strings.Contains(got, "1h0m0s old (rebuild-age 1h0m0s)") {
		t.Errorf("due at rebuild-age = %q, want a reason naming the age", got)
	}
}

// TestDueRebuildAgeZero: rebuild-age 0 builds back to back: the next build is
// due as soon as the last is ready, with no time passed.
func TestDueRebuildAgeZero(t *testing.T) {
	f := newFixture(t)
	b := f.builder(f.diskimages(`
  - name: debian
    dib-cmd: {{DIB}}
    elements: [debian-minimal]
    rebuild-age: 0
`))
	f.build(context.Background(), b, "debian")
	if got := due(t, b, "debian"); !strings.Contains(got, "(rebuild-age 0s)") {
		t.Errorf("due right after a build with rebuild-age 0 = %q, want it due", got)
	}
}

func TestDueNewestBuildLacksFormat(t *testing.T) {
	f := newFixture(t)
	const oneProvider = `
  - name: debian
    dib-cmd: {{DIB}}
    elements: [debian-minimal]
    keep-formats: [qcow2]
providers:
  - name: cloud-a
    cloud: a
    diskimages: [{name: debian}]
`
	b := f.builder(f.diskimages(oneProvider))
	bd := f.build(context.Background(), b, "debian")
	// A file removed after upload still counts: the build was made in that format.
	removed, _ := bd.File("qcow2")
	removed.Present = false
	bd.SetFile(removed)
	if err := f.raw.Write(context.Background(), store.PutBuild(&bd)); err != nil {
		t.Fatal(err)
	}
	if got := due(t, b, "debian"); got != "" {
		t.Errorf("due = %q, want not due", got)
	}
	b = f.builder(f.diskimages(oneProvider + `
  - name: cloud-b
    cloud: b
    image-format: vhd
    diskimages: [{name: debian, pause: true}]
`))
	if got, want := due(t, b, "debian"), "newest build "+bd.Name()+" lacks vhd"; got != want {
		t.Errorf("due = %q, want %q", got, want)
	}
}

const failing = `
  - name: debian
    dib-cmd: {{DIB}}
    elements: [debian-minimal]
    formats: [qcow2, raw]
    env-vars:
      FAKE_DIB_RECORD: {{RECORD}}
      FAKE_DIB_EXIT: "3"
`

func TestFailedBuildCleanup(t *testing.T) {
	f := newFixture(t)
	b := f.builder(f.diskimages(failing))
	_, err := b.Build(context.Background(), "debian")
	if err == nil || !strings.Contains(err.Error(), "exited with code 3") {
		t.Fatalf("err = %v, want exit code 3", err)
	}
	bs, _ := f.st.Builds(context.Background(), store.BuildFilter{Image: "debian"})
	if len(bs) != 1 || bs[0].State != store.Failed {
		t.Fatalf("builds = %+v, want one failed", bs)
	}
	lp := diskimage.LogPath(f.logs, "debian", bs[0].ID)
	if r := bs[0].Reason; !strings.Contains(r, "exited with code 3") || !strings.Contains(r, lp) {
		t.Errorf("reason = %q, want the exit code and the log %s", r, lp)
	}
	if files := buildFiles(t, f.images, bs[0]); len(files) != 0 {
		t.Errorf("files left after a failed build: %q", files)
	}
	log := f.lastLog("debian")
	if !strings.HasSuffix(log, "failing with 3\nExit code: 3\n") {
		t.Errorf("log does not end with DIB's output and Exit code: 3:\n%s", log)
	}
}

func TestMissingFormatFileFails(t *testing.T) {
	f := newFixture(t)
	b := f.builder(f.diskimages(strings.Replace(failing, `FAKE_DIB_EXIT: "3"`, `FAKE_DIB_SKIP_FORMAT: raw`, 1)))
	_, err := b.Build(context.Background(), "debian")
	if err == nil || !strings.Contains(err.Error(), "left no raw file") {
		t.Fatalf("err = %v, want a missing raw file", err)
	}
	bs, _ := f.st.Builds(context.Background(), store.BuildFilter{Image: "debian"})
	if bs[0].State != store.Failed || len(bs[0].Files) != 0 {
		t.Errorf("build = %+v, want failed without files", bs[0])
	}
	if files := buildFiles(t, f.images, bs[0]); len(files) != 0 {
		t.Errorf("files left: %q", files)
	}
	if log := f.lastLog("debian"); !strings.HasSuffix(log, "Exit code: 0\n") {
		t.Errorf("log:\n%s", log)
	}
}

const hanging = `
  - name: debian
    dib-cmd: {{DIB}}
    elements: [debian-minimal]
    build-timeout: 2
    env-vars:
      FAKE_DIB_RECORD: {{RECORD}}
      FAKE_DIB_HANG: "1"
`

// waitRecorded waits until the hanging fake DIB has started its child.
func (f *fixture) waitRecorded() {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if data, _ := os.ReadFile(f.record); bytes.Contains(data, []byte("child: ")) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	f.t.Fatal("the fake DIB did not start")
}

func TestBuildTimeoutKillsProcessGroup(t *testing.T) {
	f := newFixture(t)
	b := f.builder(f.diskimages(hanging))
	type result struct {
		bd  store.Build
		err error
	}
	done := make(chan result)
	go func() {
		bd, err := b.Build(context.Background(), "debian")
		done <- result{bd, err}
	}()
	f.waitRecorded()

	// While DIB runs, the store shows the build with DIB's pid, and it is not built twice.
	bs, err := f.st.Builds(context.Background(), store.BuildFilter{Image: "debian"})
	if err != nil || len(bs) != 1 || bs[0].State != store.Building {
		t.Fatalf("builds while building = %+v, %v", bs, err)
	}
	if built, err := b.Step(context.Background(), "debian"); built != nil || err != nil {
		t.Errorf("a step while building = %+v, %v; want it to leave the image to the build", built, err)
	}
	if bs, _ := f.st.Builds(context.Background(), store.BuildFilter{Image: "debian"}); len(bs) != 1 {
		t.Errorf("a second build began while the first ran: %+v", bs)
	}

	res := <-done
	rec := f.recorded()
	if bs[0].PID != rec.pid {
		t.Errorf("building record has pid %d, want DIB's %d", bs[0].PID, rec.pid)
	}
	if res.err == nil || !strings.Contains(res.err.Error(), "timed out") {
		t.Fatalf("err = %v, want a timeout", res.err)
	}
	for _, pid := range []int{rec.pid, rec.child} {
		if processRunning(pid) {
			t.Errorf("process %d survived the timeout", pid)
		}
	}
	bd, err := f.st.Build(context.Background(), bs[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	if bd.State != store.Failed || !strings.Contains(bd.Reason, "timed out after 2s") {
		t.Errorf("build = %s %q, want failed with a timeout reason", bd.State, bd.Reason)
	}
	if files := buildFiles(t, f.images, bd); len(files) != 0 {
		t.Errorf("files left after a timeout: %q", files)
	}
	log := f.lastLog("debian")
	lines := strings.Split(strings.TrimSuffix(log, "\n"), "\n")
	if last := lines[len(lines)-1]; !strings.HasPrefix(last, "Exit code: -") {
		t.Errorf("last log line = %q, want the signal's exit code", last)
	}
	if !strings.Contains(log, "Build timed out after 2s") {
		t.Errorf("log does not say the build timed out:\n%s", log)
	}
}

func TestCancelKillsBuildAndKeepsRequest(t *testing.T) {
	f := newFixture(t)
	b := f.builder(f.diskimages(strings.Replace(hanging, "build-timeout: 2", "build-timeout: 600", 1)))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := f.st.RequestBuild(ctx, "debian"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	go func() {
		err := stepAll(ctx, b)
		done <- err
	}()
	f.waitRecorded()
	cancel()
	var err error
	select {
	case err = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the build did not stop when its context ended")
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v, want context.Canceled", err)
	}
	rec := f.recorded()
	for _, pid := range []int{rec.pid, rec.child} {
		if processRunning(pid) {
			t.Errorf("process %d survived the cancel", pid)
		}
	}
	bs, _ := f.st.Builds(context.Background(), store.BuildFilter{Image: "debian"})
	if len(bs) != 1 || bs[0].State != store.Failed || !strings.Contains(bs[0].Reason, "cancelled") {
		t.Errorf("builds = %+v, want one failed as cancelled", bs)
	}
	reqs, _ := f.st.BuildRequests(context.Background())
	if _, ok := reqs["debian"]; !ok {
		t.Error("the manual request was dropped though its build never finished")
	}
}

func TestPause(t *testing.T) {
	f := newFixture(t)
	cfg := f.diskimages(`
  - name: paused
    dib-cmd: {{DIB}}
    elements: [e]
    pause: true
  - name: running
    dib-cmd: {{DIB}}
    elements: [e]
`)
	b := f.builder(cfg)
	ctx := context.Background()
	if err := f.st.RequestBuild(ctx, "paused"); err != nil {
		t.Fatal(err)
	}
	if err := f.st.SetPaused(ctx, "running", true); err != nil {
		t.Fatal(err)
	}
	for _, image := range []string{"paused", "running"} {
		if got := due(t, b, image); got != "" {
			t.Errorf("%s: due = %q while paused", image, got)
		}
	}
	if err := stepAll(ctx, b); err != nil {
		t.Fatal(err)
	}
	if bs, _ := f.st.Builds(ctx, store.BuildFilter{}); len(bs) != 0 {
		t.Errorf("paused images were built: %+v", bs)
	}
	if err := f.st.SetPaused(ctx, "running", false); err != nil {
		t.Fatal(err)
	}
	if got := due(t, b, "running"); got != "no ready build" {
		t.Errorf("due after unpause = %q", got)
	}
}

func TestManualRequest(t *testing.T) {
	f := newFixture(t)
	ok := f.diskimages(`
  - name: debian
    dib-cmd: {{DIB}}
    elements: [e]
`)
	b := f.builder(ok)
	ctx := context.Background()
	first := f.build(ctx, b, "debian")
	f.clock.Add(time.Minute)
	if err := f.st.RequestBuild(ctx, "debian"); err != nil {
		t.Fatal(err)
	}
	if got := due(t, b, "debian"); !strings.HasPrefix(got, "manual build requested at 2026-03-01T12:01:00Z") {
		t.Errorf("due = %q, want the manual request", got)
	}
	f.clock.Add(time.Minute)
	if err := stepAll(ctx, b); err != nil {
		t.Fatal(err)
	}
	bs, _ := f.st.Builds(ctx, store.BuildFilter{Image: "debian", State: store.Ready})
	if len(bs) != 2 || bs[1].ID != first.ID {
		t.Fatalf("ready builds = %d, want a second one", len(bs))
	}
	reqs, _ := f.st.BuildRequests(ctx)
	if len(reqs) != 0 {
		t.Errorf("requests after the build = %v, want none", reqs)
	}
	if got := due(t, b, "debian"); got != "" {
		t.Errorf("due after the requested build = %q", got)
	}

	// A failed build settles its request too, so it is not retried in a loop.
	b = f.builder(f.diskimages(strings.Replace(failing, "formats: [qcow2, raw]", "formats: [qcow2]", 1)))
	if err := f.st.RequestBuild(ctx, "debian"); err != nil {
		t.Fatal(err)
	}
	if err := stepAll(ctx, b); err == nil || !strings.Contains(err.Error(), "exited with code 3") {
		t.Fatalf("step err = %v, want the failed build", err)
	}
	if reqs, _ := f.st.BuildRequests(ctx); len(reqs) != 0 {
		t.Errorf("requests after a failed build = %v, want none", reqs)
	}
}

func TestFailureBackoff(t *testing.T) {
	f := newFixture(t)
	b := f.builder(f.diskimages(failing))
	ctx := context.Background()
	if err := stepAll(ctx, b); err == nil {
		t.Fatal("step: no error from a failing build")
	}
	bs, _ := f.st.Builds(ctx, store.BuildFilter{Image: "debian"})
	failedAt := bs[0].StateTime
	f.clock.Add(9 * time.Minute)
	if got := due(t, b, "debian"); got != "" {
		t.Errorf("due 9m after a failure = %q, want a wait", got)
	}
	// The step builds nothing, and says why: due work not done.
	err := stepAll(ctx, b)
	var back *HeldBack
	if !errors.As(err, &back) {
		t.Fatalf("step within the backoff: %v, want a HeldBack", err)
	}
	log := diskimage.LogPath(f.logs, "debian", bs[0].ID)
	next := failedAt.Add(diskimage.DefaultFailureBackoff)
	if back.Failure.Build.ID != bs[0].ID || back.Failure.Log != log || !back.Failure.NextAttempt.Equal(next) {
		t.Errorf("held back by %+v, want build %s, log %s, next attempt %s", back.Failure, bs[0].ID, log, next)
	}
	for _, want := range []string{"debian: not built", "exited with code 3", log, "backoff", next.Format(time.RFC3339), "image-build debian"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("step error does not say %q: %v", want, err)
		}
	}
	if bs, _ := f.st.Builds(ctx, store.BuildFilter{Image: "debian"}); len(bs) != 1 {
		t.Errorf("builds within the backoff = %d, want 1", len(bs))
	}
	if err := f.st.RequestBuild(ctx, "debian"); err != nil {
		t.Fatal(err)
	}
	if got := due(t, b, "debian"); !strings.HasPrefix(got, "manual build requested") {
		t.Errorf("due with a request inside the backoff = %q", got)
	}
	if err := f.st.ClearBuildRequest(ctx, "debian", f.clock.Now()); err != nil {
		t.Fatal(err)
	}
	f.clock.Add(time.Minute)
	if got := due(t, b, "debian"); got != "no ready build" {
		t.Errorf("due 10m after a failure = %q, want no ready build", got)
	}
}

func TestBuildLogPruning(t *testing.T) {
	f := newFixture(t)
	cfg := f.diskimages(`
  - name: fedora
    dib-cmd: {{DIB}}
    elements: [fedora]
  - name: fedora-40
    dib-cmd: {{DIB}}
    elements: [fedora]
build-log-retention: 2
`)
	if err := os.MkdirAll(f.logs, 0o755); err != nil {
		t.Fatal(err)
	}
	old := []string{"fedora-" + id1 + ".log", "fedora-" + id2 + ".log", "fedora-" + id3 + ".log"}
	other := []string{"fedora-40-" + id1 + ".log", "fedora-40-" + id2 + ".log", "fedora-40-" + id3 + ".log"}
	writeLogs(t, f.logs, old...)
	writeLogs(t, f.logs, other...)
	bd := f.build(context.Background(), f.builder(cfg), "fedora")
	want := append([]string{"fedora-" + bd.ID + ".log", old[0]}, other...)
	slices.Sort(want)
	if got := listDir(t, f.logs); !slices.Equal(got, want) {
		t.Errorf("logs\n got %q\nwant %q", got, want)
	}
}

func TestStepBuildsOnlyDueImagesAndJoinsFailures(t *testing.T) {
	f := newFixture(t)
	b := f.builder(f.diskimages(`
  - name: fresh
    dib-cmd: {{DIB}}
    elements: [e]
  - name: broken
    dib-cmd: {{DIB}}
    elements: [e]
    env-vars: {FAKE_DIB_EXIT: "1"}
  - name: gone
    dib-cmd: /nonexistent/disk-image-create
    elements: [e]
`))
	ctx := context.Background()
	fresh := f.build(ctx, b, "fresh")
	err := stepAll(ctx, b)
	if err == nil {
		t.Fatal("step: no error")
	}
	msg := err.Error()
	if !strings.Contains(msg, "broken-") || !strings.Contains(msg, "exited with code 1") ||
		!strings.Contains(msg, "gone-") {
		t.Errorf("step error = %q, want both failures", msg)
	}
	bs, _ := f.st.Builds(ctx, store.BuildFilter{Image: "fresh"})
	if len(bs) != 1 || bs[0].ID != fresh.ID {
		t.Errorf("fresh was rebuilt: %+v", bs)
	}
	if log := f.lastLog("gone"); !strings.HasSuffix(log, "Exit code: 127\n") {
		t.Errorf("log of a missing dib-cmd:\n%s", log)
	}
}

// stepAll steps every diskimage of the config in turn, as --once does with one
// build worker, and joins the failures.
func stepAll(ctx context.Context, b core) error {
	var errs []error
	for _, img := range b.opts.Config.DiskImages {
		if _, err := b.Step(ctx, img.Name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// TestSlotsBoundConcurrentBuilds: with one slot, a second image's step waits for
// the first build to end; Images lists every diskimage.
func TestSlotsBoundConcurrentBuilds(t *testing.T) {
	f := newFixture(t)
	cfg := f.diskimages(strings.Replace(hanging, "build-timeout: 2", "build-timeout: 600", 1) + `
  - name: other
    dib-cmd: {{DIB}}
    elements: [e]
`)
	slots := make(chan struct{}, 1)
	b := inCore(New(Options{Store: f.st, Config: cfg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: f.clock.Now,
		KillGrace: time.Second, CheckInterval: time.Minute}), slots)
	if imgs := b.Images(); len(imgs) != 2 || imgs["debian"] != time.Minute || imgs["other"] != time.Minute {
		t.Fatalf("images = %v", imgs)
	}
	// build-diskimages: false leaves them all to other builders.
	leave := *cfg
	leave.Builder.LeaveDiskImages = true
	if imgs := New(Options{Store: f.st, Config: &leave}).Images(); len(imgs) != 0 {
		t.Fatalf("images with build-diskimages false = %v, want none", imgs)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := make(chan error, 1)
	go func() {
		_, err := b.Step(ctx, "debian")
		first <- err
	}()
	f.waitRecorded()
	second := make(chan error, 1)
	go func() {
		_, err := b.Step(context.Background(), "other")
		second <- err
	}()
	select {
	case err := <-second:
		t.Fatalf("the second build ran while the only slot was taken: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	if bs, _ := f.st.Builds(context.Background(), store.BuildFilter{Image: "other"}); len(bs) != 0 {
		t.Fatalf("the second image was recorded building while waiting for a slot: %+v", bs)
	}
	cancel()
	if err := <-first; err == nil {
		t.Fatal("the cancelled build reported no error")
	}
	select {
	case err := <-second:
		if err != nil {
			t.Fatalf("second build: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the second build did not run once the slot was free")
	}
	if bs, _ := f.st.Builds(context.Background(), store.BuildFilter{Image: "other", State: store.Ready}); len(bs) != 1 {
		t.Fatalf("second image builds = %+v", bs)
	}
}

func TestUnknownImage(t *testing.T) {
	f := newFixture(t)
	b := f.builder(f.config("images-dir: {{IMAGES}}\n"))
	if _, err := b.Due(context.Background(), "nope"); !errors.Is(err, ErrUnknownImage) {
		t.Errorf("Due: err = %v", err)
	}
	if _, err := b.Build(context.Background(), "nope"); !errors.Is(err, ErrUnknownImage) {
		t.Errorf("Build: err = %v", err)
	}
}

// TestBuildNow: an operator's request builds at once, whatever the schedule,
// records the request on the build, and refuses a paused image or one whose
// build lock another builder holds.
func TestBuildNow(t *testing.T) {
	f := newFixture(t)
	cfg := f.diskimages(`
  - name: paused
    dib-cmd: {{DIB}}
    elements: [e]
    pause: true
  - name: debian
    dib-cmd: {{DIB}}
    elements: [e]
    rebuild-age: 604800
`)
	b := f.builder(cfg)
	ctx := context.Background()
	first := f.build(ctx, b, "debian")
	if got := due(t, b, "debian"); got != "" {
		t.Fatalf("due after a build = %q, want not due", got)
	}
	bd, err := b.BuildNow(ctx, "debian", "req-1")
	if err != nil || bd.State != store.Ready || bd.ID == first.ID || bd.Request != "req-1" {
		t.Fatalf("BuildNow = %+v, %v; want a new ready build for req-1", bd, err)
	}
	if _, err := b.BuildNow(ctx, "paused", ""); !errors.Is(err, source.ErrPaused) || !strings.Contains(err.Error(), "pause: true") {
		t.Errorf("BuildNow of an image paused in the config = %v", err)
	}
	if err := f.st.SetPaused(ctx, "debian", true); err != nil {
		t.Fatal(err)
	}
	if _, err := b.BuildNow(ctx, "debian", ""); !errors.Is(err, source.ErrPaused) || !strings.Contains(err.Error(), "image-unpause") {
		t.Errorf("BuildNow of an image paused by image-pause = %v", err)
	}
	if err := f.st.SetPaused(ctx, "debian", false); err != nil {
		t.Fatal(err)
	}
	held, err := f.st.TryLock(ctx, store.LockKey{Image: "debian"})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	if _, err := b.BuildNow(ctx, "debian", ""); err == nil || !strings.Contains(err.Error(), "another builder holds the image's build lock") {
		t.Errorf("BuildNow while the build lock is held = %v", err)
	}
	if bs, _ := f.st.Builds(ctx, store.BuildFilter{Image: "debian"}); len(bs) != 2 {
		t.Errorf("%d builds, want the 2 made before the refusals", len(bs))
	}
}

// TestStatsdNames: a DIB build sends nodepool's statsd names, to a real UDP
// socket: rc, duration and last_build after every run, each format's size on
// disk after a ready one.
func TestStatsdNames(t *testing.T) {
	f := newFixture(t)
	sd := testenv.NewStatsd(t)
	m, err := metrics.New(metrics.Options{Getenv: sd.Getenv("")})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ok := strings.Replace(failing, `FAKE_DIB_EXIT: "3"`, `FAKE_DIB_EXIT: "0"`, 1)
	b := inCore(New(Options{Store: f.st, Config: f.diskimages(ok), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Now: f.clock.Now, Metrics: m}), nil)
	bd := f.build(context.Background(), b, "debian")
	want := []string{
		"nodepool.dib_image_build.debian.status.rc:0|g",
		"nodepool.dib_image_build.debian.status.duration:*",
		"nodepool.dib_image_build.debian.status.last_build:*",
	}
	for _, format := range []string{"qcow2", "raw"} {
		fi, err := os.Stat(mustPath(f.st.FilePath("debian", bd.ID, format)))
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, fmt.Sprintf("nodepool.dib_image_build.debian.%s.size:%d|g", format, fi.Sys().(*syscall.Stat_t).Blocks*512))
	}
	got := sd.Wait(t, 5*time.Second, want...)
	if len(got) != len(want) {
		t.Errorf("statsd lines = %q, want one each of %q", got, want)
	}

	b = inCore(New(Options{Store: f.st, Config: f.diskimages(failing), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Now: f.clock.Now, Metrics: m}), nil)
	if _, err := b.Build(context.Background(), "debian"); err == nil {
		t.Fatal("the failing build succeeded")
	}
	want = []string{
		"nodepool.dib_image_build.debian.status.rc:3|g",
		"nodepool.dib_image_build.debian.status.duration:*",
		"nodepool.dib_image_build.debian.status.last_build:*",
	}
	got = sd.Wait(t, 5*time.Second, want...)
	if extra := sd.Quiet(200 * time.Millisecond); len(got) != len(want) || len(extra) > 0 {
		t.Errorf("statsd lines of a failed build = %q then %q, want one each of %q and no size", got, extra, want)
	}
}

// TestInterruptedBuildHoldsNothingBack: a build cancelled because the builder
// stopped is no failure: the next step builds the image at once.
func TestInterruptedBuildHoldsNothingBack(t *testing.T) {
	f := newFixture(t)
	cfg := f.diskimages(strings.Replace(failing, `FAKE_DIB_EXIT: "3"`, `FAKE_DIB_WAIT_FOR: {{RECORD}}.go`, 1))
	b := f.builder(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- stepAll(ctx, b) }()
	waitFile(t, f.record+".go.started")
	cancel()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the build did not stop when its context ended")
	}
	bs, _ := f.st.Builds(context.Background(), store.BuildFilter{Image: "debian"})
	if len(bs) != 1 || !source.Interrupted(bs[0]) {
		t.Fatalf("builds = %+v, want one interrupted", bs)
	}
	if got := due(t, b, "debian"); got != "no ready build" {
		t.Errorf("due after an interrupted build = %q, want no ready build", got)
	}
}

// waitFile waits until path exists.
func waitFile(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not appear", path)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
