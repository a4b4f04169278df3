package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/listing"
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
func zkKeys(z *testenv.ZooKeeper, chroot string) string { return zkKeysAt(z, z.Addr, chroot) }

// zkKeysAt is zkKeys with the server at addr, a proxy of z's.
func zkKeysAt(z *testenv.ZooKeeper, addr, chroot string) string {
	host, port, _ := strings.Cut(addr, ":")
	s := fmt.Sprintf("zookeeper-servers:\n  - host: %s\n    port: %s\n    chroot: %s\nzookeeper-timeout: %d\n",
		host, port, chroot, zkSessionTimeout)
	if z.TLS {
		s += fmt.Sprintf("zookeeper-tls:\n  cert: %s\n  key: %s\n  ca: %s\n", z.ClientCert, z.ClientKey, z.CA)
	}
	return s
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
// named lock skipped), the READY one with the highest state_time. A node
// deleted during the walk is skipped, as nodepool's getBuild and
// getImageUpload skip it (builders go on deleting while it reads).
const launcherScript = `
import json
from kazoo.exceptions import NoNodeError
root = "/nodepool/images"
out = {"builds": {}, "uploads": {}, "launch": {}}
def fields(data):
    return {k: [type(v).__name__, v] for k, v in json.loads(data.decode()).items()}
def children(path):
    try:
        return [c for c in zk.get_children(path) if c != "lock"]
    except NoNodeError:
        return []
def get(path):
    try:
        return zk.get(path)[0]
    except NoNodeError:
        return None
for image in children(root):
    bpath = root + "/" + image + "/builds"
    for build in children(bpath):
        data = get(bpath + "/" + build)
        if data is None:
            continue
        out["builds"][image + "/" + build] = fields(data)
        ppath = bpath + "/" + build + "/providers"
        for provider in children(ppath):
            ipath = ppath + "/" + provider + "/images"
            for upload in children(ipath):
                data = get(ipath + "/" + upload)
                if data is None:
                    continue
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
	z := testenv.NewZooKeeper(t, testenv.ZooKeeperOptions{})
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

// TestZooKeeperPythonBuilderHoldsTheBuildLock: while kazoo holds an image's
// build lock, as a Python builder building it would, our builder neither builds
// nor fetches that image; once released, it does.
func TestZooKeeperPythonBuilderHoldsTheBuildLock(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	z := testenv.NewZooKeeper(t, testenv.ZooKeeperOptions{})
	e.writeYAML(bothSources + zkKeys(z, zkChroot))
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
	for _, says := range []string{"it makes the build\" image=debian", "it makes the build\" image=dib-image"} {
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

// certWarning is what the builder's warning of a ZooKeeper server's
// certificate that does not name the host says.
const certWarning = "does not name the host it is configured as"

// TestZooKeeperTLS runs --once against a ZooKeeper that serves only TLS and
// requires a client certificate, as nodepool's clusters do, with a certificate
// that names it by host name alone (DNS:localhost) and is configured by its
// address: it works, with one warning that names both. A wrong CA, a server
// certificate of another CA, a client certificate the server does not trust,
// a missing key or no TLS at all is a clear error.
func TestZooKeeperTLS(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	z := testenv.NewZooKeeper(t, testenv.ZooKeeperOptions{TLS: true})
	impostor := z.Impostor(t)
	base, err := os.ReadFile(e.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	e.addBuild(e.makeImage(1), zuultest.BuildSpec{})
	servers := func(addr string) string {
		host, port, _ := strings.Cut(addr, ":")
		return fmt.Sprintf("zookeeper-servers:\n  - host: %s\n    port: %s\n    chroot: %s\nzookeeper-timeout: 2\n", host, port, zkChroot)
	}
	tlsKeys := func(cert, key, ca string) string {
		return fmt.Sprintf("zookeeper-tls:\n  cert: %s\n  key: %s\n  ca: %s\n", cert, key, ca)
	}
	refusals := []struct {
		name   string
		server string
		keys   string
		code   int
		says   []string
	}{
		{"wrong CA", z.Addr, tlsKeys(z.ClientCert, z.ClientKey, z.WrongCA), exitFailed,
			[]string{"ZooKeeper cannot be reached", z.Addr, "is not signed by the CA in " + z.WrongCA, "certificate signed by unknown authority"}},
		{"server certificate of another CA", impostor.Addr, tlsKeys(z.ClientCert, z.ClientKey, z.CA), exitFailed,
			[]string{"ZooKeeper cannot be reached", impostor.Addr, "is not signed by the CA in " + z.CA, "set zookeeper-tls ca"}},
		{"untrusted client certificate", z.Addr, tlsKeys(z.WrongClientCert, z.WrongClientKey, z.CA), exitFailed,
			[]string{"ZooKeeper cannot be reached", z.Addr, "zookeeper-tls", "bad certificate"}},
		{"missing key", z.Addr, tlsKeys(z.ClientCert, filepath.Join(e.dir, "absent.key"), z.CA), exitUsage,
			[]string{"zookeeper-tls", "absent.key", "no such file"}},
		{"no TLS", z.Addr, "", exitFailed, []string{"ZooKeeper cannot be reached", z.Addr, "zookeeper-tls"}},
	}
	for _, c := range refusals {
		if err := os.WriteFile(e.cfgPath, append(append([]byte{}, base...), servers(c.server)+c.keys...), 0o644); err != nil {
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
	r := e.once(0)
	if n := strings.Count(r.stderr, certWarning); n != 1 || !strings.Contains(r.stderr, "host=127.0.0.1 certificate_names=DNS:localhost") {
		t.Errorf("want one warning naming host 127.0.0.1 and the certificate's DNS:localhost, got %d:\n%s", n, r.stderr)
	}
	v := launcher(t, z)
	checkSchema(t, v)
	for _, p := range []string{"cloud-q", "cloud-r"} {
		imgs := e.images(p)
		if len(imgs) != 1 || v.Launch["debian/"+p].ExternalID != imgs[0].ID {
			t.Errorf("%s: Glance holds %+v; the launcher would boot %+v", p, imgs, v.Launch["debian/"+p])
		}
	}
}

// TestDaemonZooKeeperTLSByHostName: the daemon, given a ZooKeeper by the host
// name its certificate holds (DNS:localhost, no address), gets a session and
// registers as nodepool's builders do, without a warning; kazoo, as nodepool
// configures it, reaches the server with the same host and files.
func TestDaemonZooKeeperTLSByHostName(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	z := testenv.NewZooKeeper(t, testenv.ZooKeeperOptions{TLS: true})
	_, port, _ := strings.Cut(z.Addr, ":")
	byName := "localhost:" + port
	e.appendConfig(zkKeysAt(z, byName, zkChroot))
	d := startDaemon(t, e.cfgPath)
	c := kazooConn(z)
	c.Hosts = byName + zkChroot
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := testenv.RunKazoo(ctx, c, `print(len(zk.get_children("/nodepool/components/builder")))`)
	if err != nil || strings.TrimSpace(out) != "1" {
		t.Errorf("kazoo on %s finds %q builders registered (%v), want 1\n%s", byName, out, err, d.logs.String())
	}
	d.stop(t, 30*time.Second)
	if strings.Contains(d.logs.String(), certWarning) {
		t.Errorf("the daemon warned of a certificate that names the host:\n%s", d.logs.String())
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

// host is one of several builders sharing a ZooKeeper: its own config and
// images-dir.
type host struct {
	name, cfgPath, imagesDir string
	d                        *daemon
}

// hosts writes the env's config (text, as writeYAML takes it, plus zkKeys) for
// n builders, each with an images-dir and build-log-dir of its own.
func (e *env) hosts(z *testenv.ZooKeeper, text string, n int) []*host {
	e.t.Helper()
	e.writeYAML(text + zkKeys(z, zkChroot))
	base, err := os.ReadFile(e.cfgPath)
	if err != nil {
		e.t.Fatal(err)
	}
	var out []*host
	for i := range n {
		name := string(rune('a' + i))
		h := &host{name: name, cfgPath: filepath.Join(e.dir, "host-"+name+".yaml"), imagesDir: filepath.Join(e.dir, "host-"+name, "images")}
		cfg := strings.NewReplacer(e.imagesDir(), h.imagesDir, e.buildLogDir(), filepath.Join(e.dir, "host-"+name, "logs")).Replace(string(base))
		if err := os.WriteFile(h.cfgPath, []byte(cfg), 0o644); err != nil {
			e.t.Fatal(err)
		}
		out = append(out, h)
	}
	return out
}

func (h *host) start(t *testing.T) { h.d = startDaemon(t, h.cfgPath) }

// stop ends the host's daemon with SIGTERM and waits for it.
func (h *host) stop(t *testing.T) {
	t.Helper()
	h.d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-h.d.exited:
	case <-time.After(60 * time.Second):
		t.Fatalf("host %s did not stop within 60s of SIGTERM\n%s", h.name, h.d.logs.String())
	}
}

func (h *host) builderID(t *testing.T) string {
	t.Helper()
	id, err := os.ReadFile(filepath.Join(h.imagesDir, "builder_id.txt"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(id))
}

// holds tells whether the host's images-dir has a file of the build.
func (h *host) holds(b listing.Build) bool {
	files, _ := filepath.Glob(filepath.Join(h.imagesDir, b.ID+".*"))
	return len(files) > 0
}

// allLogs is what every host's daemons logged.
func allLogs(hs []*host, earlier ...string) string {
	logs := strings.Join(earlier, "\n")
	for _, h := range hs {
		if h.d != nil {
			logs += "\n--- host " + h.name + ":\n" + h.d.logs.String()
		}
	}
	return logs
}

// TestZooKeeperTwoHosts runs two builder daemons ("hosts", each with its own
// images-dir) on one ZooKeeper and one Glance: each build is made once, each
// upload once by the host that has the build's files, each rotated-out image
// deleted once. A host killed in the middle of an upload leaves nothing the
// other does not settle: its half-made image is deleted, new builds are the
// other's; back, it converges with the rest.
func TestZooKeeperTwoHosts(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	z := testenv.NewZooKeeper(t, testenv.ZooKeeperOptions{})
	hs := e.hosts(z, bothSources, 2)
	a, b := hs[0], hs[1]
	e.cfgPath = a.cfgPath // the listings read the shared state through host a's config
	a.start(t)
	b.start(t)
	var earlier []string // logs of daemons that ended

	// uploaded waits until the Zuul build is ready and uploaded to both
	// providers, and returns its record.
	uploaded := func(zb zuultest.Build, what string) listing.Build {
		t.Helper()
		testenv.WaitFor(t, 90*time.Second, what, e.zuulUploaded(zb, "cloud-q", "cloud-r"), func() string { return allLogs(hs, earlier...) })
		bj, _ := e.zuulBuildOf(zb.UUID)
		return bj
	}
	// once checks that a build is in one images-dir, and its images in Glance
	// once per provider, tagged by that host.
	once := func(bj listing.Build, providers ...string) *host {
		t.Helper()
		var holder *host
		for _, h := range hs {
			if h.holds(bj) {
				if holder != nil {
					t.Fatalf("build %s is on hosts %s and %s", bj.ID, holder.name, h.name)
				}
				holder = h
			}
		}
		if holder == nil {
			t.Fatalf("build %s is on no host", bj.ID)
		}
		for _, p := range providers {
			var mine []uploader.CloudImage
			for _, img := range e.images(p) {
				if img.Properties[uploader.PropBuildID] == bj.BuildID {
					mine = append(mine, img)
				}
			}
			if len(mine) != 1 || mine[0].Properties[uploader.PropBuilderID] != holder.builderID(t) {
				t.Fatalf("%s holds %+v of build %s, want one image uploaded by host %s", p, mine, bj.ID, holder.name)
			}
		}
		return holder
	}

	z1 := e.addBuild(e.makeImage(1), zuultest.BuildSpec{})
	b1 := uploaded(z1, "the first Zuul build's uploads")
	testenv.WaitFor(t, 90*time.Second, "dib-image's build and upload", func() bool {
		builds := e.buildsOf("dib-image")
		if len(builds) == 0 || builds[0].State != "ready" {
			return false
		}
		_, ok := e.readyUpload(builds[0].BuildID, "cloud-q")
		return ok
	}, func() string { return allLogs(hs) })
	if n := len(e.buildsOf("debian")); n != 1 {
		t.Fatalf("debian has %d builds after one Zuul build: %+v", n, e.buildsOf("debian"))
	}
	dib := e.buildsOf("dib-image")
	if len(dib) != 1 {
		t.Fatalf("dib-image was built %d times: %+v", len(dib), dib)
	}
	once(b1, "cloud-q", "cloud-r")
	once(dib[0], "cloud-q")

	// Two more builds rotate the first out: each of its images is deleted
	// once, whichever host does it.
	z2 := e.addBuild(e.makeImage(2), zuultest.BuildSpec{})
	b2 := uploaded(z2, "the second Zuul build's uploads")
	once(b2, "cloud-q", "cloud-r")
	z3 := e.addBuild(e.makeImage(3), zuultest.BuildSpec{})
	b3 := uploaded(z3, "the third Zuul build's uploads")
	once(b3, "cloud-q", "cloud-r")
	testenv.WaitFor(t, 90*time.Second, "the first build to be deleted", func() bool {
		for _, bj := range e.buildsOf("debian") {
			if bj.BuildID == b1.BuildID {
				return false
			}
		}
		for _, h := range hs {
			if h.holds(b1) {
				return false
			}
		}
		return true
	}, func() string { return allLogs(hs) })
	for _, p := range []string{"cloud-q", "cloud-r"} {
		for _, img := range e.images(p) {
			if img.Properties[uploader.PropBuildID] == b1.BuildID {
				t.Fatalf("%s still holds %s of the deleted build", p, img.ID)
			}
		}
	}
	deletes := map[string]int{}
	for _, line := range strings.Split(allLogs(hs), "\n") {
		if strings.Contains(line, `msg="deleted cloud image"`) {
			if m := regexp.MustCompile(`external_id=(\S+)`).FindStringSubmatch(line); m != nil {
				deletes[m[1]]++
			}
		}
	}
	if len(deletes) != 2 {
		t.Errorf("cloud images deleted: %v, want the first build's two", deletes)
	}
	for id, n := range deletes {
		if n != 1 {
			t.Errorf("cloud image %s was deleted %d times", id, n)
		}
	}

	// Host a alone fetches the next build and is killed as its upload starts.
	a.stop(t)
	b.stop(t)
	earlier = append(earlier, allLogs(hs))
	a.d = startMain(t, `msg="upload started"`, "-c", a.cfgPath)
	b.d = nil
	z4 := e.addBuild(e.makeImage(4), zuultest.BuildSpec{})
	select {
	case <-a.d.exited:
	case <-time.After(90 * time.Second):
		t.Fatalf("host a did not start an upload of the fourth build\n%s", a.d.logs.String())
	}
	if !strings.Contains(a.d.logs.String(), `msg="upload started"`) {
		t.Fatalf("host a exited before an upload started:\n%s", a.d.logs.String())
	}
	earlier = append(earlier, "--- host a, killed:\n"+a.d.logs.String())
	a.d = nil
	// Its uploads follow its download: the build may be ready, its files
	// host a's, or still building, marked as host a's in its images-dir.
	b4, ok := e.zuulBuildOf(z4.UUID)
	marked, _ := filepath.Glob(filepath.Join(a.imagesDir, ".builds", b4.ID+"*"))
	if !ok || !a.holds(b4) && len(marked) == 0 {
		t.Fatalf("the fourth build is not host a's: %+v", e.buildsJSON())
	}

	// Host b settles the killed upload once host a's session is gone, and
	// takes the new work.
	b.start(t)
	testenv.WaitFor(t, 90*time.Second, "host b to settle host a's interrupted upload", func() bool {
		for _, u := range e.uploadsJSON() {
			if u.State == "uploading" {
				return false
			}
		}
		imgs, _ := e.cloud.List(context.Background(), map[string]string{uploader.PropBuildID: b4.BuildID})
		for _, img := range imgs {
			if img.Status != "active" {
				return false
			}
		}
		return true
	}, func() string { return allLogs(hs, earlier...) })
	if logs := b.d.logs.String(); !strings.Contains(logs, `msg="upload was interrupted`) && !strings.Contains(logs, `msg="interrupted upload had finished`) {
		t.Fatalf("host b did not recover host a's upload:\n%s", allLogs(hs, earlier...))
	}
	z5 := e.addBuild(e.makeImage(5), zuultest.BuildSpec{})
	b5 := uploaded(z5, "host b to fetch and upload the fifth build")
	if once(b5, "cloud-q", "cloud-r") != b {
		t.Fatalf("the fifth build was not host b's")
	}

	// Host a comes back: together they converge.
	a.start(t)
	testenv.WaitFor(t, 90*time.Second, "both hosts to converge", func() bool {
		return e.settled(hs, b5, "cloud-q", "cloud-r") == ""
	}, func() string { return e.settled(hs, b5, "cloud-q", "cloud-r") + "\n" + allLogs(hs, earlier...) })
	a.stop(t)
	b.stop(t)
}

// settled says what is wrong once the hosts settled, or "": the newest build
// ready in every provider, every upload ready, every Glance image an upload's
// and none twice, every host's files of a build the state holds.
func (e *env) settled(hs []*host, newest listing.Build, providers ...string) string {
	for _, p := range providers {
		if _, ok := e.readyUpload(newest.BuildID, p); !ok {
			return "the newest build has no ready upload to " + p
		}
	}
	live := map[string]bool{}
	for _, u := range e.uploadsJSON() {
		if u.State != "ready" {
			return fmt.Sprintf("upload %s/%s/%s is %s", u.BuildID, u.Provider, u.UploadID, u.State)
		}
		if live[u.ExternalID] {
			return "two uploads name image " + u.ExternalID
		}
		live[u.ExternalID] = true
	}
	imgs, err := e.cloud.List(context.Background(), nil)
	if err != nil {
		return err.Error()
	}
	for _, img := range imgs {
		if !live[img.ID] {
			return fmt.Sprintf("Glance image %s (%s, %s) is no upload's", img.ID, img.Name, img.Status)
		}
	}
	known := map[string]bool{}
	for _, bj := range e.buildsJSON() {
		known[bj.BuildID] = true
	}
	for _, h := range hs {
		ents, _ := os.ReadDir(h.imagesDir)
		for _, ent := range ents {
			id, _, _ := strings.Cut(ent.Name(), ".")
			if buildIDPattern.MatchString(id) && !known[id] {
				return fmt.Sprintf("host %s keeps %s of a build the state no longer holds", h.name, ent.Name())
			}
		}
	}
	return ""
}

// TestZooKeeperRestartDuringUploads restarts ZooKeeper while an upload runs,
// once at once and once after longer than the session timeout (the builder
// then counts its locks as lost and stops the work under them): each time the
// builder converges, with no image uploaded twice and none leaked.
func TestZooKeeperRestartDuringUploads(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	z := testenv.NewZooKeeper(t, testenv.ZooKeeperOptions{})
	proxies := e.proxiedClouds("slow")
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
builder:
  upload-attempts: 100
` + zkKeys(z, zkChroot))
	h := &host{name: "a", cfgPath: e.cfgPath, imagesDir: e.imagesDir()}
	raw := func(img image) []zuultest.ArtifactSpec {
		return []zuultest.ArtifactSpec{{Name: "debian raw", Path: img.raw, Compress: "zst", Metadata: zuulImageMeta("raw")}}
	}
	const size = 8 << 20 // two minutes through the slow proxy: it is in flight until sped up
	proxies["slow"].SetRate(64 << 10)
	h.start(t)
	logs := func() string { return h.d.logs.String() + "\n--- zookeeper:\n" + testenvLogTail(z) }

	restarts := []struct {
		name string
		down func()
	}{
		{"at once", func() {
			if err := z.Stop(); err != nil {
				t.Fatal(err)
			}
		}},
		{"after the session timeout", func() {
			if err := z.Kill(); err != nil {
				t.Fatal(err)
			}
			h.d.waitLog(t, 30*time.Second, "every lock held counts as lost")
		}},
	}
	for i, r := range restarts {
		img := e.makeImageSized(int64(i+1), size)
		zb := e.addBuild(img, zuultest.BuildSpec{Artifacts: raw(img)})
		var buildID string
		testenv.WaitFor(t, 60*time.Second, "an upload of the build to the slow cloud", func() bool {
			bj, ok := e.zuulBuildOf(zb.UUID)
			buildID = bj.BuildID
			started := regexp.MustCompile(`msg="upload started" image=debian build=` + buildID + ` provider=cloud-a`)
			return ok && started.MatchString(h.d.logs.String())
		}, logs)
		if strings.Contains(h.d.logs.String(), `msg="upload ready" image=debian build=`+buildID+` provider=cloud-a`) {
			t.Fatalf("the upload to the slow cloud ended before ZooKeeper went down %s", r.name)
		}
		r.down()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if err := z.Start(ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
		proxies["slow"].SetRate(0)
		testenv.WaitFor(t, 120*time.Second, "the builder to converge after a restart "+r.name, func() bool {
			if !e.zuulUploaded(zb, "cloud-a", "cloud-b")() {
				return false
			}
			bj, _ := e.zuulBuildOf(zb.UUID)
			return e.settled([]*host{h}, bj, "cloud-a", "cloud-b") == ""
		}, func() string {
			bj, _ := e.zuulBuildOf(zb.UUID)
			return e.settled([]*host{h}, bj, "cloud-a", "cloud-b") + "\n" + logs()
		})
		proxies["slow"].SetRate(64 << 10)
	}
	h.stop(t)
}

