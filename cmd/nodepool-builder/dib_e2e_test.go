package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/listing"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/uploader"
	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

// fakeDIBCmd is a dib-cmd, quoted for YAML, that runs dib's fake
// disk-image-create through bash.
func fakeDIBCmd(t *testing.T) string {
	t.Helper()
	script, err := filepath.Abs(filepath.Join("..", "..", "dib", "testdata", "fake-disk-image-create"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(script); err != nil {
		t.Fatal(err)
	}
	return strconv.Quote("bash '" + script + "'")
}

// debianZuulImage is the zuul-images entry of the stand-in Zuul's debian job,
// polled every second; {{ZUUL}} is the stand-in's URL.
const debianZuulImage = `  - name: debian
    api-url: {{ZUUL}}
    tenant: example
    project: org/images
    job: build-debian
    poll-interval: 1
`

// writeYAML replaces the env's config with text, after filling in {{IMAGES}},
// {{LOGS}} (the build-log-dir), {{DIB}} (the fake disk-image-create), {{CLOUD}},
// {{DIR}} (the env's directory), {{ZUUL}} (the stand-in Zuul) and {{DEBIAN}}
// (debianZuulImage).
func (e *env) writeYAML(text string) {
	e.t.Helper()
	r := strings.NewReplacer(
		"{{IMAGES}}", e.imagesDir(),
		"{{LOGS}}", e.buildLogDir(),
		"{{DIB}}", fakeDIBCmd(e.t),
		"{{CLOUD}}", e.glance.Cloud,
		"{{DIR}}", e.dir,
		"{{ZUUL}}", e.zuul.URL(),
	)
	text = strings.ReplaceAll(text, "{{DEBIAN}}", debianZuulImage)
	if err := os.WriteFile(e.cfgPath, []byte(r.Replace(text)), 0o644); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) imagesDir() string   { return filepath.Join(e.dir, "images") }
func (e *env) buildLogDir() string { return filepath.Join(e.dir, "logs", "builds") }

// checkPrivate fails the test when anything in the images-dir (images,
// sidecars, manifests, the state, status files) or the build-log-dir is open
// to every user of the host: a file they may read, a directory they may enter.
func (e *env) checkPrivate() {
	e.t.Helper()
	seen := 0
	for _, root := range []string{e.imagesDir(), e.buildLogDir()} {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			seen++
			if fi.Mode()&fs.ModeSymlink == 0 && fi.Mode().Perm()&0o007 != 0 {
				e.t.Errorf("%s has mode %v: open to every user", path, fi.Mode().Perm())
			}
			return nil
		})
		if err != nil {
			e.t.Fatalf("walk %s: %v", root, err)
		}
	}
	if seen < 10 {
		e.t.Errorf("found %d files and directories to check; want the images, the state and the logs", seen)
	}
}

// buildLog returns the DIB log of a build.
func (e *env) buildLog(b listing.Build) string {
	e.t.Helper()
	data, err := os.ReadFile(filepath.Join(e.buildLogDir(), b.ID+".log"))
	if err != nil {
		e.t.Fatalf("build log of %s: %v", b.ID, err)
	}
	return string(data)
}

// buildFiles lists what a build has in the images-dir: its formats, their
// sidecars and DIB's .d directory.
func (e *env) buildFiles(b listing.Build) []string {
	e.t.Helper()
	files, err := filepath.Glob(filepath.Join(e.imagesDir(), b.ID+".*"))
	if err != nil {
		e.t.Fatal(err)
	}
	return files
}

// gone reports whether Glance no longer holds an image.
func (e *env) gone(id string) bool {
	e.t.Helper()
	_, err := e.cloud.Get(context.Background(), id)
	if err != nil && !errors.Is(err, uploader.ErrNotFound) {
		e.t.Fatalf("get image %s from Glance: %v", id, err)
	}
	return err != nil
}

// storeUploads reads the upload records straight from the state database, for
// what image-list does not show (attempts, last_error).
func (e *env) storeUploads(f store.UploadFilter) []store.Upload {
	e.t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, store.Options{ImagesDir: e.imagesDir()})
	if err != nil {
		e.t.Fatal(err)
	}
	defer st.Close()
	ups, err := st.Uploads(ctx, f)
	if err != nil {
		e.t.Fatal(err)
	}
	return ups
}

