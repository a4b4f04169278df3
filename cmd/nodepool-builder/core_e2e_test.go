package main

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/listing"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/uploader"
	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

// proxiedClouds writes a clouds.yaml in which each named cloud reaches the env's
// Glance through its own proxy, and makes it the one every run reads.
func (e *env) proxiedClouds(names ...string) map[string]*testenv.Proxy {
	e.t.Helper()
	target := strings.TrimPrefix(strings.TrimSuffix(e.glance.Endpoint, "/"), "http://")
	proxies := map[string]*testenv.Proxy{}
	yaml := "clouds:\n"
	for _, n := range names {
		p := testenv.NewProxy(e.t, target)
		proxies[n] = p
		yaml += fmt.Sprintf("  %s:\n    auth_type: none\n    image_endpoint_override: %s\n", n, p.URL())
	}
	yaml += fmt.Sprintf("  %s:\n    auth_type: none\n    image_endpoint_override: %s\n", e.glance.Cloud, e.glance.Endpoint)
	path := filepath.Join(e.dir, "clouds.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		e.t.Fatal(err)
	}
	e.t.Setenv("OS_CLIENT_CONFIG_FILE", path)
	return proxies
}

// makeImageSized is makeImage with a raw image of size bytes, its first MiB random.
func (e *env) makeImageSized(seed int64, size int) image {
	e.t.Helper()
	dir := filepath.Join(e.dir, fmt.Sprintf("big-%d", seed))
	os.MkdirAll(dir, 0o755)
	img := image{raw: filepath.Join(dir, "disk.raw"), qcow2: filepath.Join(dir, "disk.qcow2")}
	data := make([]byte, size)
	rand.New(rand.NewSource(seed)).Read(data[:1<<20])
	if err := os.WriteFile(img.raw, data, 0o644); err != nil {
		e.t.Fatal(err)
	}
	img.rawSum = fileSHA256(e.t, img.raw)
	return img
}

// readyUpload returns the ready upload of a build to a provider, if any.
func (e *env) readyUpload(buildID, provider string) (listing.Upload, bool) {
	for _, u := range e.uploadsJSON() {
		if u.BuildID == buildID && u.Provider == provider && u.State == "ready" {
			return u, true
		}
	}
	return listing.Upload{}, false
}

// zuulUploaded tells whether the store build fetched from a Zuul build has a
// ready upload to every provider.
func (e *env) zuulUploaded(zb zuultest.Build, providers ...string) func() bool {
	return func() bool {
		b, ok := e.zuulBuildOf(zb.UUID)
		for _, p := range providers {
			if _, ready := e.readyUpload(b.BuildID, p); !ok || !ready {
				return false
			}
		}
		return ok
	}
}

// zuulBuildOf returns the store build fetched from a Zuul build, if any.
func (e *env) zuulBuildOf(uuid string) (listing.Build, bool) {
	for _, b := range e.buildsJSON() {
		if b.ZuulBuildUUID == uuid {
			return b, true
		}
	}
	return listing.Build{}, false
}

const proxiedConfig = `images-dir: {{IMAGES}}
zuul-images:
{{DEBIAN}}providers:
  - name: cloud-q
    cloud: glance
    image-format: qcow2
    diskimages:
      - name: debian
  - name: cloud-r
    cloud: glance
    image-format: raw
    diskimages:
      - name: debian
builder:
  upload-attempts: 2
`

