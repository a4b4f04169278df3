package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/uploader"
	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

// zkSessionTimeout is the session timeout of the test configs, in seconds: short,
// so that the locks of a killed builder go soon.
const zkSessionTimeout = 4

// zkChroot is the chroot of the test configs.
const zkChroot = "/nodepool-test"

// zkKeys is the config text that keeps the state in z under chroot, with the
// test CA and client certificate when z serves TLS.
func zkKeys(z *testenv.ZooKeeper, chroot string) string {
	host, port, _ := strings.Cut(z.Addr, ":")
	s := fmt.Sprintf("zookeeper-servers:\n  - host: %s\n    port: %s\n    chroot: %s\nzookeeper-timeout: %d\n",
		host, port, chroot, zkSessionTimeout)
	if z.TLS {
		s += fmt.Sprintf("zookeeper-tls:\n  cert: %s\n  key: %s\n  ca: %s\n", z.ClientCert, z.ClientKey, z.CA)
	}
	return s
}

// newZooKeeper starts a ZooKeeper for the test.
func newZooKeeper(t *testing.T, opts testenv.ZooKeeperOptions) *testenv.ZooKeeper {
	t.Helper()
	return testenv.NewZooKeeper(t, opts)
}

// appendConfig adds text (top-level keys) to the env's config.
func (e *env) appendConfig(text string) {
	e.t.Helper()
	f, err := os.OpenFile(e.cfgPath, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		e.t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(text); err != nil {
		e.t.Fatal(err)
	}
}

// kazooConn is how kazoo reaches the test configs' state in z.
func kazooConn(z *testenv.ZooKeeper) testenv.KazooConn {
	c := z.KazooConn()
	c.Hosts += zkChroot
	return c
}

// launcherView is what kazoo reads of nodepool's schema: every build and upload
// znode with the Python type and value of each field, and for each (image,
// provider) the upload nodepool-launcher boots.
type launcherView struct {
	Builds  map[string]map[string][2]any `json:"builds"`  // image/build -> field -> [type, value]
	Uploads map[string]map[string][2]any `json:"uploads"` // image/build/provider/upload -> ...
	Launch  map[string]launchPick        `json:"launch"`  // image/provider
}

type launchPick struct {
	StateTime  float64 `json:"state_time"`
	ExternalID string  `json:"external_id"`
	Upload     string  `json:"upload"`
}

// launcherScript walks the tree as nodepool-launcher's getMostRecentImageUpload
// does: every build of every image, every upload of each provider (children
// named lock skipped), the READY one with the highest state_time.
const launcherScript = `
import json
root = "/nodepool/images"
out = {"builds": {}, "uploads": {}, "launch": {}}
def fields(data):
    return {k: [type(v).__name__, v] for k, v in json.loads(data.decode()).items()}
for image in zk.get_children(root):
    bpath = root + "/" + image + "/builds"
    if not zk.exists(bpath):
        continue
    for build in zk.get_children(bpath):
        if build == "lock":
            continue
        data, _ = zk.get(bpath + "/" + build)
        out["builds"][image + "/" + build] = fields(data)
        ppath = bpath + "/" + build + "/providers"
        if not zk.exists(ppath):
            continue
        for provider in zk.get_children(ppath):
            ipath = ppath + "/" + provider + "/images"
            if not zk.exists(ipath):
                continue
            for upload in zk.get_children(ipath):
                if upload == "lock":
                    continue
                data, _ = zk.get(ipath + "/" + upload)
                d = json.loads(data.decode())
                key = "/".join([image, build, provider, upload])
                out["uploads"][key] = fields(data)
                if d["state"] != "ready":
                    continue
                best = out["launch"].get(image + "/" + provider)
                if best is None or d["state_time"] > best["state_time"]:
                    out["launch"][image + "/" + provider] = {
                        "state_time": d["state_time"], "external_id": d["external_id"], "upload": key}
print(json.dumps(out))
`

// launcher reads the state as nodepool-launcher would, with kazoo.
func launcher(t *testing.T, z *testenv.ZooKeeper) launcherView {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := testenv.RunKazoo(ctx, kazooConn(z), launcherScript)
	if err != nil {
		t.Fatal(err)
	}
	var v launcherView
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("launcher view: %v\n%s", err, out)
	}
	return v
}

