package main

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/uploader"
	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

// The tests of this file run nodepool 10's own nodepool-builder (the vendored
// Python code) and ours, as daemons, on one TLS ZooKeeper and one Glance.

// besideProviders are the providers of the shared nodepool.yaml: two clouds.yaml
// entries of the one Glance, cloud-q taking qcow2 (openstacksdk's default
// image_format) and cloud-r raw.
var besideProviders = []string{"cloud-q", "cloud-r"}

// besideClouds is the clouds.yaml of both builders: nodepool's openstack
// driver has no image-format key, so a provider's format is its cloud's
// image_format.
const besideClouds = `clouds:
  qcloud:
    auth_type: none
    image_endpoint_override: {{GLANCE}}
  rcloud:
    auth_type: none
    image_endpoint_override: {{GLANCE}}
    image_format: raw
`

// besideNodepoolYAML is the one nodepool.yaml that the Python builder and ours
// read, and a launcher could: dib-image is built with the fake
// disk-image-create; zuul-image is declared (pause: true, no DIB keys) so
// that providers and labels may name it and no Python builder builds it. Each
// builder takes its images-dir and build-log-dir from its environment. The
// image names differ by provider, as both providers are one Glance; the
// variables are those both programs fill in.
const besideNodepoolYAML = `images-dir: '%(NODEPOOL_IMAGES_DIR)'
build-log-dir: '%(NODEPOOL_BUILD_LOG_DIR)'
labels:
  - name: dib-label
  - name: zuul-label
diskimages:
  - name: dib-image
    dib-cmd: {{DIB}}
    elements: [debian-minimal]
  - name: zuul-image
    pause: true
providers:
  - name: cloud-q
    cloud: qcloud
    image-name-format: 'q-{image_name}-{timestamp}-{upload_id}'
    diskimages:
      - name: dib-image
      - name: zuul-image
    pools:
      - name: main
        labels:
          - name: dib-label
            diskimage: dib-image
            min-ram: 1024
          - name: zuul-label
            diskimage: zuul-image
            min-ram: 1024
  - name: cloud-r
    cloud: rcloud
    image-name-format: 'r-{image_name}-{timestamp}-{upload_id}'
    diskimages:
      - name: dib-image
      - name: zuul-image
    pools:
      - name: main
        labels:
          - name: dib-label
            diskimage: dib-image
            min-ram: 1024
          - name: zuul-label
            diskimage: zuul-image
            min-ram: 1024
`

// besideBuilderYAML is our builder's own file beside nodepool.yaml:
// zuul-image comes from the stand-in Zuul, polled every second, and the
// diskimages are left to the Python builder.
const besideBuilderYAML = `zuul-images:
  - name: zuul-image
    api-url: {{ZUUL}}
    tenant: example
    project: org/images
    job: build-debian
    poll-interval: 1
builder:
  keep-builds: 2
  keep-uploads: 2
  build-diskimages: false
`

// requestBuild is a kazoo script that asks for a build of the image named in
// argv as `nodepool image-build` does (nodepool's submitBuildRequest).
const requestBuild = `
import sys
zk.ensure_path("/nodepool/images/%s/request-build" % sys.argv[1])
`

// lostWarning is what our builder logs, at warning level, when a build of its
// own was deleted by another program.
const lostWarning = `level=WARN msg="a build of this builder was deleted by another program`

// nodepoolZKKeys are zkKeys as nodepool's config-validate takes them: its
// schema wants zookeeper-timeout a float (an int is refused, though its
// loader takes one). Nothing here needs a lost session's locks to go soon,
// so the timeout is longer than the other tests', for a busy host.
func nodepoolZKKeys(t *testing.T, z *testenv.ZooKeeper) string {
	t.Helper()
	old := fmt.Sprintf("zookeeper-timeout: %d\n", zkSessionTimeout)
	keys := zkKeys(z, zkChroot)
	if !strings.Contains(keys, old) {
		t.Fatalf("zkKeys no longer writes %q:\n%s", old, keys)
	}
	return strings.Replace(keys, old, "zookeeper-timeout: 10.0\n", 1)
}