// TestDaemonUploadsOnceGlanceIsBack: a daemon started while Glance cannot be
// reached uploads, without a restart, once it can; an upload left uploading by
// a killed builder is settled by a daemon that started while Glance was down.
// Neither uses up upload-attempts.
func TestDaemonUploadsOnceGlanceIsBack(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	proxies := e.proxiedClouds("glance")
	glance := proxies["glance"]
	e.writeYAML(proxiedConfig)
	glance.Down()
	zb := e.addBuild(e.makeImage(1), zuultest.BuildSpec{})

	d := startDaemon(t, e.cfgPath)
	d.waitLog(t, 60*time.Second, "the cloud could not be reached")
	// The uploads that follow the download may fail before it ends.
	var b listing.Build
	testenv.WaitFor(t, 60*time.Second, "the Zuul build fetched while Glance is down", func() bool {
		var ok bool
		b, ok = e.zuulBuildOf(zb.UUID)
		return ok && b.State == "ready"
	}, func() string { return fmt.Sprintf("%+v\n%s", e.buildsJSON(), d.logs.String()) })
	// image-list says why the upload failed.
	testenv.WaitFor(t, 30*time.Second, "image-list to show the failed upload's reason", func() bool {
		for _, u := range e.uploadsJSON() {
			if u.State == "failed" && strings.Contains(u.Reason, "connection refused") {
				return true
			}
		}
		return false
	}, d.logs.String)
	if out := e.must(0, []string{"image-list"}).stdout; !slices.Contains(tableHeader(out), "Reason") || !strings.Contains(out, "connection refused") {
		t.Errorf("image-list table shows no reason:\n%s", out)
	}
	if err := glance.Up(); err != nil {
		t.Fatal(err)
	}
	e.waitUploaded(d, 90*time.Second, "once Glance is back", b, "cloud-q", "cloud-r")
	for _, u := range e.storeUploads(store.UploadFilter{BuildID: b.BuildID}) {
		if u.Attempts != 1 {
			t.Errorf("upload to %s took %d attempts; the tries while Glance was down must not count", u.Provider, u.Attempts)
		}
	}
	d.kill()

	// A builder killed in the middle of an upload, restarted while Glance is
	// down: the uploads follow the download, and are still under way once
	// the build is ready, through a slow link.
	glance.SetRate(256 << 10)
	zb2 := e.addBuild(e.makeImage(2), zuultest.BuildSpec{})
	killed := startMain(t, `msg="build ready"`, "-c", e.cfgPath)
	select {
	case <-killed.exited:
	case <-time.After(60 * time.Second):
		t.Fatalf("no upload started\n%s", killed.logs.String())
	}
	b2, ok := e.zuulBuildOf(zb2.UUID)
	if !ok || len(e.storeUploads(store.UploadFilter{BuildID: b2.BuildID, State: store.Uploading})) == 0 {
		t.Fatalf("the kill left no upload uploading: builds %+v, uploads %+v\n%s", e.buildsJSON(), e.uploadsJSON(), killed.logs.String())
	}
	glance.SetRate(0)
	glance.Down()
	d = startDaemon(t, e.cfgPath)
	d.waitLog(t, 60*time.Second, "recovery incomplete")
	if n := len(e.storeUploads(store.UploadFilter{BuildID: b2.BuildID, State: store.Uploading})); n == 0 {
		t.Fatal("the interrupted upload was settled without asking Glance")
	}
	if err := glance.Up(); err != nil {
		t.Fatal(err)
	}
	e.waitUploaded(d, 90*time.Second, "after the interrupted upload is settled, without a restart", b2, "cloud-q", "cloud-r")
}

// waitUploaded waits until a build has a ready upload to each provider, then
// checks that each cloud holds the build's file, in the provider's format.
func (e *env) waitUploaded(d *daemon, timeout time.Duration, when string, b listing.Build, providers ...string) {
	e.t.Helper()
	testenv.WaitFor(e.t, timeout, fmt.Sprintf("uploads of %s to %v %s", b.ID, providers, when), func() bool {
		for _, p := range providers {
			if _, ok := e.readyUpload(b.BuildID, p); !ok {
				return false
			}
		}
		return true
	}, d.logs.String)
	for _, p := range providers {
		u, _ := e.readyUpload(b.BuildID, p)
		e.checkUploaded(p, b, u.Format)
	}
}