var (
	buildIDPattern  = regexp.MustCompile(`^[0-9a-f]{32}$`)
	uploadIDPattern = regexp.MustCompile(`^[0-9]{10}$`)
)

// checkSchema fails the test unless every znode has nodepool's fields with the
// types nodepool writes: Python's str, float and None.
func checkSchema(t *testing.T, v launcherView) {
	t.Helper()
	want := func(what string, got map[string][2]any, types map[string]string) {
		for field, typ := range types {
			f, ok := got[field]
			if !ok {
				t.Errorf("%s has no field %s: %v", what, field, got)
				continue
			}
			if !strings.Contains("|"+typ+"|", "|"+f[0].(string)+"|") {
				t.Errorf("%s: %s is a %s (%v), want %s", what, field, f[0], f[1], typ)
			}
		}
	}
	for key, fields := range v.Builds {
		_, id, _ := strings.Cut(key, "/")
		if !buildIDPattern.MatchString(id) {
			t.Errorf("build id %s is not uuid4 hex", id)
		}
		want("build "+key, fields, map[string]string{"state": "str", "state_time": "float", "builder": "str",
			"builder_id": "str", "formats": "str", "username": "str", "python_path": "str", "shell_type": "NoneType|str"})
		if fields["username"][1] != "zuul" || fields["python_path"][1] != "auto" {
			t.Errorf("build %s: username %v, python_path %v; want nodepool's defaults zuul, auto", key, fields["username"][1], fields["python_path"][1])
		}
	}
	for key, fields := range v.Uploads {
		if id := key[strings.LastIndex(key, "/")+1:]; !uploadIDPattern.MatchString(id) {
			t.Errorf("upload id %s is not a ten-digit sequence", id)
		}
		want("upload "+key, fields, map[string]string{"state": "str", "state_time": "float", "external_id": "str",
			"external_name": "str", "format": "str", "username": "str", "python_path": "str", "shell_type": "NoneType|str"})
	}
}

// TestZooKeeperLauncherBootsOurUploads runs --once with the state in ZooKeeper
// and reads it as nodepool-launcher does, with kazoo: for each provider, the
// upload it would boot is the image Glance holds active, and every znode has
// nodepool's fields and types.
func TestZooKeeperLauncherBootsOurUploads(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	z := newZooKeeper(t, testenv.ZooKeeperOptions{})
	e.appendConfig(zkKeys(z, zkChroot))

	first := e.addBuild(e.makeImage(1), zuultest.BuildSpec{})
	e.once(0)
	if _, err := os.Stat(filepath.Join(e.dir, "images", "builder.db")); !os.IsNotExist(err) {
		t.Errorf("a SQLite state was made beside ZooKeeper's: %v", err)
	}
	check := func(zb zuultest.Build) launcherView {
		t.Helper()
		b, ok := e.zuulBuildOf(zb.UUID)
		if !ok || b.State != "ready" {
			t.Fatalf("Zuul build %s is not ready in the state: %+v", zb.UUID, e.buildsJSON())
		}
		v := launcher(t, z)
		checkSchema(t, v)
		for _, p := range []string{"cloud-q", "cloud-r"} {
			pick, ok := v.Launch["debian/"+p]
			if !ok {
				t.Fatalf("the launcher finds no ready upload of debian in %s: %+v", p, v.Uploads)
			}
			img, err := e.cloud.Get(context.Background(), pick.ExternalID)
			if err != nil {
				t.Fatalf("the launcher would boot %s in %s, which Glance does not hold: %v", pick.ExternalID, p, err)
			}
			if img.Status != "active" || img.Properties[uploader.PropBuildID] != b.BuildID || img.Properties[uploader.PropProvider] != p {
				t.Errorf("the launcher would boot %s in %s: %s, build %s, provider %s; want active, build %s",
					pick.ExternalID, p, img.Status, img.Properties[uploader.PropBuildID], img.Properties[uploader.PropProvider], b.BuildID)
			}
			if !strings.HasPrefix(pick.Upload, "debian/"+b.BuildID+"/"+p+"/") {
				t.Errorf("the launcher's pick %s is not of build %s", pick.Upload, b.BuildID)
			}
		}
		return v
	}
	v := check(first)
	if len(v.Builds) != 1 || len(v.Uploads) != 2 {
		t.Fatalf("after one build: %d builds, %d uploads in ZooKeeper; want 1, 2: %+v", len(v.Builds), len(v.Uploads), v)
	}

	// A newer build: the launcher takes its uploads, the older ones are kept.
	second := e.addBuild(e.makeImage(2), zuultest.BuildSpec{})
	e.once(0)
	v = check(second)
	if len(v.Builds) != 2 || len(v.Uploads) != 4 {
		t.Fatalf("after two builds: %d builds, %d uploads in ZooKeeper; want 2, 4", len(v.Builds), len(v.Uploads))
	}
	// The listings read the same records.
	ups := e.uploadsJSON()
	if len(ups) != 4 {
		t.Fatalf("image-list shows %d uploads, want 4: %+v", len(ups), ups)
	}
	for _, u := range ups {
		key := strings.Join([]string{u.Image, u.BuildID, u.Provider, u.UploadID}, "/")
		f, ok := v.Uploads[key]
		if !ok || f["external_id"][1] != u.ExternalID {
			t.Errorf("image-list row %s (%s) is not the znode kazoo reads: %v", key, u.ExternalID, f)
		}
	}
}

