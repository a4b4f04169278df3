package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/listing"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

// gearmanCall is one run of the gearman command, the client nobody here wrote.
type gearmanCall struct {
	out  string // stdout: the answer, or a failure's message
	all  string // stdout and stderr (progress, errors of the client)
	code int
}

// gearmanJob submits a job with the gearman command and waits for its answer;
// data empty sends none. The command must end on its own: a job left waiting
// fails the test after two minutes.
func gearmanJob(t *testing.T, gd *testenv.Gearmand, function, data string) gearmanCall {
	t.Helper()
	args := []string{"-h", "127.0.0.1", "-p", strconv.Itoa(gd.Port), "-f", function}
	if data == "" {
		args = append(args, "-s")
	} else {
		args = append(args, data)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, testenv.RequireBinary(t, "gearman"), args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("gearman -f %s was left waiting for an answer", function)
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("gearman -f %s: %v", function, err)
	}
	// The command prints the answer, then WORK_STATUS progress as "N% Complete" lines.
	answer, _, _ := strings.Cut(out.String(), "\n")
	return gearmanCall{out: strings.TrimSpace(answer), all: out.String() + errb.String(), code: code}
}

// ok fails the test unless the job succeeded, and returns its answer.
func (c gearmanCall) ok(t *testing.T, what string) string {
	t.Helper()
	if c.code != 0 || c.out == "" {
		t.Fatalf("%s: gearman exited %d saying %q, want an answer", what, c.code, c.all)
	}
	return c.out
}

// failed fails the test unless the job failed with a message saying says.
func (c gearmanCall) failed(t *testing.T, what string, says ...string) {
	t.Helper()
	if c.code == 0 {
		t.Errorf("%s: gearman exited 0 saying %q, want a failure", what, c.all)
	}
	for _, s := range says {
		if !strings.Contains(c.all, s) {
			t.Errorf("%s: gearman said %q, want it to say %q", what, c.all, s)
		}
	}
}

// workers returns, from gearadmin --status, the available workers of each function.
func workers(t *testing.T, gd *testenv.Gearmand) map[string]int {
	t.Helper()
	out, err := exec.Command(testenv.RequireBinary(t, "gearadmin"), "-h", "127.0.0.1", "-p", strconv.Itoa(gd.Port), "--status").Output()
	if err != nil {
		t.Fatalf("gearadmin --status: %v", err)
	}
	got := map[string]int{}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Split(line, "\t")
		if len(f) == 4 {
			n, _ := strconv.Atoi(f[3])
			got[f[0]] = n
		}
	}
	return got
}

// waitWorkers waits until gearadmin shows n workers for a function.
func waitWorkers(t *testing.T, gd *testenv.Gearmand, d *daemon, function string, n int) {
	t.Helper()
	testenv.WaitFor(t, 30*time.Second, fmt.Sprintf("%d workers of %s in gearadmin --status", n, function), func() bool {
		return workers(t, gd)[function] == n
	}, d.logs.String)
}

// gearmanConfig is a builder with a fake DIB image that image-build jobs may
// build at any time (gearman-min-build-interval: 0), a zuul-image polled once
// an hour (so that only image-build fetches it), and providers for the
// bad-input cases: cloud-p paused for dib-image, cloud-z taking only debian.
const gearmanConfig = `images-dir: {{IMAGES}}
build-log-dir: {{LOGS}}
gearman-servers:
  - host: 127.0.0.1
    port: {{GEARMAN}}
diskimages:
  - name: dib-image
    dib-cmd: {{DIB}}
    elements: [debian-minimal]
    rebuild-age: 604800
    env-vars:
      FAKE_DIB_WAIT_FOR: {{DIR}}/go
zuul-images:
  - name: debian
    api-url: {{ZUUL}}
    tenant: example
    project: org/images
    job: build-debian
    poll-interval: 3600
providers:
  - name: cloud-q
    cloud: {{CLOUD}}
    image-format: qcow2
    diskimages:
      - name: dib-image
      - name: debian
  - name: cloud-p
    cloud: {{CLOUD}}
    image-format: qcow2
    diskimages:
      - name: dib-image
        pause: true
  - name: cloud-z
    cloud: {{CLOUD}}
    image-format: qcow2
    diskimages:
      - name: debian
builder:
  keep-uploads: 2
  gearman-unserved-after: 2
  gearman-min-build-interval: 0
`