// checkUploaded fails the test unless the provider holds exactly one active
// Glance image of the build, in format, whose data is the build's file.
func (e *env) checkUploaded(provider string, b listing.Build, format string) uploader.CloudImage {
	e.t.Helper()
	var mine []uploader.CloudImage
	for _, img := range e.images(provider) {
		if img.Properties[uploader.PropBuildID] == b.BuildID {
			mine = append(mine, img)
		}
	}
	if len(mine) != 1 {
		e.t.Fatalf("%s holds %d images of %s, want 1: %+v", provider, len(mine), b.ID, e.images(provider))
	}
	img := mine[0]
	if img.DiskFormat != format || img.Status != "active" {
		e.t.Errorf("%s image of %s is %s %s, want %s active", provider, b.ID, img.DiskFormat, img.Status, format)
	}
	file := filepath.Join(e.imagesDir(), b.ID+"."+format)
	if got, want := e.glanceData(img.ID), fileSHA256(e.t, file); got != want {
		e.t.Errorf("%s image %s data sha256 %s, want %s of %s", provider, img.ID, got, want, file)
	}
	return img
}

const dibTwoProviders = `images-dir: {{IMAGES}}
build-log-dir: {{LOGS}}
diskimages:
  - name: dib-image
    dib-cmd: {{DIB}}
    elements: [debian-minimal, vm]
providers:
  - name: cloud-q
    cloud: {{CLOUD}}
    image-format: qcow2
    diskimages:
      - name: dib-image
  - name: cloud-r
    cloud: {{CLOUD}}
    image-format: raw
    diskimages:
      - name: dib-image
builder:
  keep-uploads: 2
  keep-builds: 2
`

func TestOnceDIBBuildsFollowTheLifecycle(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	e.writeYAML(dibTwoProviders)
	e.once(0)

	builds := e.buildsJSON()
	if len(builds) != 1 {
		t.Fatalf("dib-image-list = %+v, want one build", builds)
	}
	b := builds[0]
	if b.Source != "dib" || b.Image != "dib-image" || b.State != "ready" || strings.Join(b.Formats, ",") != "qcow2,raw" ||
		b.ID != store.BuildName("dib-image", b.BuildID) || b.ZuulBuildUUID != "" {
		t.Fatalf("dib-image-list = %+v, want a ready dib build in qcow2 and raw", b)
	}
	e.checkUploaded("cloud-q", b, "qcow2")
	e.checkUploaded("cloud-r", b, "raw")
	if log := e.buildLog(b); !strings.HasSuffix(log, "Exit code: 0\n") || !strings.Contains(log, "fake diskimage-builder: building dib-image") {
		t.Errorf("build log does not hold DIB's output and end with Exit code: 0:\n%s", log)
	}
	if ups := e.uploadsJSON(); len(ups) != 2 || ups[0].State != "ready" || ups[1].State != "ready" {
		t.Errorf("image-list = %+v, want two ready uploads", ups)
	}

	// Nothing is due: a run builds and uploads nothing.
	e.once(0)
	if n := len(e.buildsJSON()); n != 1 {
		t.Fatalf("a run with nothing due built: %d builds", n)
	}

	// Requested rebuilds rotate as Zuul builds do.
	all := []listing.Build{b}
	first := append(e.images("cloud-q"), e.images("cloud-r")...)
	for i := 2; i <= 4; i++ {
		e.must(0, []string{"image-build", "dib-image"})
		e.once(0)
		newest := e.buildsJSON()[0]
		if newest.BuildID == all[len(all)-1].BuildID || newest.State != "ready" || newest.Source != "dib" {
			t.Fatalf("run %d after image-build: newest build %+v, want a new ready dib build", i, newest)
		}
		all = append(all, newest)
		e.checkUploaded("cloud-q", newest, "qcow2")
		e.checkUploaded("cloud-r", newest, "raw")
		for _, p := range []string{"cloud-q", "cloud-r"} {
			if n := len(e.images(p)); n > 2 {
				t.Fatalf("after build %d %s holds %d images; keep-uploads is 2", i, p, n)
			}
		}
	}
	for _, img := range first {
		if !e.gone(img.ID) {
			t.Errorf("oldest upload %s (%s) still in Glance", img.ID, img.Name)
		}
	}
	for _, old := range all[:2] {
		if files := e.buildFiles(old); len(files) != 0 {
			t.Errorf("files of rotated-out build %s still on disk: %v", old.ID, files)
		}
	}
	var kept []string
	for _, b := range e.buildsJSON() {
		kept = append(kept, b.BuildID)
	}
	if want := []string{all[3].BuildID, all[2].BuildID}; !slices.Equal(kept, want) {
		t.Errorf("builds kept %v, want the two newest %v (keep-builds 2)", kept, want)
	}
	for _, p := range []string{"cloud-q", "cloud-r"} {
		var in []string
		for _, img := range e.images(p) {
			in = append(in, img.Properties[uploader.PropBuildID])
		}
		slices.Sort(in)
		want := []string{all[2].BuildID, all[3].BuildID}
		slices.Sort(want)
		if !slices.Equal(in, want) {
			t.Errorf("%s holds uploads of builds %v, want %v", p, in, want)
		}
	}
	if n := len(e.uploadsJSON()); n != 4 {
		t.Errorf("%d uploads recorded, want 2 per provider", n)
	}
}