// TestSlowProviderHoldsNoOtherBack: two providers in front of one Glance, one
// slowed to 128 KiB/s; a build that arrives while the slow one uploads reaches
// the other while the slow one is still at it (on an idle machine within
// poll-interval + a few seconds; the test logs how long it took).
// The slow upload takes minutes, so that a loaded machine cannot make the
// fast one lose the race; the test lifts the limit once it has its answer.
func TestSlowProviderHoldsNoOtherBack(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	proxies := e.proxiedClouds("slow")
	proxies["slow"].SetRate(128 << 10)
	e.writeYAML(`images-dir: {{IMAGES}}
zuul-images:
{{DEBIAN}}providers:
  - name: cloud-a
    cloud: slow
    image-format: raw
    diskimages:
      - name: debian
  - name: cloud-b
    cloud: {{CLOUD}}
    image-format: raw
    diskimages:
      - name: debian
`)
	raw := func(img image) []zuultest.ArtifactSpec {
		return []zuultest.ArtifactSpec{{Name: "debian raw", Path: img.raw, Compress: "zst", Metadata: zuulImageMeta("raw")}}
	}
	const size = 24 << 20 // over three minutes through the slow proxy
	img1 := e.makeImageSized(1, size)
	zb1 := e.addBuild(img1, zuultest.BuildSpec{Artifacts: raw(img1)})
	d := startDaemon(t, e.cfgPath)
	testenv.WaitFor(t, 60*time.Second, "the first build's upload to cloud-b", e.zuulUploaded(zb1, "cloud-b"), d.logs.String)
	if e.zuulUploaded(zb1, "cloud-a")() {
		t.Fatal("the slow provider finished before the test could begin; slow it down more")
	}

	img2 := e.makeImageSized(2, size)
	zb2 := e.addBuild(img2, zuultest.BuildSpec{Artifacts: raw(img2)})
	arrived := time.Now()
	testenv.WaitFor(t, 60*time.Second, "the new build at cloud-b while cloud-a uploads", e.zuulUploaded(zb2, "cloud-b"), d.logs.String)
	if e.zuulUploaded(zb1, "cloud-a")() {
		t.Fatalf("cloud-a finished its upload before cloud-b had the new build (%s): the test proved nothing",
			time.Since(arrived).Round(time.Second))
	}
	t.Logf("cloud-b had the new build %s after it arrived, while cloud-a was still uploading", time.Since(arrived).Round(100*time.Millisecond))
	// The slow provider gets there too.
	proxies["slow"].SetRate(0)
	testenv.WaitFor(t, 120*time.Second, "cloud-a to get the newest build", e.zuulUploaded(zb2, "cloud-a"), d.logs.String)
}

// TestReloadDuringLongDIBBuild: a config reload while a DIB build runs takes
// effect at once: polls and uploads go on under the new config, and the build
// finishes and is uploaded.
func TestReloadDuringLongDIBBuild(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	release := filepath.Join(e.dir, "dib-may-finish")
	write := func(debianInR string) {
		e.writeYAML(fmt.Sprintf(`images-dir: {{IMAGES}}
build-log-dir: {{LOGS}}
diskimages:
  - name: dib-image
    dib-cmd: {{DIB}}
    elements: [debian-minimal]
    env-vars:
      FAKE_DIB_WAIT_FOR: %s
zuul-images:
{{DEBIAN}}providers:
  - name: cloud-q
    cloud: {{CLOUD}}
    image-format: qcow2
    diskimages:
      - name: dib-image
      - name: debian
  - name: cloud-r
    cloud: {{CLOUD}}
    image-format: raw
    diskimages:
%s`, release, debianInR))
	}
	write("      []\n")
	d := startDaemon(t, e.cfgPath)
	testenv.WaitFor(t, 30*time.Second, "the DIB build to start", func() bool {
		_, err := os.Stat(release + ".started")
		return err == nil
	}, d.logs.String)

	write("      - name: debian\n")
	d.cmd.Process.Signal(syscall.SIGHUP)
	d.waitLog(t, 30*time.Second, `msg="config reloaded"`)
	zb := e.addBuild(e.makeImage(1), zuultest.BuildSpec{})
	testenv.WaitFor(t, 60*time.Second, "the Zuul build uploaded under the new config while DIB builds",
		e.zuulUploaded(zb, "cloud-q", "cloud-r"), d.logs.String)
	building := 0
	for _, b := range e.buildsJSON() {
		if b.Image == "dib-image" && b.State == "building" {
			building++
		}
	}
	if building != 1 {
		t.Fatalf("the DIB build is not running any more: %+v", e.buildsJSON())
	}

	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 60*time.Second, "the DIB build to finish and be uploaded", func() bool {
		for _, b := range e.buildsJSON() {
			if b.Image == "dib-image" && b.State == "ready" {
				_, q := e.readyUpload(b.BuildID, "cloud-q")
				return q
			}
		}
		return false
	}, d.logs.String)
}

// lifecycleEvents are log lines the kill test kills the builder right after.
var lifecycleEvents = []string{
	`msg="new Zuul build"`,
	`msg="download complete"`,
	`msg="build ready"`,
	`msg="building image"`,
	`msg="image build finished"`,
	`msg="upload started"`,
	` from=download`, // an upload started that follows the download
	`msg="image active"`,
	`msg="upload ready"`,
	`msg="releasing upload"`,
	`msg="releasing build"`,
	`msg="deleted cloud image"`,
	`msg="deleted build"`,
}

// recoveryEvents are log lines of a builder settling what a killed one left;
// the kill test kills the second builder of a round right after one of them.
var recoveryEvents = []string{
	`msg="interrupted upload had finished`,
	`msg="upload was interrupted`,
	`msg="deleted half-made image"`,
	`msg="build was interrupted`,
	`msg="removed leftover file"`,
}