func (e *env) writeGearmanConfig(gd *testenv.Gearmand) {
	e.t.Helper()
	e.writeYAML(strings.ReplaceAll(gearmanConfig, "{{GEARMAN}}", strconv.Itoa(gd.Port)))
}

// waitNoUploads waits until image-list shows no upload of a build.
func (e *env) waitNoUploads(d *daemon, buildID string) {
	e.t.Helper()
	testenv.WaitFor(e.t, 60*time.Second, "the uploads of build "+buildID+" to go", func() bool {
		for _, u := range e.uploadsJSON() {
			if u.BuildID == buildID {
				return false
			}
		}
		return true
	}, d.logs.String)
}

// listed tells whether dib-image-list shows a build.
func (e *env) listed(buildID string) bool {
	e.t.Helper()
	for _, b := range e.buildsJSON() {
		if b.BuildID == buildID {
			return true
		}
	}
	return false
}

// letBuildsFinish lets the fake DIB's builds run through.
func (e *env) letBuildsFinish() {
	e.t.Helper()
	if err := os.WriteFile(filepath.Join(e.dir, "go"), nil, 0o644); err != nil {
		e.t.Fatal(err)
	}
}

func TestGearmanFunctions(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	gd := testenv.NewGearmand(t)
	e.writeGearmanConfig(gd)
	e.letBuildsFinish()
	e.addBuild(e.makeImage(1), zuultest.BuildSpec{})
	e.once(0)
	first := e.buildsOf("dib-image")[0]

	polls := len(e.zuul.BuildsCalls())
	d := startDaemon(t, e.cfgPath)
	// The daemon polls the zuul-image at start, then not for an hour.
	testenv.WaitFor(t, 30*time.Second, "the daemon's first poll", func() bool { return len(e.zuul.BuildsCalls()) > polls }, d.logs.String)
	waitWorkers(t, gd, d, "image-build:dib-image", 1)
	waitWorkers(t, gd, d, "image-upload:"+first.BuildID, 1)
	d.waitLog(t, 30*time.Second, "connected to gearman server")

	// image-build: a new DIB build, which dib-image-list shows ready.
	id := gearmanJob(t, gd, "image-build:dib-image", "").ok(t, "image-build:dib-image")
	builds := e.buildsOf("dib-image")
	if len(builds) != 2 || builds[0].BuildID != id || builds[0].State != "ready" {
		t.Fatalf("dib-image-list after image-build answered %q: %+v", id, builds)
	}
	waitWorkers(t, gd, d, "image-upload:"+id, 1)

	// image-build of a zuul-image fetches Zuul's newest build now, not in an hour.
	zb := e.addBuild(e.makeImage(2), zuultest.BuildSpec{})
	zid := gearmanJob(t, gd, "image-build:debian", "").ok(t, "image-build:debian")
	zbuild, ok := e.zuulBuildOf(zb.UUID)
	if !ok || zbuild.BuildID != zid || zbuild.State != "ready" {
		t.Fatalf("image-build:debian answered %q; the build of Zuul build %s: %+v, %v", zid, zb.UUID, zbuild, ok)
	}

	// image-upload of the first build, whose upload the operator deleted: a new
	// upload, active in Glance, through the usual path.
	up, ok := e.readyUpload(first.BuildID, "cloud-q")
	if !ok {
		t.Fatalf("the first build has no ready upload to cloud-q")
	}
	e.must(0, []string{"image-delete", "--provider", "cloud-q", "--image", "dib-image", "--build-id", first.BuildID, "--upload-id", up.UploadID})
	e.waitNoUploads(d, first.BuildID)
	upCall := gearmanJob(t, gd, "image-upload:"+first.BuildID, "cloud-q")
	ext := upCall.ok(t, "image-upload")
	if !strings.Contains(upCall.all, "100% Complete") {
		t.Errorf("the upload job reported no progress: %q", upCall.all)
	}
	if ext == up.ExternalID {
		t.Fatalf("image-upload answered the deleted image %s", ext)
	}
	if img := e.checkUploaded("cloud-q", first, "qcow2"); img.ID != ext {
		t.Fatalf("Glance holds %s for the first build, the job answered %s (%q)", img.ID, ext, upCall.all)
	}
	// Asked again: the same image, at once.
	if again := gearmanJob(t, gd, "image-upload:"+first.BuildID, "cloud-q").ok(t, "image-upload again"); again != ext {
		t.Errorf("image-upload asked again answered %s, want %s", again, ext)
	}

	// Bad input: the gearman command prints why and ends; nothing changes.
	before := len(e.buildsJSON())
	uploadsBefore := len(e.uploadsJSON())
	gearmanJob(t, gd, "image-upload:"+id, "no-such-cloud").failed(t, "unknown provider", `unknown provider "no-such-cloud"`)
	gearmanJob(t, gd, "image-upload:"+id, "").failed(t, "no provider", "needs a provider name")
	gearmanJob(t, gd, "image-upload:"+id, "cloud-p").failed(t, "paused provider", "provider cloud-p is paused for image dib-image")
	gearmanJob(t, gd, "image-upload:"+id, "cloud-z").failed(t, "provider without the image", "provider cloud-z does not take image dib-image")
	gearmanJob(t, gd, "image-build:dib-image", "bad request!").failed(t, "malformed request", "malformed request id")
	// Nobody serves these: after gearman-unserved-after, the builder answers.
	gearmanJob(t, gd, "image-build:no-such-image", "").failed(t, "unknown image", `"no-such-image" is not an image any of them builds`)
	gearmanJob(t, gd, "image-upload:0123456789abcdef0123456789abcdef", "cloud-q").failed(t, "unknown build", "no build 0123456789abcdef0123456789abcdef is known")
	// A malformed name is no builder's function: it is left to whoever serves it.
	if n, m := len(e.buildsJSON()), len(e.uploadsJSON()); n != before || m != uploadsBefore {
		t.Errorf("after refused jobs: %d builds and %d uploads, want %d and %d", n, m, before, uploadsBefore)
	}

	// image-delete: uploads, files and records go; its functions are dropped.
	name := gearmanJob(t, gd, "image-delete:"+first.BuildID, "").ok(t, "image-delete")
	if name != store.BuildName("dib-image", first.BuildID) {
		t.Errorf("image-delete answered %q", name)
	}
	if e.listed(first.BuildID) {
		t.Errorf("build %s still listed after image-delete", first.BuildID)
	}
	if files := e.buildFiles(first); len(files) != 0 {
		t.Errorf("files of the deleted build left: %v", files)
	}
	for _, img := range e.images("cloud-q") {
		if img.ID == ext {
			t.Errorf("Glance still holds image %s of the deleted build", ext)
		}
	}
	waitWorkers(t, gd, d, "image-upload:"+first.BuildID, 0)
	// The delete function stays a while: the same job asked again is answered.
	if again := gearmanJob(t, gd, "image-delete:"+first.BuildID, "").ok(t, "image-delete again"); again != name {
		t.Errorf("image-delete asked again answered %q, want %q", again, name)
	}

	// image-status shows the connection and the jobs served.
	st := e.must(0, []string{"image-status"})
	for _, want := range []string{"Gearman (daemon pid", fmt.Sprintf("127.0.0.1:%d", gd.Port), "image-delete:" + first.BuildID, "no-such-cloud"} {
		if !strings.Contains(st.stdout, want) {
			t.Errorf("image-status does not show %q:\n%s", want, st.stdout)
		}
	}
	d.waitLog(t, 10*time.Second, "gearman job done")
}