// beside is the Python nodepool-builder and ours on one ZooKeeper and Glance.
type beside struct {
	t      *testing.T
	e      *env
	z      *testenv.ZooKeeper
	py     *testenv.NodepoolBuilder
	ours   *daemon
	pyDir  string // the Python builder's images-dir
	pyEnv  []string
	clouds string
	// seen is the (image/provider)s the launcher had an upload to boot in.
	seen    map[string]bool
	samples int
	canary  int
}

// newBeside starts ZooKeeper (TLS) and Glance, and writes the clouds.yaml of
// both builders. Nothing runs yet.
func newBeside(t *testing.T) *beside {
	t.Helper()
	testenv.RequireNodepool(t)
	testenv.RequireKazoo(t)
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	b := &beside{t: t, e: e, z: testenv.NewZooKeeper(t, testenv.ZooKeeperOptions{TLS: true}), seen: map[string]bool{}}
	b.clouds = writeFileT(t, filepath.Join(e.dir, "clouds-beside.yaml"),
		strings.ReplaceAll(besideClouds, "{{GLANCE}}", e.glance.Endpoint))
	t.Setenv("OS_CLIENT_CONFIG_FILE", b.clouds)
	// Our builder (the daemon, and the listings run in this process) takes
	// its directories from the environment; the Python builder, below, its own.
	t.Setenv("NODEPOOL_IMAGES_DIR", e.imagesDir())
	t.Setenv("NODEPOOL_BUILD_LOG_DIR", e.buildLogDir())
	b.pyDir = filepath.Join(e.dir, "python", "images")
	pyLogs := filepath.Join(e.dir, "python", "logs")
	for _, dir := range []string{b.pyDir, pyLogs} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	b.pyEnv = []string{"OS_CLIENT_CONFIG_FILE=" + b.clouds, "NODEPOOL_IMAGES_DIR=" + b.pyDir, "NODEPOOL_BUILD_LOG_DIR=" + pyLogs}
	return b
}

// writeBuilderFile writes our builder's own file beside nodepool.yaml.
func (b *beside) writeBuilderFile() {
	b.t.Helper()
	writeFileT(b.t, filepath.Join(b.e.dir, config.BuilderFileName), strings.ReplaceAll(besideBuilderYAML, "{{ZUUL}}", b.e.zuul.URL()))
}

// startPython starts the Python nodepool-builder on config, two upload workers
// so that both providers are served in one of its 10 s upload passes.
func (b *beside) startPython(config string) {
	b.t.Helper()
	b.py = testenv.StartNodepoolBuilder(b.t, testenv.NodepoolBuilderOptions{Config: config, Env: b.pyEnv, UploadWorkers: 2})
}

// ids are the builder ids of the Python builder and ours.
func (b *beside) ids() (python, ours string) {
	b.t.Helper()
	read := func(dir string) string {
		id, err := os.ReadFile(filepath.Join(dir, "builder_id.txt"))
		if err != nil {
			b.t.Fatal(err)
		}
		return strings.TrimSpace(string(id))
	}
	return read(b.pyDir), read(b.e.imagesDir())
}

// logs is what both builders logged, for a failure message.
func (b *beside) logs() string {
	s := ""
	if b.ours != nil {
		s += "--- our builder:\n" + b.ours.logs.String()
	}
	if b.py != nil {
		s += "\n--- the Python builder (" + b.py.LogFile + "):\n" + b.py.Log()
	}
	return s
}

// sample reads the state as nodepool-launcher does and fails the test unless,
// for each image and provider, the upload the launcher would boot is an active
// Glance image of that build, and there is one wherever there was one before:
// nothing either builder holds is deleted while it is the newest.
func (b *beside) sample() launcherView {
	b.t.Helper()
	v := launcher(b.t, b.z)
	b.samples++
	for _, image := range []string{"dib-image", "zuul-image"} {
		for _, provider := range besideProviders {
			key := image + "/" + provider
			pick, ok := v.Launch[key]
			if !ok {
				if b.seen[key] {
					b.t.Fatalf("sample %d: the launcher has no upload of %s to boot in %s any more: %+v\n%s", b.samples, image, provider, v.Uploads, b.logs())
				}
				continue
			}
			b.seen[key] = true
			build := strings.Split(pick.Upload, "/")[1]
			img, err := b.e.cloud.Get(context.Background(), pick.ExternalID)
			switch {
			case err != nil:
				b.t.Fatalf("sample %d: the launcher would boot %s (upload %s), which Glance does not hold: %v\n%s", b.samples, pick.ExternalID, pick.Upload, err, b.logs())
			case img.Status != "active" || img.Properties[uploader.PropBuildID] != build:
				b.t.Fatalf("sample %d: the launcher would boot %s (upload %s): Glance has it %s, of build %q", b.samples, pick.ExternalID, pick.Upload, img.Status, img.Properties[uploader.PropBuildID])
			}
		}
	}
	return v
}