// testenvLogTail is the end of ZooKeeper's log, for a failure message.
func testenvLogTail(z *testenv.ZooKeeper) string {
	data, err := os.ReadFile(z.LogFile)
	if err != nil {
		return err.Error()
	}
	if len(data) > 4096 {
		data = data[len(data)-4096:]
	}
	return string(data)
}

// pythonBuild is a kazoo script that writes a build and its uploads as a Python
// nodepool-builder does (nodepool's JSON, no record of ours): argv is the
// image, the build id, then provider=external_id pairs.
const pythonBuild = `
import json, sys, time
image, build = sys.argv[1], sys.argv[2]
base = "/nodepool/images/%s/builds/%s" % (image, build)
t = time.time() - 3600
zk.create(base, json.dumps({"state": "ready", "state_time": t, "builder": "python-host",
    "builder_id": "python-builder", "formats": "qcow2,raw", "username": "zuul",
    "python_path": "auto", "shell_type": None}).encode(), makepath=True)
for pair in sys.argv[3:]:
    provider, ext = pair.split("=")
    zk.create(base + "/providers/%s/images/" % provider, json.dumps({"state": "ready",
        "state_time": t, "external_id": ext, "external_name": "python-made",
        "format": "qcow2" if provider == "cloud-q" else "raw", "username": "zuul",
        "python_path": "auto", "shell_type": None}).encode(), sequence=True, makepath=True)
`