// holdBuildLocks is a kazoo script that takes the build lock of every image
// named in argv as a Python nodepool-builder does, says "held", releases them
// when it reads a line, and says "released".
const holdBuildLocks = `
import sys
locks = [zk.Lock("/nodepool/images/%s/builds/lock" % image) for image in sys.argv[1:]]
for l in locks:
    if not l.acquire(timeout=10):
        sys.exit("lock not taken")
print("held")
sys.stdin.readline()
for l in locks:
    l.release()
print("released")
sys.stdin.readline()
`

const zkTwoSources = `images-dir: {{IMAGES}}
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
`

// TestZooKeeperPythonBuilderHoldsTheBuildLock: while kazoo holds an image's
// build lock, as a Python builder building it would, our builder neither builds
// nor fetches that image; once released, it does.
func TestZooKeeperPythonBuilderHoldsTheBuildLock(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	z := newZooKeeper(t, testenv.ZooKeeperOptions{})
	e.writeYAML(zkTwoSources + zkKeys(z, zkChroot))
	zb := e.addBuild(e.makeImage(1), zuultest.BuildSpec{})

	k := testenv.StartKazoo(t, kazooConn(z), holdBuildLocks, "debian", "dib-image")
	k.Expect("held", 30*time.Second)
	r := e.once(0)
	if builds := e.buildsJSON(); len(builds) != 0 {
		t.Fatalf("built or fetched under another builder's lock: %+v\n%s", builds, r.stderr)
	}
	if imgs, _ := e.cloud.List(context.Background(), nil); len(imgs) != 0 {
		t.Fatalf("uploaded under another builder's lock: %+v", imgs)
	}
	for _, says := range []string{"it fetches the build\" image=debian", "it builds the image\" image=dib-image"} {
		if !strings.Contains(r.stderr, says) {
			t.Errorf("--once does not say %q:\n%s", says, r.stderr)
		}
	}
	// Our contenders withdrew: kazoo's node is the only one under each lock.
	out := z.Kazoo(t, `
for image in ("debian", "dib-image"):
    print(len(zk.get_children("`+zkChroot+`/nodepool/images/%s/builds/lock" % image)))
`)
	if out != "1\n1\n" {
		t.Errorf("lock nodes after --once: %q, want one each (kazoo's)", out)
	}

	k.Send("")
	k.Expect("released", 30*time.Second)
	e.once(0)
	if b, ok := e.zuulBuildOf(zb.UUID); !ok || b.State != "ready" {
		t.Fatalf("the Zuul build was not fetched once the lock was free: %+v", e.buildsJSON())
	}
	dib := e.buildsOf("dib-image")
	if len(dib) != 1 || dib[0].State != "ready" {
		t.Fatalf("dib-image was not built once the lock was free: %+v", dib)
	}
	if len(e.images("cloud-q")) != 2 || len(e.images("cloud-r")) != 1 {
		t.Fatalf("uploads after the lock was free: cloud-q %+v, cloud-r %+v", e.images("cloud-q"), e.images("cloud-r"))
	}
}