// TestGearmanOnlyListedFunctions: a builder with gearman-functions:
// [image-build] registers no upload or delete function, and an image-delete
// job for its build is answered without deleting anything; an image-build job
// right after a build is refused by the default gearman-min-build-interval.
// Every job is logged as it arrives.
func TestGearmanOnlyListedFunctions(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	gd := testenv.NewGearmand(t)
	e.writeYAML(strings.ReplaceAll(strings.ReplaceAll(gearmanConfig, "{{GEARMAN}}", strconv.Itoa(gd.Port)),
		"  gearman-min-build-interval: 0\n", "  gearman-functions: [image-build]\n"))
	e.letBuildsFinish()
	e.addBuild(e.makeImage(1), zuultest.BuildSpec{})
	e.once(0)
	first := e.buildsOf("dib-image")[0]

	d := startDaemon(t, e.cfgPath)
	waitWorkers(t, gd, d, "image-build:dib-image", 1)
	waitWorkers(t, gd, d, "image-build:debian", 1)
	for fn := range workers(t, gd) {
		if !strings.HasPrefix(fn, "image-build:") {
			t.Errorf("gearadmin --status lists %s; the builder serves image-build alone", fn)
		}
	}

	// image-build right after the build: refused, and no new build.
	gearmanJob(t, gd, "image-build:dib-image", "").failed(t, "image-build at once",
		"image-build dib-image refused", store.BuildName("dib-image", first.BuildID), "gearman-min-build-interval")
	if builds := e.buildsOf("dib-image"); len(builds) != 1 || builds[0].BuildID != first.BuildID {
		t.Errorf("builds after a refused image-build: %+v; want %s alone", builds, first.BuildID)
	}

	// image-delete: nobody runs it; after gearman-unserved-after it is
	// answered, and the build is still there with its files.
	gearmanJob(t, gd, "image-delete:"+first.BuildID, "").failed(t, "image-delete left out", "does not take image-delete jobs")
	if !e.listed(first.BuildID) || len(e.buildFiles(first)) == 0 {
		t.Errorf("build %s is gone after an image-delete job the builder does not take", first.BuildID)
	}
	if strings.Contains(d.logs.String(), "released by a gearman job") {
		t.Errorf("the builder ran the image-delete job:\n%s", d.logs.String())
	}
	for _, fn := range []string{"image-build:dib-image", "image-delete:" + first.BuildID} {
		testenv.WaitFor(t, 10*time.Second, "the log to say the job of "+fn+" was received", func() bool {
			for line := range strings.SplitSeq(d.logs.String(), "\n") {
				if strings.Contains(line, `msg="gearman job received"`) && strings.Contains(line, " function="+fn+" handle=H:") &&
					strings.Contains(line, " unique=") {
					return true
				}
			}
			return false
		}, d.logs.String)
	}
}

