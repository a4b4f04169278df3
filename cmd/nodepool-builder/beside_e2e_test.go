package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/uploader"
	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

// otherBuilderRecords is a kazoo script that writes, as a Python
// nodepool-builder writes them, the records of images the test builder's
// config does not have. argv: the builder id, then image/build/state followed
// by provider=state=external_id uploads of that build, as
// "centos/<id>/ready" "cloud-q=ready=<ext>" ... Build and upload states are
// nodepool's; uploads are sequence nodes under .../images/.
const otherBuilderRecords = `
import json, sys, time
builder_id = sys.argv[1]
t = time.time() - 3600
base = None
for arg in sys.argv[2:]:
    if "/" in arg:
        image, build, state = arg.split("/")
        base = "/nodepool/images/%s/builds/%s" % (image, build)
        zk.create(base, json.dumps({"state": state, "state_time": t, "builder": "python-host",
            "builder_id": builder_id, "formats": "qcow2", "username": "zuul",
            "python_path": "auto", "shell_type": None}).encode(), makepath=True)
        continue
    provider, state, ext = arg.split("=")
    zk.create(base + "/providers/%s/images/" % provider, json.dumps({"state": state,
        "state_time": t, "external_id": ext or None, "external_name": "python-made",
        "format": "qcow2", "username": "zuul", "python_path": "auto",
        "shell_type": None}).encode(), sequence=True, makepath=True)
`

// znodesUnder is a kazoo script that prints every znode under the images
// named in argv (lock nodes and their contenders aside) with its version and
// data, as JSON.
const znodesUnder = `
import json, sys
out = {}
def walk(path):
    if not zk.exists(path):
        return
    data, stat = zk.get(path)
    out[path] = [stat.version, (data or b"").decode()]
    for child in zk.get_children(path):
        if child != "lock" and "__lock__" not in child:
            walk(path + "/" + child)
for image in sys.argv[1:]:
    walk("/nodepool/images/" + image)
print(json.dumps(out, sort_keys=True))
`

func znodes(t *testing.T, z *testenv.ZooKeeper, images ...string) map[string][2]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := testenv.RunKazoo(ctx, kazooConn(z), znodesUnder, images...)
	if err != nil {
		t.Fatal(err)
	}
	var v map[string][2]any
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	return v
}

// sameZnodes fails the test unless every znode of before is there, unchanged
// (same version and data), and no other is.
func sameZnodes(t *testing.T, when string, before, after map[string][2]any) {
	t.Helper()
	for path, b := range before {
		a, ok := after[path]
		switch {
		case !ok:
			t.Errorf("%s: %s was deleted", when, path)
		case a != b:
			t.Errorf("%s: %s changed from %v to %v", when, path, b, a)
		}
	}
	for path := range after {
		if _, ok := before[path]; !ok {
			t.Errorf("%s: %s was created", when, path)
		}
	}
}