// hookScript is a post-upload-hook that appends its arguments to {{DIR}}/hook-calls
// and fails, saying why, while {{DIR}}/hook-fails-<provider> exists.
const hookScript = `#!/bin/sh
echo "$*" >>'{{DIR}}/hook-calls'
if [ -e '{{DIR}}/hook-fails-'"$1" ]; then
	echo "image $2 does not boot on $1" >&2
	exit 3
fi
`

const zuulAndDIB = `images-dir: {{IMAGES}}
build-log-dir: {{LOGS}}
diskimages:
  - name: dib-image
    dib-cmd: {{DIB}}
    elements: [debian-minimal]
zuul-images:
{{DEBIAN}}providers:
  - name: cloud-q
    cloud: {{CLOUD}}
    image-format: qcow2
    post-upload-hook: {{DIR}}/hook
    diskimages:
      - name: debian
      - name: dib-image
  - name: cloud-r
    cloud: {{CLOUD}}
    image-format: raw
    post-upload-hook: {{DIR}}/hook
    diskimages:
      - name: dib-image
builder:
  upload-attempts: 2
`

// hookCalls returns the argument lists the hook was called with, in order.
func (e *env) hookCalls() [][]string {
	e.t.Helper()
	data, err := os.ReadFile(filepath.Join(e.dir, "hook-calls"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		e.t.Fatal(err)
	}
	var calls [][]string
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if line != "" {
			calls = append(calls, strings.Fields(line))
		}
	}
	return calls
}