// bothSources is a config of a zuul-image and a diskimage (the fake
// disk-image-create, a second per build) on two providers of the env's Glance.
const bothSources = `images-dir: {{IMAGES}}
build-log-dir: {{LOGS}}
diskimages:
  - name: dib-image
    dib-cmd: {{DIB}}
    elements: [debian-minimal]
    env-vars:
      FAKE_DIB_SLEEP: "1"
zuul-images:
{{DEBIAN}}providers:
  - name: cloud-q
    cloud: {{CLOUD}}
    image-format: qcow2
    diskimages:
      - name: debian
      - name: dib-image
  - name: cloud-r
    cloud: {{CLOUD}}
    image-format: raw
    diskimages:
      - name: debian
builder:
  keep-builds: 2
  keep-uploads: 2
  # some uploads are killed (every round here, one in the ZooKeeper tests):
  # the attempts are not what is tested
  upload-attempts: 1000
`

// TestKill9 kills the daemon and --once with SIGKILL, right after each lifecycle
// event and at random moments, over many rounds against the real Glance. After
// every round, the builder converges: the newest build of each image uploaded to
// every provider, no leaked cloud image, none left queued or saving, no orphan
// file in the images-dir.
func TestKill9(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	e.writeYAML(bothSources)
	rng := rand.New(rand.NewSource(time.Now().UnixNano()))
	seed := rng.Int63()
	t.Logf("random seed %d", seed)
	rng = rand.New(rand.NewSource(seed))

	// A first run makes the state every round starts from.
	latest := e.addBuild(e.makeImage(99), zuultest.BuildSpec{})
	e.converge(t, -1, latest)
	rounds := 2 * len(lifecycleEvents)
	if testing.Short() {
		rounds = len(lifecycleEvents)
	}
	modes := [][]string{{"-c", e.cfgPath}, {"-c", e.cfgPath, "--once"}}
	// kill runs a builder in a mode and kills it right after an event, or at a
	// random moment when event is "" (or after timeout when the event never comes).
	kill := func(mode []string, event string, timeout time.Duration) string {
		p := startMain(t, event, mode...)
		how := "right after " + event
		if event == "" {
			how, timeout = "at a random moment", time.Duration(rng.Int63n(int64(3*time.Second)))
		}
		select {
		case <-p.exited:
			if event != "" && !strings.Contains(p.logs.String(), event) {
				how = "never: it finished first"
			}
		case <-time.After(timeout):
			p.kill()
			if event != "" {
				how = "after " + timeout.String() + " without " + event
			}
		}
		name := "daemon"
		if len(mode) == 3 {
			name = "--once"
		}
		return name + " killed " + how
	}
	for r := range rounds {
		// Every round brings a Zuul build and asks for a DIB build, so that most
		// events happen in it; rotation then has work too.
		latest = e.addBuild(e.makeImage(int64(100+r)), zuultest.BuildSpec{})
		e.must(0, []string{"image-build", "dib-image"})
		event := lifecycleEvents[r%len(lifecycleEvents)]
		if r%4 == 3 {
			event = ""
		}
		first := kill(modes[r%2], event, 10*time.Second)
		// A second builder settles what the first left, and is killed too.
		event = recoveryEvents[r%len(recoveryEvents)]
		if r%3 == 2 {
			event = ""
		}
		second := kill(modes[(r+1)%2], event, 5*time.Second)
		t.Logf("round %d: %s; then %s", r, first, second)
		e.converge(t, r, latest)
	}
}

// converge runs --once until the state holds what the config asks (at most three
// runs: a leak is deleted on its second sighting), and fails the test otherwise.
func (e *env) converge(t *testing.T, round int, latest zuultest.Build) {
	t.Helper()
	var why string
	var logs []string
	for range 3 {
		r := e.run("--once")
		logs = append(logs, r.stderr)
		if r.code != 0 {
			why = fmt.Sprintf("--once exited %d", r.code)
			continue
		}
		if why = e.invariants(latest); why == "" {
			return
		}
	}
	t.Fatalf("round %d did not converge: %s\n--once logs:\n%s", round, why, strings.Join(logs, "\n---\n"))
}