// TestZooKeeperBesideAnotherBuilder: on a shared ZooKeeper (TLS, as nodepool's
// clusters are), the records that another builder wrote, as nodepool writes
// them, of images this builder's config does not have, stay as they are, with
// their cloud images, through several --once passes and a running daemon that
// rotates the builder's own image: ready, deleting and uploading uploads, on a
// provider both builders have and on one only the other has, and a deleting
// build.
func TestZooKeeperBesideAnotherBuilder(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	z := testenv.NewZooKeeper(t, testenv.ZooKeeperOptions{TLS: true})
	e.appendConfig(zkKeys(z, zkChroot))
	ctx := context.Background()
	glance := func(name string) string {
		id, err := e.cloud.Create(ctx, uploader.ImageSpec{Name: name, DiskFormat: "qcow2"})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	theirs := map[string]string{ // what each of their uploads names in Glance
		"centos ready in cloud-q":     glance("centos-q"),
		"centos ready in cloud-other": glance("centos-other"),
		"centos deleting in cloud-q":  glance("centos-q-old"),
		"centos uploading in cloud-q": glance("centos-q-new"),
		"fedora ready in cloud-q":     glance("fedora-q"),
	}
	centos, fedora := store.NewBuildID(), store.NewBuildID()
	if _, err := testenv.RunKazoo(ctx, kazooConn(z), otherBuilderRecords, "python-builder-id",
		"centos/"+centos+"/ready",
		"cloud-q=ready="+theirs["centos ready in cloud-q"],
		"cloud-other=ready="+theirs["centos ready in cloud-other"],
		"cloud-q=deleting="+theirs["centos deleting in cloud-q"],
		"cloud-q=uploading="+theirs["centos uploading in cloud-q"],
		"cloud-q=failed=",
		"fedora/"+fedora+"/deleting",
		"cloud-q=ready="+theirs["fedora ready in cloud-q"],
	); err != nil {
		t.Fatal(err)
	}
	before := znodes(t, z, "centos", "fedora")
	if len(before) < 12 {
		t.Fatalf("kazoo wrote %d znodes: %v", len(before), before)
	}
	stayed := func(when string) {
		t.Helper()
		sameZnodes(t, when, before, znodes(t, z, "centos", "fedora"))
		for what, id := range theirs {
			if e.gone(id) {
				t.Errorf("%s: the cloud image of their upload (%s) was deleted", when, what)
			}
		}
	}

	// Our own image rotates beside theirs: three builds, keep-uploads 2.
	var ours []zuultest.Build
	for i := range 3 {
		ours = append(ours, e.addBuild(e.makeImage(int64(i+1)), zuultest.BuildSpec{}))
		e.once(0)
	}
	stayed("after three --once passes")
	first, _ := e.zuulBuildOf(ours[0].UUID)
	if first.BuildID != "" {
		t.Fatalf("our oldest build was not rotated out: %+v", first)
	}

	d := startDaemon(t, e.cfgPath)
	newest := e.addBuild(e.makeImage(4), zuultest.BuildSpec{})
	second, _ := e.zuulBuildOf(ours[1].UUID)
	testenv.WaitFor(t, 2*time.Minute, "the daemon to upload our newest build and rotate out the oldest", func() bool {
		b, ok := e.zuulBuildOf(newest.UUID)
		if !ok {
			return false
		}
		_, q := e.readyUpload(b.BuildID, "cloud-q")
		_, r := e.readyUpload(b.BuildID, "cloud-r")
		_, left := e.zuulBuildOf(second.ZuulBuildUUID)
		return q && r && !left
	}, d.logs.String)
	// The leak sweep ran at start, and the lifecycle since, on every upload
	// made ready; one more pass for good measure after the rotation.
	d.waitLog(t, time.Minute, `msg="deleted build"`)
	d.stop(t, 30*time.Second)
	stayed("after the daemon rotated our image")
	if strings.Contains(d.logs.String(), "centos") || strings.Contains(d.logs.String(), "fedora") {
		t.Errorf("the daemon acted on, or complained about, their images:\n%s", d.logs.String())
	}
}

// TestTakeOverAPythonBuildersImagesDir: pointed at the images-dir of a Python
// nodepool-builder (the usual migration), the builder stops at once and says
// why, touching nothing; take-over-images-dir makes the directory its own and
// says what that means; after it, files that no build records (an operator's
// backup, notes) stay, and the build recorded under the taken-over id, of an
// image the config does not have, goes as the take-over said.
func TestTakeOverAPythonBuildersImagesDir(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	z := testenv.NewZooKeeper(t, testenv.ZooKeeperOptions{TLS: true})
	e.appendConfig(zkKeys(z, zkChroot))
	ctx := context.Background()
	const pythonID = "7d3c1c58-2f5e-4c8e-9f51-0f4f3b7a2e10"
	centos := store.NewBuildID()
	stray := store.NewBuildID()
	dir := e.imagesDir()
	os.MkdirAll(filepath.Join(dir, "centos-"+centos+".d", "manifests"), 0o755)
	os.MkdirAll(filepath.Join(dir, "notes-"+stray+".d"), 0o755)
	files := map[string]string{
		"builder_id.txt":                       pythonID + "\n",
		"centos-" + centos + ".qcow2":          "qcow2 data",
		"centos-" + centos + ".qcow2.md5":      "md5",
		"centos-" + centos + ".qcow2.sha256":   "sha256",
		"backup-" + stray + ".tar":             "an operator's backup",
		"notes-" + stray + ".d/todo.txt":       "an operator's notes",
		"centos-" + centos + ".d/manifests/ok": "dib manifest",
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// As nodepool uploads: its build id and upload id (the provider's first
	// sequence node) on the image.
	ext, err := e.cloud.Create(ctx, uploader.ImageSpec{Name: "centos-python", DiskFormat: "qcow2",
		Properties: map[string]string{uploader.PropBuildID: centos, uploader.PropUploadID: "0000000000"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.RunKazoo(ctx, kazooConn(z), otherBuilderRecords, pythonID,
		"centos/"+centos+"/ready", "cloud-q=ready="+ext); err != nil {
		t.Fatal(err)
	}
	before := znodes(t, z, "centos")
	e.addBuild(e.makeImage(1), zuultest.BuildSpec{})

	refusals := map[string]string{"--once": e.run("--once").stderr}
	if r := e.run("--once"); r.code != exitUsage {
		t.Fatalf("--once in a Python builder's images-dir: exit %d, want %d\n%s", r.code, exitUsage, r.stderr)
	}
	d := startMain(t, "", "-c", e.cfgPath)
	select {
	case <-d.exited:
	case <-time.After(time.Minute):
		t.Fatalf("the daemon started in a Python builder's images-dir\n%s", d.logs.String())
	}
	if code := d.cmd.ProcessState.ExitCode(); code != exitUsage {
		t.Fatalf("the daemon in a Python builder's images-dir: exit %d, want %d\n%s", code, exitUsage, d.logs.String())
	}
	refusals["the daemon"] = d.logs.String()
	for who, msg := range refusals {
		for _, want := range []string{dir, "builder_id.txt (builder " + pythonID + ")", "centos-" + centos + ".qcow2",
			"centos-" + centos + ".d", "backup-" + stray + ".tar", "take-over-images-dir"} {
			if !strings.Contains(msg, want) {
				t.Errorf("%s: the refusal does not name %q:\n%s", who, want, msg)
			}
		}
	}
	for name, data := range files {
		if got, err := os.ReadFile(filepath.Join(dir, name)); err != nil || string(got) != data {
			t.Errorf("a refused start changed %s: %q, %v", name, got, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, ".partial")); err == nil {
		t.Error("a refused start wrote .partial")
	}
	sameZnodes(t, "after refused starts", before, znodes(t, z, "centos"))
	if e.gone(ext) {
		t.Fatal("a refused start deleted the Python builder's cloud image")
	}

	r := e.run("take-over-images-dir")
	if r.code != 0 {
		t.Fatalf("take-over-images-dir: exit %d\n%s", r.code, r.stderr)
	}
	for _, want := range []string{"as builder " + pythonID, "centos-" + centos + " (ready)", "backup-" + stray + ".tar",
		"notes-" + stray + ".d"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("take-over-images-dir does not say %q:\n%s", want, r.stdout)
		}
	}
	if strings.Contains(r.stdout, "centos-"+centos+".qcow2") {
		t.Errorf("take-over-images-dir lists the recorded build's file as left alone:\n%s", r.stdout)
	}

	e.once(0)
	e.once(0)
	for _, name := range []string{"backup-" + stray + ".tar", "notes-" + stray + ".d/todo.txt"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Errorf("%s, which no build records, was removed: %v", name, err)
		}
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "builder_id.txt")); strings.TrimSpace(string(got)) != pythonID {
		t.Errorf("builder_id.txt = %q, want the taken-over id", got)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "centos-"+centos+"*")); len(left) != 0 {
		t.Errorf("the taken-over build of an image not in the config kept its files: %v", left)
	}
	if !e.gone(ext) {
		t.Error("the taken-over build's upload, of an image not in the config, was not deleted")
	}
}