func TestGearmanTwoBuilders(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	gd := testenv.NewGearmand(t)
	one := `images-dir: {{DIR}}/%s
build-log-dir: {{DIR}}/%s-logs
gearman-servers:
  - host: 127.0.0.1
    port: ` + strconv.Itoa(gd.Port) + `
diskimages:
  - name: %s
    dib-cmd: {{DIB}}
    elements: [debian-minimal]
    rebuild-age: 604800
providers:
  - name: cloud-q
    cloud: {{CLOUD}}
    image-format: qcow2
    diskimages:
      - name: %s
builder:
  gearman-unserved-after: 2
`
	var cfgs [2]string
	var builds [2]listing.Build
	base := e.cfgPath
	for i, host := range []string{"host-a", "host-b"} {
		image := "img-" + host
		e.cfgPath = base
		e.writeYAML(fmt.Sprintf(one, host, host, image, image))
		cfgs[i] = filepath.Join(e.dir, host+".yaml")
		if err := os.Rename(e.cfgPath, cfgs[i]); err != nil {
			t.Fatal(err)
		}
		e.cfgPath = cfgs[i]
		e.once(0)
		builds[i] = e.buildsOf(image)[0]
	}
	da := startDaemon(t, cfgs[0])
	db := startDaemon(t, cfgs[1])
	for i, d := range []*daemon{da, db} {
		waitWorkers(t, gd, d, "image-upload:"+builds[i].BuildID, 1)
		waitWorkers(t, gd, d, "image-delete:"+builds[i].BuildID, 1)
	}

	// An upload job reaches the builder that holds the build, and no other.
	e.cfgPath = cfgs[1]
	up, ok := e.readyUpload(builds[1].BuildID, "cloud-q")
	if !ok {
		t.Fatalf("host-b's build has no ready upload")
	}
	if ext := gearmanJob(t, gd, "image-upload:"+builds[1].BuildID, "cloud-q").ok(t, "upload of host-b's build"); ext != up.ExternalID {
		t.Errorf("upload job of host-b's build answered %s, want its upload's image %s", ext, up.ExternalID)
	}
	// The daemon logs a job once its answer is sent: the client may have it first.
	db.waitLog(t, 10*time.Second, "image-upload:"+builds[1].BuildID)
	if strings.Contains(da.logs.String(), "image-upload:"+builds[1].BuildID) {
		t.Errorf("the upload job was not served by host-b alone:\n%s", da.logs.String())
	}

	// A delete job reaches host-a, which holds its build.
	e.cfgPath = cfgs[0]
	gearmanJob(t, gd, "image-delete:"+builds[0].BuildID, "").ok(t, "delete of host-a's build")
	if e.listed(builds[0].BuildID) {
		t.Errorf("host-a's build still listed after image-delete")
	}

	// A builder that stops takes its functions with it.
	da.cmd.Process.Signal(syscall.SIGTERM)
	<-da.exited
	waitWorkers(t, gd, db, "image-build:img-host-a", 0)
	if w := workers(t, gd)["image-build:img-host-b"]; w != 1 {
		t.Errorf("image-build:img-host-b has %d workers after host-a stopped, want 1", w)
	}
}