// TestZooKeeperTLS runs --once against a ZooKeeper that serves only TLS and
// requires a client certificate, as nodepool's clusters do; a wrong CA, a
// client certificate the server does not trust, a missing key or no TLS at
// all is a clear error.
func TestZooKeeperTLS(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	z := newZooKeeper(t, testenv.ZooKeeperOptions{TLS: true})
	base, err := os.ReadFile(e.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	e.addBuild(e.makeImage(1), zuultest.BuildSpec{})
	host, port, _ := strings.Cut(z.Addr, ":")
	servers := fmt.Sprintf("zookeeper-servers:\n  - host: %s\n    port: %s\n    chroot: %s\nzookeeper-timeout: 2\n", host, port, zkChroot)
	tlsKeys := func(cert, key, ca string) string {
		return fmt.Sprintf("zookeeper-tls:\n  cert: %s\n  key: %s\n  ca: %s\n", cert, key, ca)
	}
	refusals := []struct {
		name string
		keys string
		code int
		says []string
	}{
		{"wrong CA", tlsKeys(z.ClientCert, z.ClientKey, z.WrongCA), exitFailed,
			[]string{"ZooKeeper cannot be reached", z.Addr, "certificate signed by unknown authority"}},
		{"untrusted client certificate", tlsKeys(z.WrongClientCert, z.WrongClientKey, z.CA), exitFailed,
			[]string{"ZooKeeper cannot be reached", z.Addr, "zookeeper-tls", "bad certificate"}},
		{"missing key", tlsKeys(z.ClientCert, filepath.Join(e.dir, "absent.key"), z.CA), exitUsage,
			[]string{"zookeeper-tls", "absent.key", "no such file"}},
		{"no TLS", "", exitFailed, []string{"ZooKeeper cannot be reached", z.Addr, "zookeeper-tls"}},
	}
	for _, c := range refusals {
		if err := os.WriteFile(e.cfgPath, append(append([]byte{}, base...), servers+c.keys...), 0o644); err != nil {
			t.Fatal(err)
		}
		r := e.run("--once")
		if r.code != c.code {
			t.Errorf("%s: --once exited %d, want %d\n%s", c.name, r.code, c.code, r.stderr)
			continue
		}
		for _, s := range c.says {
			if !strings.Contains(r.stderr, s) {
				t.Errorf("%s: --once does not say %q:\n%s", c.name, s, r.stderr)
			}
		}
	}
	if imgs, _ := e.cloud.List(context.Background(), nil); len(imgs) != 0 {
		t.Fatalf("uploaded without a state: %+v", imgs)
	}

	if err := os.WriteFile(e.cfgPath, append(append([]byte{}, base...), zkKeys(z, zkChroot)...), 0o644); err != nil {
		t.Fatal(err)
	}
	e.once(0)
	v := launcher(t, z)
	checkSchema(t, v)
	for _, p := range []string{"cloud-q", "cloud-r"} {
		imgs := e.images(p)
		if len(imgs) != 1 || v.Launch["debian/"+p].ExternalID != imgs[0].ID {
			t.Errorf("%s: Glance holds %+v; the launcher would boot %+v", p, imgs, v.Launch["debian/"+p])
		}
	}
}

// TestZooKeeperUnreachable: --once against a cluster that does not answer exits
// 1 and names the servers.
func TestZooKeeperUnreachable(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	port := testenv.FreePort(t)
	e.appendConfig(fmt.Sprintf("zookeeper-servers:\n  - host: 127.0.0.1\n    port: %d\nzookeeper-timeout: 2\n", port))
	e.addBuild(e.makeImage(1), zuultest.BuildSpec{})
	r := e.once(exitFailed)
	for _, s := range []string{"ZooKeeper cannot be reached", fmt.Sprintf("127.0.0.1:%d", port), "connection refused"} {
		if !strings.Contains(r.stderr, s) {
			t.Errorf("--once does not say %q:\n%s", s, r.stderr)
		}
	}
	if imgs, _ := e.cloud.List(context.Background(), nil); len(imgs) != 0 {
		t.Fatalf("uploaded without a state: %+v", imgs)
	}
}