// pythonRelease is a kazoo script that marks a build deleting as a Python
// nodepool rewrites a build: its JSON replaced by nodepool's fields alone.
const pythonRelease = `
import json, sys, time
path = "/nodepool/images/%s/builds/%s" % (sys.argv[1], sys.argv[2])
data, stat = zk.get(path)
d = json.loads(data.decode())
d = {k: d[k] for k in ("builder", "builder_id", "formats", "username", "python_path", "shell_type")}
d.update(state="deleting", state_time=time.time())
zk.set(path, json.dumps(d).encode(), version=stat.version)
`

// TestZooKeeperPythonBuildersRecords: a build with uploads that a Python
// nodepool-builder made is listed and rotated like ours (its uploads deleted in
// the cloud, its record left for its builder); a build of ours that Python
// nodepool rewrote to release it still has what we keep beside it, and goes
// with its files.
func TestZooKeeperPythonBuildersRecords(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	z := testenv.NewZooKeeper(t, testenv.ZooKeeperOptions{})
	e.appendConfig(zkKeys(z, zkChroot))
	ctx := context.Background()
	const pyBuild = "0123456789abcdef0123456789abcdef"
	ext := map[string]string{}
	for _, p := range []string{"cloud-q", "cloud-r"} {
		// As nodepool uploads: its build id and upload id (the first
		// sequence node of the provider) on the image.
		id, err := e.cloud.Create(ctx, uploader.ImageSpec{Name: "python-made", DiskFormat: "raw",
			Properties: map[string]string{uploader.PropBuildID: pyBuild, uploader.PropUploadID: "0000000000"}})
		if err != nil {
			t.Fatal(err)
		}
		ext[p] = id
	}
	if _, err := testenv.RunKazoo(ctx, kazooConn(z), pythonBuild, "debian", pyBuild,
		"cloud-q="+ext["cloud-q"], "cloud-r="+ext["cloud-r"]); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(e.imagesDir(), 0o755); err != nil { // a host about to run its first builder
		t.Fatal(err)
	}
	builds := e.buildsJSON()
	if len(builds) != 1 || builds[0].BuildID != pyBuild || builds[0].State != "ready" || builds[0].Source != "dib" ||
		strings.Join(builds[0].Formats, ",") != "qcow2,raw" {
		t.Fatalf("the Python builder's build is listed as %+v", builds)
	}
	if ups := e.uploadsJSON(); len(ups) != 2 {
		t.Fatalf("the Python builder's uploads are listed as %+v", ups)
	}

	// Two builds of ours: the Python build is the third newest and goes.
	z1 := e.addBuild(e.makeImage(1), zuultest.BuildSpec{})
	e.once(0)
	e.addBuild(e.makeImage(2), zuultest.BuildSpec{})
	e.once(0)
	for _, p := range []string{"cloud-q", "cloud-r"} {
		if !e.gone(ext[p]) {
			t.Errorf("the Python build's image in %s was not deleted", p)
		}
	}
	for _, u := range e.uploadsJSON() {
		if u.BuildID == pyBuild {
			t.Errorf("the Python build's upload record is left: %+v", u)
		}
	}
	var py *listing.Build
	for _, bj := range e.buildsJSON() {
		if bj.BuildID == pyBuild {
			py = &bj
		}
	}
	if py == nil || py.State != "deleting" {
		t.Fatalf("the Python build's record = %+v; want it left deleting for its builder", py)
	}

	// Python nodepool releases our older build by rewriting its znode.
	b1, _ := e.zuulBuildOf(z1.UUID)
	if _, err := testenv.RunKazoo(ctx, kazooConn(z), pythonRelease, "debian", b1.BuildID); err != nil {
		t.Fatal(err)
	}
	rewritten, _ := e.zuulBuildOf(z1.UUID)
	if rewritten.State != "deleting" || rewritten.Source != "zuul" || rewritten.ZuulBuildUUID != z1.UUID {
		t.Fatalf("our build rewritten by Python nodepool reads as %+v", rewritten)
	}
	var images []string
	for _, p := range []string{"cloud-q", "cloud-r"} {
		u, ok := e.readyUpload(b1.BuildID, p)
		if !ok {
			t.Fatalf("the released build had no ready upload to %s", p)
		}
		images = append(images, u.ExternalID)
	}
	e.once(0)
	if _, ok := e.zuulBuildOf(z1.UUID); ok {
		t.Fatalf("the released build's record is left: %+v", e.buildsJSON())
	}
	if files, _ := filepath.Glob(filepath.Join(e.imagesDir(), b1.BuildID+".*")); len(files) != 0 {
		t.Fatalf("the released build's files are left: %v", files)
	}
	for _, id := range images {
		if !e.gone(id) {
			t.Errorf("the released build's image %s is left in Glance", id)
		}
	}
}