func TestGearmandRestartMidJob(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	gd := testenv.NewGearmand(t)
	e.writeGearmanConfig(gd)
	e.letBuildsFinish()
	e.once(0)
	// From now on a build waits for the test.
	for _, f := range []string{"go", "go.started"} {
		if err := os.Remove(filepath.Join(e.dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	d := startDaemon(t, e.cfgPath)
	waitWorkers(t, gd, d, "image-build:dib-image", 1)

	// A build asked for with a request id; gearmand dies while it runs.
	done := make(chan gearmanCall, 1)
	go func() { done <- gearmanJob(t, gd, "image-build:dib-image", "nightly-42") }()
	testenv.WaitFor(t, 30*time.Second, "the build to start", func() bool {
		_, err := os.Stat(filepath.Join(e.dir, "go.started"))
		return err == nil
	}, d.logs.String)
	if err := gd.Kill(); err != nil {
		t.Fatal(err)
	}
	// The gearman command ends when its server dies (with status 0, as it
	// happens), without an answer.
	if c := <-done; c.out != "" {
		t.Fatalf("the client of a killed gearmand got the answer %q before the build ended", c.out)
	}
	if err := gd.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The builder reconnects and registers again; the build finishes meanwhile.
	waitWorkers(t, gd, d, "image-build:dib-image", 1)
	e.letBuildsFinish()
	d.waitLog(t, 60*time.Second, "connection was lost before its answer")
	builds := e.buildsOf("dib-image")
	if len(builds) != 2 || builds[0].State != "ready" {
		t.Fatalf("builds after the interrupted job: %+v", builds)
	}
	// The same job asked again: the build it made, at once, and no new build.
	if id := gearmanJob(t, gd, "image-build:dib-image", "nightly-42").ok(t, "the same job again"); id != builds[0].BuildID {
		t.Errorf("the same job again answered %s, want %s", id, builds[0].BuildID)
	}
	if n := len(e.buildsOf("dib-image")); n != 2 {
		t.Errorf("%d builds after the job was asked again, want 2", n)
	}
}