// nodepoolAgrees checks that nodepool's own ZooKeeper class, which
// nodepool-launcher reads the uploads with, picks the upload to boot of each
// image in each provider as the launcher's walk does: reading the znodes,
// and from its image cache, which the launcher calls (our records' extra
// child znodes and all). Its reads and the walk's are not one snapshot: the
// two are compared until they agree, with a deadline.
func (b *beside) nodepoolAgrees() {
	b.t.Helper()
	var keys []string
	for _, image := range []string{"dib-image", "zuul-image"} {
		for _, provider := range besideProviders {
			keys = append(keys, image+"/"+provider)
		}
	}
	var differ string
	testenv.WaitFor(b.t, 2*time.Minute, "nodepool's ZooKeeper class to pick what the launcher's walk picks", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		direct, cached, err := testenv.NodepoolLaunchPicks(ctx, kazooConn(b.z), keys...)
		if err != nil {
			b.t.Fatal(err)
		}
		v := b.sample()
		for _, key := range keys {
			pick, ok := v.Launch[key]
			for how, got := range map[string]map[string]testenv.NodepoolUpload{"from the znodes": direct, "from its cache": cached} {
				u, found := got[key]
				if found != ok || (ok && (u.ExternalID != pick.ExternalID || u.Username != "zuul" || u.PythonPath != "auto")) {
					differ = fmt.Sprintf("for %s nodepool picks %+v (%v) %s, the launcher's walk %+v (%v)", key, u, found, how, pick, ok)
					return false
				}
			}
		}
		return true
	}, func() string { return differ })
}

// builds are the ids of an image's builds in v in a state ("" for any),
// newest first.
func builds(v launcherView, image, state string) []string {
	type bt struct {
		id string
		at float64
	}
	var found []bt
	for key, f := range v.Builds {
		img, id, _ := strings.Cut(key, "/")
		if img == image && (state == "" || f["state"][1] == state) {
			at, _ := f["state_time"][1].(float64)
			found = append(found, bt{id, at})
		}
	}
	sort.Slice(found, func(i, j int) bool { return found[i].at > found[j].at })
	var ids []string
	for _, f := range found {
		ids = append(ids, f.id)
	}
	return ids
}

// builderOf is the builder_id of a build in v.
func builderOf(v launcherView, image, id string) string {
	s, _ := v.Builds[image+"/"+id]["builder_id"][1].(string)
	return s
}

// uploads are the uploads of a build in v, by key (image/build/provider/upload).
func uploads(v launcherView, image, id string) map[string]map[string][2]any {
	out := map[string]map[string][2]any{}
	for key, f := range v.Uploads {
		if strings.HasPrefix(key, image+"/"+id+"/") {
			out[key] = f
		}
	}
	return out
}

// uploadedEverywhere tells whether a build has a ready upload in every provider.
func uploadedEverywhere(v launcherView, image, id string) bool {
	for _, p := range besideProviders {
		ready := false
		for key, f := range uploads(v, image, id) {
			if strings.Split(key, "/")[2] == p && f["state"][1] == "ready" {
				ready = true
			}
		}
		if !ready {
			return false
		}
	}
	return id != ""
}

// externalIDs are the cloud images a build's uploads name.
func externalIDs(v launcherView, image, id string) []string {
	var ids []string
	for _, f := range uploads(v, image, id) {
		if s, _ := f["external_id"][1].(string); s != "" {
			ids = append(ids, s)
		}
	}
	sort.Strings(ids)
	return ids
}