// invariants says what is wrong with the state after a converged run, or "".
func (e *env) invariants(latest zuultest.Build) string {
	ctx := context.Background()
	builds := e.buildsJSON()
	uploads := e.uploadsJSON()
	var newest []listing.Build
	if b, ok := e.zuulBuildOf(latest.UUID); ok && b.State == "ready" {
		newest = append(newest, b)
	} else {
		return fmt.Sprintf("the newest Zuul build %s is not ready: %+v", latest.UUID, builds)
	}
	for _, b := range builds {
		if b.Image == "dib-image" && b.State == "ready" {
			newest = append(newest, b)
			break
		}
	}
	if len(newest) != 2 {
		return fmt.Sprintf("dib-image has no ready build: %+v", builds)
	}
	for _, b := range builds {
		if b.State != "ready" {
			return fmt.Sprintf("build %s is %s", b.ID, b.State)
		}
	}
	want := map[string][]string{"debian": {"cloud-q", "cloud-r"}, "dib-image": {"cloud-q"}}
	for _, b := range newest {
		for _, p := range want[b.Image] {
			if _, ok := e.readyUpload(b.BuildID, p); !ok {
				return fmt.Sprintf("the newest build %s has no ready upload to %s", b.ID, p)
			}
		}
	}
	live := map[string]bool{}
	for _, u := range uploads {
		if u.State != "ready" {
			return fmt.Sprintf("upload %s/%s/%s is %s", u.BuildID, u.Provider, u.UploadID, u.State)
		}
		live[u.ExternalID] = true
	}
	imgs, err := e.cloud.List(ctx, nil)
	if err != nil {
		return err.Error()
	}
	for _, img := range imgs {
		if img.Status != "active" {
			return fmt.Sprintf("Glance holds image %s (%s) %s", img.ID, img.Name, img.Status)
		}
		if img.Properties[uploader.PropBuilderID] != "" && !live[img.ID] {
			return fmt.Sprintf("Glance image %s (%s) is leaked: no upload holds it", img.ID, img.Name)
		}
		delete(live, img.ID)
	}
	if len(live) > 0 {
		return fmt.Sprintf("uploads name images Glance does not hold: %v", live)
	}
	// Every file in the images-dir belongs to a ready build, or is the state.
	files := map[string]bool{}
	for _, b := range builds {
		for _, f := range b.Formats {
			for _, ext := range []string{"", ".md5", ".sha256"} {
				files[b.ID+"."+f+ext] = true
			}
		}
		if b.Source == "dib" {
			files[b.ID+".d"] = true
		}
	}
	entries, _ := os.ReadDir(e.imagesDir())
	for _, ent := range entries {
		n := ent.Name()
		switch {
		case files[n], n == "builder.lock", n == "builder_id.txt", n == "builder.owner", strings.HasPrefix(n, "builder.db"), n == "progress-status.json":
		case n == ".partial":
			if left, _ := os.ReadDir(filepath.Join(e.imagesDir(), n)); len(left) > 0 {
				return fmt.Sprintf("partial downloads left of settled builds: %v", names(left))
			}
		case n == ".builds":
			// A marker for each build the builder made and holds.
			marked, _ := os.ReadDir(filepath.Join(e.imagesDir(), n))
			var want []string
			for _, b := range builds {
				want = append(want, b.ID)
			}
			sort.Strings(want)
			if got := names(marked); !slices.Equal(got, want) {
				return fmt.Sprintf("the builder's marks of its builds are %v, want one for each build %v", got, want)
			}
		default:
			return fmt.Sprintf("orphan file in the images-dir: %s", n)
		}
	}
	return ""
}

func names(ents []os.DirEntry) []string {
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	sort.Strings(out)
	return out
}