func TestOnceZuulAndDIBImagesWithPostUploadHook(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	e.writeYAML(zuulAndDIB)
	hook := filepath.Join(e.dir, "hook")
	if err := os.WriteFile(hook, []byte(strings.ReplaceAll(hookScript, "{{DIR}}", e.dir)), 0o755); err != nil {
		t.Fatal(err)
	}
	failR := filepath.Join(e.dir, "hook-fails-cloud-r")
	if err := os.WriteFile(failR, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	zuulImg := e.makeImage(1)
	zb := e.addBuild(zuulImg, zuultest.BuildSpec{})

	// One run fetches the Zuul build, builds the diskimage and uploads both to
	// cloud-q; cloud-r's hook refuses its upload, which fails the run.
	r := e.once(1)
	if !strings.Contains(r.stderr, "post-upload-hook") || !strings.Contains(r.stderr, "does not boot on cloud-r") {
		t.Errorf("--once does not report the hook's failure and output:\n%s", r.stderr)
	}
	byImage := map[string]listing.Build{}
	for _, b := range e.buildsJSON() {
		byImage[b.Image] = b
	}
	zbuild, dbuild := byImage["debian"], byImage["dib-image"]
	if zbuild.Source != "zuul" || zbuild.State != "ready" || zbuild.ZuulBuildUUID != zb.UUID ||
		dbuild.Source != "dib" || dbuild.State != "ready" {
		t.Fatalf("dib-image-list = %+v, want a ready Zuul build and a ready DIB build", e.buildsJSON())
	}
	zq := e.checkUploaded("cloud-q", zbuild, "qcow2")
	if got := e.glanceData(zq.ID); got != zuulImg.qcow2Sum {
		t.Errorf("cloud-q's debian image data %s, want the Zuul artifact's %s", got, zuulImg.qcow2Sum)
	}
	dq := e.checkUploaded("cloud-q", dbuild, "qcow2")
	if n := len(e.images("cloud-q")); n != 2 {
		t.Errorf("cloud-q holds %d images, want the two uploads", n)
	}

	// The hook ran for every upload, both sources, as <provider> <external_id> <file>.
	want := func(provider, id string, b listing.Build, format string) {
		t.Helper()
		call := []string{provider, id, filepath.Join(e.imagesDir(), b.ID+"."+format)}
		if calls := e.hookCalls(); !slices.ContainsFunc(calls, func(c []string) bool { return slices.Equal(c, call) }) {
			t.Errorf("hook not called with %q; calls: %q", call, calls)
		}
	}
	want("cloud-q", zq.ID, zbuild, "qcow2")
	want("cloud-q", dq.ID, dbuild, "qcow2")
	var refused []string // the cloud-r images the hook refused
	calls := e.hookCalls()
	for _, c := range calls {
		if len(c) != 3 {
			t.Fatalf("hook called with %q, want <provider> <external_id> <file>", c)
		}
		if c[0] != "cloud-r" {
			continue
		}
		if file := filepath.Join(e.imagesDir(), dbuild.ID+".raw"); c[2] != file {
			t.Errorf("cloud-r's hook called with file %s, want %s", c[2], file)
		}
		refused = append(refused, c[1])
	}
	if len(refused) == 0 {
		t.Fatalf("hook never called for cloud-r; calls: %q", calls)
	}

	// The refused upload: its cloud image deleted, the upload failed with the hook's output.
	if imgs := e.images("cloud-r"); len(imgs) != 0 {
		t.Errorf("cloud-r holds %+v after its hook failed, want none", imgs)
	}
	for _, id := range refused {
		if !e.gone(id) {
			t.Errorf("the image %s the hook refused is still in Glance", id)
		}
	}
	for _, u := range e.uploadsJSON() {
		if state := map[string]string{"cloud-q": "ready", "cloud-r": "failed"}[u.Provider]; u.State != state {
			t.Errorf("image-list: %s upload of %s is %s, want %s", u.Provider, u.Image, u.State, state)
		}
	}
	ups := e.storeUploads(store.UploadFilter{Provider: "cloud-r"})
	if len(ups) != 1 || ups[0].State != store.Failed || ups[0].ExternalID != "" ||
		!strings.Contains(ups[0].LastError, "does not boot on cloud-r") {
		t.Fatalf("cloud-r uploads are %s; want one failed with the hook's output", describeUploads(ups))
	}

	// With the hook fixed, a later run retries the upload (attempts are left).
	if err := os.Remove(failR); err != nil {
		t.Fatal(err)
	}
	// A retry may wait for its backoff: run as cron would until it is done.
	readyR := func() bool {
		return slices.ContainsFunc(e.storeUploads(store.UploadFilter{Provider: "cloud-r"}),
			func(u store.Upload) bool { return u.State == store.Ready })
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Second) {
		e.once(0)
		if readyR() || time.Now().After(deadline) {
			break
		}
	}
	if !readyR() {
		t.Fatalf("after the hook was fixed, cloud-r uploads are %s; want the failed upload retried and ready",
			describeUploads(e.storeUploads(store.UploadFilter{Provider: "cloud-r"})))
	}
	rq := e.checkUploaded("cloud-r", dbuild, "raw")
	want("cloud-r", rq.ID, dbuild, "raw")
	if n := len(e.images("cloud-q")); n != 2 {
		t.Errorf("cloud-q holds %d images after the retry, want its two uploads", n)
	}
	e.checkPrivate()
}

// describeUploads shows upload records for a failure message.
func describeUploads(ups []store.Upload) string {
	var out []string
	for _, u := range ups {
		out = append(out, fmt.Sprintf("{%s %s/%s %s attempts=%d external_id=%q last_error=%q}",
			store.BuildName(u.Image, u.BuildID), u.Provider, u.ID, u.State, u.Attempts, u.ExternalID, u.LastError))
	}
	return "[" + strings.Join(out, " ") + "]"
}

func TestOnceFailedDIBBuildLeavesNothing(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	e.writeYAML(dibTwoProviders)
	e.once(0)
	good := e.buildsJSON()[0]
	before := append(e.images("cloud-q"), e.images("cloud-r")...)

	// DIB fails after writing its files.
	e.writeYAML(strings.Replace(dibTwoProviders, "    elements: [debian-minimal, vm]\n",
		"    elements: [debian-minimal, vm]\n    env-vars: {FAKE_DIB_EXIT: \"7\"}\n", 1))
	e.must(0, []string{"image-build", "dib-image"})
	r := e.once(1)
	if !strings.Contains(r.stderr, "exited with code 7") {
		t.Errorf("--once does not say DIB exited with code 7:\n%s", r.stderr)
	}
	builds := e.buildsJSON()
	if len(builds) != 2 || builds[1].BuildID != good.BuildID || builds[1].State != "ready" {
		t.Fatalf("dib-image-list = %+v, want the failed build and the earlier ready one", builds)
	}
	failed := builds[0]
	if failed.State != "failed" || failed.Source != "dib" {
		t.Fatalf("dib-image-list shows the failed build as %+v", failed)
	}
	if !strings.Contains(r.stderr, filepath.Join(e.buildLogDir(), failed.ID+".log")) {
		t.Errorf("--once does not name the failed build's log:\n%s", r.stderr)
	}
	if files := e.buildFiles(failed); len(files) != 0 {
		t.Errorf("files of the failed build left in images-dir: %v", files)
	}
	if log := e.buildLog(failed); !strings.HasSuffix(log, "failing with 7\nExit code: 7\n") {
		t.Errorf("build log does not end with DIB's output and Exit code: 7:\n%s", log)
	}
	if st, _ := e.status(); st["dib-image"].BuildRequest != nil {
		t.Errorf("image-status after the failed build = %+v, want the request settled", st["dib-image"])
	}

	// The earlier build and its uploads are untouched.
	if len(e.buildFiles(good)) == 0 {
		t.Errorf("the earlier build's files went")
	}
	after := append(e.images("cloud-q"), e.images("cloud-r")...)
	if len(after) != len(before) || after[0].ID != before[0].ID || after[1].ID != before[1].ID {
		t.Errorf("a failed build changed the clouds: %+v -> %+v", before, after)
	}
	for _, u := range e.uploadsJSON() {
		if u.BuildID != good.BuildID || u.State != "ready" {
			t.Errorf("image-list row %+v, want only the earlier build's ready uploads", u)
		}
	}
}

func TestDaemonHonoursImageBuild(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	e.writeYAML(`images-dir: {{IMAGES}}
build-log-dir: {{LOGS}}
diskimages:
  - name: dib-image
    dib-cmd: {{DIB}}
    elements: [debian-minimal]
    rebuild-age: 604800
providers:
  - name: cloud-q
    cloud: {{CLOUD}}
    image-format: qcow2
    diskimages:
      - name: dib-image
`)
	e.once(0)
	first := e.buildsJSON()[0]
	e.checkUploaded("cloud-q", first, "qcow2")

	d := startDaemon(t, e.cfgPath)
	testenv.WaitFor(t, 30*time.Second, "the daemon to start", func() bool {
		return strings.Contains(d.logs.String(), "config loaded")
	}, d.logs.String)
	e.must(0, []string{"image-build", "dib-image"})
	var second listing.Build
	testenv.WaitFor(t, 30*time.Second, "a new build and its upload after image-build", func() bool {
		builds := e.buildsJSON()
		if len(builds) != 2 || builds[0].State != "ready" {
			return false
		}
		second = builds[0]
		return slices.ContainsFunc(e.uploadsJSON(), func(u listing.Upload) bool {
			return u.BuildID == second.BuildID && u.Provider == "cloud-q" && u.State == "ready"
		})
	}, d.logs.String)
	if second.BuildID == first.BuildID || second.Source != "dib" {
		t.Fatalf("newest build %+v, want a new dib build", second)
	}
	e.checkUploaded("cloud-q", second, "qcow2")
	if st, _ := e.status(); st["dib-image"].BuildRequest != nil || st["dib-image"].NewestBuild == nil || *st["dib-image"].NewestBuild != second.ID {
		t.Errorf("image-status after the requested build = %+v, want no request and newest build %s", st["dib-image"], second.ID)
	}

	// A paused image: image-build is refused and nothing is requested.
	e.must(0, []string{"image-pause", "dib-image"})
	e.must(exitFailed, []string{"image-build", "dib-image"}, "paused (image-pause)")
	if st, _ := e.status(); st["dib-image"].BuildRequest != nil || !st["dib-image"].Paused {
		t.Errorf("image-status after a refused image-build = %+v, want paused with no request", st["dib-image"])
	}
}

// TestOnceSaysWhatAFailedBuildHoldsBack: after a failed DIB build, the next
// --once builds nothing for the backoff, and says so: it exits 1, and its
// summary names the backoff, the failed build's log and the next attempt, as
// image-status does. An image-build request builds it at once.
func TestOnceSaysWhatAFailedBuildHoldsBack(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	e.writeYAML(strings.Replace(dibTwoProviders, "    elements: [debian-minimal, vm]\n",
		"    elements: [debian-minimal, vm]\n    env-vars: {FAKE_DIB_EXIT: \"1\"}\n", 1))
	if r := e.once(1); !strings.Contains(r.stderr, "exited with code 1") {
		t.Fatalf("the first --once does not say DIB failed:\n%s", r.stderr)
	}
	builds := e.buildsJSON()
	if len(builds) != 1 || builds[0].State != "failed" {
		t.Fatalf("dib-image-list after the failed build = %+v", builds)
	}
	failed := builds[0]
	log := filepath.Join(e.buildLogDir(), failed.ID+".log")
	failedAt, err := time.Parse(time.RFC3339, failed.StateTime)
	if err != nil {
		t.Fatal(err)
	}
	next := failedAt.Add(10 * time.Minute).Format(time.RFC3339)

	r := e.once(1)
	for _, want := range []string{"1 due step(s) not done", "dib-image: not built", failed.ID, "backoff", log,
		"next attempt after " + next, "image-build dib-image"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("the second --once does not say %q:\n%s", want, r.stderr)
		}
	}
	if strings.Contains(r.stderr, "step(s) failed") {
		t.Errorf("the second --once counts the held-back build as a failure:\n%s", r.stderr)
	}
	if n := len(e.buildsJSON()); n != 1 {
		t.Fatalf("the second --once built again within the backoff: %d builds", n)
	}

	st, _ := e.status()
	row := st["dib-image"]
	str := func(p *string) string {
		if p == nil {
			return "<null>"
		}
		return *p
	}
	if str(row.LastFailure) != failed.ID || str(row.LastFailureLog) != log || str(row.NextAttempt) != next ||
		!strings.Contains(str(row.LastFailureReason), "exited with code 1") {
		t.Errorf("image-status --json of dib-image = failure %s (%s), log %s, next attempt %s; want %s, %s, %s",
			str(row.LastFailure), str(row.LastFailureReason), str(row.LastFailureLog), str(row.NextAttempt), failed.ID, log, next)
	}
	if out := e.must(0, []string{"image-status"}).stdout; !tableRowHas(out, "dib-image", next) || !strings.Contains(out, log) {
		t.Errorf("image-status does not show the next attempt %s and the log %s:\n%s", next, log, out)
	}

	// Asked for, it is built at once, and fails again: a failure this time.
	e.must(0, []string{"image-build", "dib-image"})
	r = e.once(1)
	if !strings.Contains(r.stderr, "1 step(s) failed") || strings.Contains(r.stderr, "not done") {
		t.Errorf("--once with a request in the backoff:\n%s", r.stderr)
	}
	// The older failed build goes once a newer one exists.
	if builds := e.buildsJSON(); len(builds) != 1 || builds[0].ID == failed.ID {
		t.Errorf("the requested build was not made within the backoff: %+v\n%s", builds, r.stderr)
	}
}