// filesOf lists what an images-dir holds of a build, anywhere under it (files,
// sidecars, DIB's .d, our marker, partial downloads).
func filesOf(t *testing.T, dir, buildID string) []string {
	t.Helper()
	var found []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if strings.Contains(d.Name(), buildID) {
			found = append(found, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

// buildsHeld are the ids of the builds whose image files an images-dir holds.
func buildsHeld(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	held := map[string]bool{}
	for _, ent := range ents {
		if m := regexp.MustCompile(`^.+-([0-9a-f]{32})\.`).FindStringSubmatch(ent.Name()); m != nil {
			held[m[1]] = true
		}
	}
	var ids []string
	for id := range held {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// cleanupPass waits, sampling, until the Python builder has made a whole
// cleanup pass (nodepool's CleanupWorker, every 60 s) that began after the
// call: it adds a ready build of an image no config has, with a name no pass
// has seen, which only that pass deletes (an image nodepool's config lacks
// goes; ours leaves another builder's image alone). A pass reads the image
// names when it begins.
func (b *beside) cleanupPass() {
	b.t.Helper()
	b.canary++
	image, id := fmt.Sprintf("canary-%d", b.canary), store.NewBuildID()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := testenv.RunKazoo(ctx, kazooConn(b.z), otherBuilderRecords, "canary-builder", image+"/"+id+"/ready"); err != nil {
		b.t.Fatal(err)
	}
	testenv.WaitFor(b.t, 3*time.Minute, "a cleanup pass of the Python builder (it deletes "+image+")", func() bool {
		_, left := b.sample().Builds[image+"/"+id]
		return !left
	}, b.logs)
}

// TestPythonBuilderBesideOurs runs nodepool 10's nodepool-builder and ours as
// daemons on one TLS ZooKeeper, one Glance (two providers) and one
// nodepool.yaml that has a diskimage, dib-image, and declares our zuul-image,
// both listed by both providers and booted by labels. Each builder makes its
// image and uploads it everywhere; second and third builds of each rotate the
// first out; all the while the upload nodepool-launcher would boot of each
// image in each provider is an active Glance image; the Python builder never
// builds zuul-image, writes no traceback, and in the end, once the state stops
// changing, Glance and the upload records agree.
//
// Who builds dib-image: our builder reads the same nodepool.yaml, so dib-image
// is in its config (it rotates and deletes its builds as nodepool's builders
// do), but its own file says build-diskimages: false, as a builder added for
// the zuul-images beside Python builders does: every dib-image build is the
// Python builder's, uploaded by it, and ours builds none.
func TestPythonBuilderBesideOurs(t *testing.T) {
	start := time.Now()
	b := newBeside(t)
	e := b.e
	e.writeYAML(besideNodepoolYAML + nodepoolZKKeys(t, b.z))
	b.writeBuilderFile()

	// The file is nodepool's: its validator and loader take it as a launcher
	// and a Python builder read it, and so do we.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if log, err := testenv.NodepoolConfigValidate(ctx, e.cfgPath, b.pyEnv); err != nil {
		t.Fatalf("nodepool config-validate refuses the shared nodepool.yaml: %v\n%s", err, log)
	}
	npc, err := testenv.NodepoolLoadConfig(ctx, e.cfgPath, b.pyEnv)
	if err != nil {
		t.Fatal(err)
	}
	if got := npc.Diskimages["dib-image"].ImageTypes; !slices.Equal(got, []string{"qcow2", "raw"}) {
		t.Fatalf("nodepool builds dib-image in %v, want qcow2 and raw (one per provider)", got)
	}
	if zi := npc.Diskimages["zuul-image"]; !zi.Pause || npc.Providers["cloud-r"].ImageType != "raw" ||
		npc.Providers["cloud-q"].Pools["main"].Labels["zuul-label"] != "zuul-image" {
		t.Fatalf("nodepool loads the shared nodepool.yaml as %+v", npc)
	}
	if r := e.run("config-validate"); r.code != 0 {
		t.Fatalf("our config-validate: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// 1. Each builder makes its image and uploads it to both providers. The
	// Python builder starts first: the first dib-image build is its own.
	b.startPython(e.cfgPath)
	b.py.WaitLog(t, regexp.MustCompile(`BuildWorker\.\d+: Building image dib-image$`), time.Minute)
	b.ours = startDaemon(t, e.cfgPath)
	pyID, ourID := b.ids()
	t.Logf("builders up after %s: Python %s, ours %s", time.Since(start).Round(time.Second), pyID, ourID)
	z1 := e.addBuild(e.makeImage(1), zuultest.BuildSpec{})
	var zuulBuilds, dibBuilds []string // oldest first
	// made waits until the zuul-image build of zb and a dib-image build besides
	// those made so far are ready and uploaded everywhere, and records them.
	made := func(zb zuultest.Build, what string) launcherView {
		t.Helper()
		var v launcherView
		testenv.WaitFor(t, 3*time.Minute, what, func() bool {
			v = b.sample()
			zid := ""
			if bj, ok := e.zuulBuildOf(zb.UUID); ok {
				zid = bj.BuildID
			}
			dib := builds(v, "dib-image", "ready")
			return uploadedEverywhere(v, "zuul-image", zid) && len(dib) > 0 && !slices.Contains(dibBuilds, dib[0]) &&
				uploadedEverywhere(v, "dib-image", dib[0])
		}, b.logs)
		bj, _ := e.zuulBuildOf(zb.UUID)
		zuulBuilds = append(zuulBuilds, bj.BuildID)
		dibBuilds = append(dibBuilds, builds(v, "dib-image", "ready")[0])
		return v
	}
	// madeBy checks that a build was made by one builder, whose images-dir
	// alone holds its files, and returns that builder's name.
	madeBy := func(v launcherView, image, id string) string {
		t.Helper()
		who := map[string]string{pyID: "the Python builder", ourID: "our builder"}[builderOf(v, image, id)]
		py, ours := len(filesOf(t, b.pyDir, id)) > 0, len(filesOf(t, e.imagesDir(), id)) > 0
		switch {
		case who == "":
			t.Fatalf("%s was made by builder %q, neither of the two", store.BuildName(image, id), builderOf(v, image, id))
		case who == "our builder" && (py || !ours), who == "the Python builder" && (!py || ours):
			t.Fatalf("%s was made by %s, but its files are in the Python builder's images-dir: %v, in ours: %v",
				store.BuildName(image, id), who, filesOf(t, b.pyDir, id), filesOf(t, e.imagesDir(), id))
		}
		return who
	}
	// pythonMade checks that a dib-image build is the Python builder's.
	pythonMade := func(v launcherView, id string) {
		t.Helper()
		if who := madeBy(v, "dib-image", id); who != "the Python builder" {
			t.Fatalf("%s is %s's: ours leaves the diskimages to the Python builder", store.BuildName("dib-image", id), who)
		}
	}
	v := made(z1, "the first builds of both images, uploaded everywhere")
	t.Logf("first builds uploaded after %s", time.Since(start).Round(time.Second))
	pythonMade(v, dibBuilds[0])
	b.nodepoolAgrees()
	for _, p := range besideProviders {
		re := regexp.MustCompile(`Image build dib-image-` + dibBuilds[0] + ` \(external_id \S+\) in ` + p + ` is ready`)
		b.py.WaitLog(t, re, 10*time.Second)
	}
	if who := madeBy(v, "zuul-image", zuulBuilds[0]); who != "our builder" {
		t.Fatalf("zuul-image's first build is %s's", who)
	}
	for _, id := range externalIDs(v, "zuul-image", zuulBuilds[0]) {
		if img, err := e.cloud.Get(ctx, id); err != nil || img.Properties[uploader.PropBuilderID] != ourID {
			t.Errorf("zuul-image's upload %s: %v, %v; want one of our builder's", id, img.Properties, err)
		}
	}
	first := map[string][]string{ // the cloud images of the first builds
		"dib-image":  externalIDs(v, "dib-image", dibBuilds[0]),
		"zuul-image": externalIDs(v, "zuul-image", zuulBuilds[0]),
	}

	// 2. Second builds: a new Zuul build, and nodepool's build request for
	// dib-image. Both builders keep two builds: nothing is rotated yet.
	request := func() {
		t.Helper()
		if _, err := testenv.RunKazoo(ctx, kazooConn(b.z), requestBuild, "dib-image"); err != nil {
			t.Fatal(err)
		}
	}
	z2 := e.addBuild(e.makeImage(2), zuultest.BuildSpec{})
	request()
	v = made(z2, "the second builds of both images, uploaded everywhere")
	t.Logf("second builds uploaded after %s", time.Since(start).Round(time.Second))
	pythonMade(v, dibBuilds[1])
	b.nodepoolAgrees()
	madeBy(v, "zuul-image", zuulBuilds[1])
	for image, ids := range map[string][]string{"dib-image": dibBuilds, "zuul-image": zuulBuilds} {
		if got := builds(v, image, ""); !slices.Equal(got, []string{ids[1], ids[0]}) {
			t.Fatalf("%s's builds after two: %v, want %v (newest first)", image, got, []string{ids[1], ids[0]})
		}
		if !uploadedEverywhere(v, image, ids[0]) {
			t.Fatalf("%s's first build lost an upload while it is among the two kept: %+v", image, uploads(v, image, ids[0]))
		}
	}
	testenv.WaitFor(t, 30*time.Second, "the build request to be cleared", func() bool {
		_, left := znodes(t, b.z, "dib-image")["/nodepool/images/dib-image/request-build"]
		return !left
	}, b.logs)

	// 3. Third builds: the first builds go everywhere, whoever deletes them.
	z3 := e.addBuild(e.makeImage(3), zuultest.BuildSpec{})
	request()
	v = made(z3, "the third builds of both images, uploaded everywhere")
	t.Logf("third builds uploaded after %s", time.Since(start).Round(time.Second))
	pythonMade(v, dibBuilds[2])
	madeBy(v, "zuul-image", zuulBuilds[2])
	oldest := map[string]string{"dib-image": dibBuilds[0], "zuul-image": zuulBuilds[0]}
	testenv.WaitFor(t, 3*time.Minute, "the first builds to go: records, cloud images and files", func() bool {
		v := b.sample()
		for image, id := range oldest {
			if _, left := v.Builds[image+"/"+id]; left || len(uploads(v, image, id)) > 0 ||
				len(filesOf(t, b.pyDir, id)) > 0 || len(filesOf(t, e.imagesDir(), id)) > 0 {
				return false
			}
			for _, ext := range first[image] {
				if !e.gone(ext) {
					return false
				}
			}
		}
		return true
	}, b.logs)
	t.Logf("first builds gone after %s", time.Since(start).Round(time.Second))

	// 4. Both builders quiet: the state settles as both keep it, and a whole
	// cleanup pass of the Python builder then changes nothing.
	keep := map[string][]string{"dib-image": {dibBuilds[2], dibBuilds[1]}, "zuul-image": {zuulBuilds[2], zuulBuilds[1]}}
	var wrong string
	settled := func() bool {
		wrong = besideSettled(t, b, b.sample(), keep)
		return wrong == ""
	}
	testenv.WaitFor(t, 3*time.Minute, "the state to settle", settled, func() string { return wrong + "\n" + b.logs() })
	before := znodes(t, b.z, "dib-image", "zuul-image")
	b.cleanupPass()
	sameZnodes(t, "over a cleanup pass of the Python builder once settled", before, znodes(t, b.z, "dib-image", "zuul-image"))
	b.nodepoolAgrees()
	if !settled() {
		t.Fatalf("the settled state changed: %s\n%s", wrong, b.logs())
	}

	// 5. The Python builder never built zuul-image, nor failed on our records.
	v = b.sample()
	for _, id := range builds(v, "zuul-image", "") {
		if builderOf(v, "zuul-image", id) == pyID {
			t.Errorf("%s was made by the Python builder", store.BuildName("zuul-image", id))
		}
	}
	pyLog := b.py.Log()
	if strings.Contains(pyLog, "Building image zuul-image") {
		t.Errorf("the Python builder built zuul-image:\n%s", pyLog)
	}
	if tbs := b.py.Tracebacks(); len(tbs) > 0 {
		t.Errorf("the Python builder logged %d tracebacks:\n%s", len(tbs), strings.Join(tbs, "\n\n"))
	}
	if strings.Contains(b.ours.logs.String(), `msg="building image" image=dib-image`) {
		t.Errorf("our builder built dib-image, which it leaves to the Python builder:\n%s", b.ours.logs.String())
	}
	if strings.Contains(b.ours.logs.String(), lostWarning) {
		t.Errorf("our builder took a build for lost though every builder's nodepool.yaml declares its image:\n%s", b.ours.logs.String())
	}
	t.Logf("done after %s, %d samples of the launcher's view", time.Since(start).Round(time.Second), b.samples)
}

// besideSettled says what is not yet as both builders keep the state, or "":
// each image has exactly its kept builds, ready, each with one ready upload in
// each provider and no other upload; Glance holds the images those uploads
// name, active, and no other; each images-dir holds the files of the kept
// builds its builder made and of no other build.
func besideSettled(t *testing.T, b *beside, v launcherView, keep map[string][]string) string {
	t.Helper()
	pyID, ourID := b.ids()
	live := map[string]bool{}
	mine := map[string][]string{pyID: nil, ourID: nil}
	for image, ids := range keep {
		if got := builds(v, image, ""); !slices.Equal(got, ids) {
			return fmt.Sprintf("%s has builds %v, want %v", image, got, ids)
		}
		for _, id := range ids {
			if v.Builds[image+"/"+id]["state"][1] != "ready" {
				return fmt.Sprintf("%s is %v", store.BuildName(image, id), v.Builds[image+"/"+id]["state"][1])
			}
			ups := uploads(v, image, id)
			if len(ups) != len(besideProviders) || !uploadedEverywhere(v, image, id) {
				return fmt.Sprintf("%s has uploads %v, want one ready in each provider", store.BuildName(image, id), ups)
			}
			for key, f := range ups {
				ext, _ := f["external_id"][1].(string)
				img, err := b.e.cloud.Get(context.Background(), ext)
				if err != nil || img.Status != "active" {
					return fmt.Sprintf("upload %s is ready, but Glance has its image %s %s (%v)", key, ext, img.Status, err)
				}
				live[ext] = true
			}
			mine[builderOf(v, image, id)] = append(mine[builderOf(v, image, id)], id)
		}
	}
	imgs, err := b.e.cloud.List(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(imgs) != len(live) {
		var names []string
		for _, img := range imgs {
			if !live[img.ID] {
				names = append(names, img.ID+" "+img.Name+" "+img.Status)
			}
		}
		return fmt.Sprintf("Glance holds %d images, %d of them no upload's: %v", len(imgs), len(names), names)
	}
	for id, dir := range map[string]string{pyID: b.pyDir, ourID: b.e.imagesDir()} {
		want := slices.Sorted(slices.Values(mine[id]))
		if got := buildsHeld(t, dir); !slices.Equal(got, want) {
			return fmt.Sprintf("%s holds files of builds %v, want those of %v", dir, got, want)
		}
	}
	return ""
}

// TestPythonBuilderWithoutTheDeclaration: a Python nodepool-builder whose
// nodepool.yaml has one of our providers but not our zuul-image (no
// declaration) deletes the image's upload there, and its build, at its first
// cleanup pass. Our builder settles the build as lost once: it removes its
// files, says at warning level what happened and the likely cause, and does
// not fetch that Zuul build again, over the poll intervals and the Python
// builder's next cleanup pass.
func TestPythonBuilderWithoutTheDeclaration(t *testing.T) {
	start := time.Now()
	b := newBeside(t)
	e := b.e
	e.writeYAML(`images-dir: '%(NODEPOOL_IMAGES_DIR)'
build-log-dir: '%(NODEPOOL_BUILD_LOG_DIR)'
diskimages:
  - name: zuul-image
    pause: true
providers:
  - name: cloud-q
    cloud: qcloud
    diskimages:
      - name: zuul-image
` + nodepoolZKKeys(t, b.z))
	b.writeBuilderFile()
	pyConfig := writeFileT(t, filepath.Join(e.dir, "python", "nodepool.yaml"), `images-dir: '%(NODEPOOL_IMAGES_DIR)'
build-log-dir: '%(NODEPOOL_BUILD_LOG_DIR)'
providers:
  - name: cloud-q
    cloud: qcloud
    diskimages: []
`+nodepoolZKKeys(t, b.z))
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if log, err := testenv.NodepoolConfigValidate(ctx, pyConfig, b.pyEnv); err != nil {
		t.Fatalf("nodepool config-validate refuses the Python builder's nodepool.yaml: %v\n%s", err, log)
	}

	b.ours = startDaemon(t, e.cfgPath)
	zb := e.addBuild(e.makeImage(1), zuultest.BuildSpec{})
	testenv.WaitFor(t, time.Minute, "our upload of the Zuul build", e.zuulUploaded(zb, "cloud-q"), b.logs)
	bj, _ := e.zuulBuildOf(zb.UUID)
	up, _ := e.readyUpload(bj.BuildID, "cloud-q")
	qcow2 := e.artifact(zb, "debian qcow2")
	served := func() (n int64, gets int) {
		for _, a := range zb.Artifacts {
			n += e.zuul.BytesServed(a.Path)
			gets += len(e.zuul.ArtifactRequests(a.Path))
		}
		return n, gets
	}
	if n, _ := served(); n != qcow2.ServedSize {
		t.Fatalf("the Zuul build's artifacts were served %d bytes, want the qcow2's %d once", n, qcow2.ServedSize)
	}
	if len(filesOf(t, e.imagesDir(), bj.BuildID)) == 0 {
		t.Fatalf("our images-dir holds nothing of build %s", bj.ID)
	}
	t.Logf("our build %s uploaded as %s after %s", bj.ID, up.ExternalID, time.Since(start).Round(time.Second))

	// The Python builder's first cleanup pass runs as it starts.
	b.startPython(pyConfig)
	b.ours.waitLog(t, 3*time.Minute, lostWarning)
	t.Logf("our builder settled the build as lost after %s", time.Since(start).Round(time.Second))
	b.py.WaitLog(t, regexp.MustCompile(`Deleting image build zuul-image-`+bj.BuildID+` from cloud-q`), time.Minute)
	var warning string
	for _, line := range strings.Split(b.ours.logs.String(), "\n") {
		if strings.Contains(line, lostWarning) {
			warning = line
		}
	}
	for _, want := range []string{"image=zuul-image", "build=" + bj.ID, "zuul_build=" + zb.UUID,
		"does not declare zuul-image zuul-image", `\"- {name: zuul-image, pause: true}\" under diskimages`} {
		if !strings.Contains(warning, want) {
			t.Errorf("the warning does not say %q:\n%s", want, warning)
		}
	}
	if left := filesOf(t, e.imagesDir(), bj.BuildID); len(left) > 0 {
		t.Errorf("the files of the deleted build are left: %v", left)
	}
	if !e.gone(up.ExternalID) {
		t.Errorf("the Python builder's cleanup left the upload's cloud image %s", up.ExternalID)
	}
	st, _ := e.status()
	if s := st["zuul-image"]; s.LastZuulBuild == nil || *s.LastZuulBuild != zb.UUID || s.LastZuulOutcome == nil || *s.LastZuulOutcome != store.OutcomeLost {
		t.Errorf("image-status of zuul-image: %+v; want the Zuul build %s lost", s, zb.UUID)
	}

	// Over the poll intervals up to the end of the Python builder's next
	// cleanup pass, the Zuul build is not fetched again, nor anything made.
	bytes, gets := served()
	polls := len(e.zuul.BuildsCalls())
	b.cleanupPass()
	if n, g := served(); n != bytes || g != gets {
		t.Errorf("the lost Zuul build was fetched again: %d bytes in %d requests, then %d in %d", bytes, gets, n, g)
	}
	if n := len(e.zuul.BuildsCalls()) - polls; n < 5 {
		t.Errorf("our builder polled Zuul %d times over the Python builder's cleanup pass; want several", n)
	}
	if bs := e.buildsOf("zuul-image"); len(bs) != 0 {
		t.Errorf("builds of zuul-image after the loss: %+v", bs)
	}
	if imgs := e.images("cloud-q"); len(imgs) != 0 {
		t.Errorf("cloud-q holds images after the loss: %+v", imgs)
	}
	if n := strings.Count(b.ours.logs.String(), lostWarning); n != 1 {
		t.Errorf("our builder warned %d times of the lost build, want once:\n%s", n, b.ours.logs.String())
	}
	if tbs := b.py.Tracebacks(); len(tbs) > 0 {
		t.Errorf("the Python builder logged %d tracebacks:\n%s", len(tbs), strings.Join(tbs, "\n\n"))
	}
	t.Logf("done after %s", time.Since(start).Round(time.Second))
}