// lastLine is the last line of a log, for the test's own log.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// TestListingsCreateNothing: the listings and admin commands against a mistyped
// images-dir say which path and what to check, exit 2 and create nothing.
func TestListingsCreateNothing(t *testing.T) {
	dir := t.TempDir()
	e := &env{t: t, dir: dir, cfgPath: filepath.Join(dir, "nodepool.yaml")}
	typo := filepath.Join(dir, "imgaes")
	if err := os.WriteFile(e.cfgPath, []byte("images-dir: "+typo+"\ndiskimages:\n  - name: d\n    elements: [e]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"image-list"}, {"dib-image-list", "--json"}, {"image-status"}, {"alien-image-list"},
		{"image-build", "d"}, {"image-pause", "d"}, {"dib-image-delete", "d-0123456789abcdef0123456789abcdef"},
	} {
		e.must(exitUsage, args, typo, "images-dir", e.cfgPath)
		if _, err := os.Stat(typo); !os.IsNotExist(err) {
			t.Fatalf("%v created the images-dir", args)
		}
	}
	// An existing directory that holds no state is refused the same way.
	if err := os.Mkdir(typo, 0o755); err != nil {
		t.Fatal(err)
	}
	e.must(exitUsage, []string{"image-list"}, "builder.db", "images-dir")
	if left, _ := os.ReadDir(typo); len(left) != 0 {
		t.Fatalf("image-list left %v in an images-dir without state", names(left))
	}
}

// TestFlags: --version, and nodepool-builder's flags that mean nothing here are
// refused with what to use instead.
func TestFlags(t *testing.T) {
	dir := t.TempDir()
	e := &env{t: t, dir: dir, cfgPath: filepath.Join(dir, "nodepool.yaml")}
	os.WriteFile(e.cfgPath, []byte("images-dir: "+filepath.Join(dir, "images")+"\n"), 0o644)
	if r := e.run("--version"); r.code != 0 || !strings.HasPrefix(r.stdout, "nodepool-builder version ") {
		t.Errorf("--version: %d %q %q", r.code, r.stdout, r.stderr)
	}
	for flag, says := range map[string][]string{
		"-l":     {"--log-format"},
		"--fake": {"dib-cmd"},
	} {
		args := []string{flag}
		if flag != "--fake" {
			args = append(args, "x")
		}
		e.must(exitUsage, args, says...)
	}
	e.must(exitUsage, []string{"--upload-workers", "0"}, "1 or more")
}

// newSlowUploadEnv is an env whose one provider, cloud-r, reaches Glance
// through a proxy slowed so that the upload of its Zuul build, an 8 MiB raw
// image, takes about 32 s: a test can act in the middle of it.
func newSlowUploadEnv(t *testing.T) (*env, *testenv.Proxy, zuultest.Build) {
	t.Helper()
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	slow := e.proxiedClouds("slow")["slow"]
	e.writeYAML(`images-dir: {{IMAGES}}
zuul-images:
{{DEBIAN}}providers:
  - name: cloud-r
    cloud: slow
    image-format: raw
    diskimages:
      - name: debian
`)
	img := e.makeImageSized(1, 8<<20)
	zb := e.addBuild(img, zuultest.BuildSpec{Artifacts: []zuultest.ArtifactSpec{
		{Name: "debian raw", Path: img.raw, Compress: "zst", Metadata: zuulImageMeta("raw")}}})
	slow.SetRate(256 << 10) // about 32 s for the upload: the middle is well after its start
	return e, slow, zb
}

// TestSIGTERMMidUploadIsNoFailure: a daemon stopped with SIGTERM while it sends
// an image to a real Glance (slowed so that the stop comes mid-upload) deletes
// the half-made image and records no failure: image-list shows none, no attempt
// is used, Glance holds nothing of the build, and the next start uploads it at
// once.
func TestSIGTERMMidUploadIsNoFailure(t *testing.T) {
	e, slow, zb := newSlowUploadEnv(t) // the stop comes in the middle of the upload
	d := startDaemon(t, e.cfgPath)
	d.waitLog(t, 60*time.Second, `msg="upload started"`)
	d.stop(t, 60*time.Second)
	if !strings.Contains(d.logs.String(), `msg="upload interrupted`) {
		t.Errorf("the daemon did not log the upload as interrupted:\n%s", d.logs.String())
	}
	b, ok := e.zuulBuildOf(zb.UUID)
	if !ok {
		t.Fatalf("the Zuul build was not fetched: %+v", e.buildsJSON())
	}
	for _, u := range e.uploadsJSON() {
		if u.State == "failed" || u.Reason != "" {
			t.Errorf("image-list after the stop shows %+v; a stop is not a failure", u)
		}
	}
	if ups := e.storeUploads(store.UploadFilter{BuildID: b.BuildID}); len(ups) != 0 {
		t.Errorf("upload records after the stop: %s; want none, no attempt used", describeUploads(ups))
	}
	if imgs := e.images("cloud-r"); len(imgs) != 0 {
		t.Errorf("Glance holds %+v after the stop; want the half-made image deleted", imgs)
	}

	// The next start uploads it at once, at its first attempt.
	slow.SetRate(0)
	e.once(0)
	ups := e.storeUploads(store.UploadFilter{BuildID: b.BuildID})
	if len(ups) != 1 || ups[0].State != store.Ready || ups[0].Attempts != 1 {
		t.Fatalf("uploads after the next run: %s; want one ready at its first attempt", describeUploads(ups))
	}
	e.checkUploaded("cloud-r", b, "raw")
}
