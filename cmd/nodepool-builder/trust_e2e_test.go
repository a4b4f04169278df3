package main

import (
	"bytes"
	"context"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

// oneProvider is a config with the debian zuul-image uploaded to one provider
// in a format; extra is added to the zuul-image entry, builder to the builder
// section.
func (e *env) oneProvider(format, extra, builder string) {
	e.writeYAML(`images-dir: {{IMAGES}}
zuul-images:
{{DEBIAN}}` + extra + `providers:
  - name: cloud-x
    cloud: {{CLOUD}}
    image-format: ` + format + `
    diskimages:
      - name: debian
builder:
  leak-sweep: true
` + builder)
}

// qemuImage makes an image with qemu-img create; args come before the path.
func (e *env) qemuImage(name string, args ...string) string {
	e.t.Helper()
	path := filepath.Join(e.dir, name)
	if out, err := exec.Command(e.qemuImg, append(append([]string{"create", "-q"}, args...), path, "1M")...).CombinedOutput(); err != nil {
		e.t.Fatalf("qemu-img create %s: %v: %s", name, err, out)
	}
	return path
}

// refusedOnce checks a Zuul build that --once must refuse: it exits 1 saying
// each of says, the build is recorded failed with the reason, nothing reaches
// Glance or stays in the images-dir, and the next run fetches nothing again.
func (e *env) refusedOnce(zb zuultest.Build, artifact string, says ...string) {
	e.t.Helper()
	r := e.once(exitFailed)
	for _, s := range says {
		if !strings.Contains(r.stderr, s) {
			e.t.Errorf("--once does not say %q:\n%s", s, r.stderr)
		}
	}
	b, ok := e.zuulBuildOf(zb.UUID)
	if !ok || b.State != "failed" {
		e.t.Fatalf("the Zuul build is not recorded failed: %+v", e.buildsJSON())
	}
	for _, s := range says {
		if !strings.Contains(b.Reason, s) {
			e.t.Errorf("the failed build's reason does not say %q: %s", s, b.Reason)
		}
	}
	if imgs, err := e.cloud.List(context.Background(), nil); err != nil || len(imgs) != 0 {
		e.t.Fatalf("Glance holds %d images after a refusal (%v): %+v", len(imgs), err, imgs)
	}
	if files, _ := filepath.Glob(filepath.Join(e.imagesDir(), "debian-*")); len(files) != 0 {
		e.t.Errorf("files of a refused build stay: %v", files)
	}
	served := e.zuul.BytesServed(e.artifact(zb, artifact).Path)
	e.once(0)
	if again := e.zuul.BytesServed(e.artifact(zb, artifact).Path); again != served {
		e.t.Errorf("a refused artifact was fetched again: %d bytes served, then %d", served, again)
	}
}

// TestBackingFileArtifactRefused: a qcow2 artifact whose backing file names a
// file on the builder host is refused, whether a provider takes it as it is or
// converted to raw; nothing of the host file reaches a cloud.
func TestBackingFileArtifactRefused(t *testing.T) {
	for _, format := range []string{"qcow2", "raw"} {
		t.Run("provider takes "+format, func(t *testing.T) {
			e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
			host := filepath.Join(e.dir, "host-secret")
			data := append([]byte("HOST-FILE-MARKER-7f3a "), make([]byte, 1<<20)...)
			if err := os.WriteFile(host, data, 0o600); err != nil {
				t.Fatal(err)
			}
			evil := e.qemuImage("evil.qcow2", "-f", "qcow2", "-F", "raw", "-b", host)
			e.oneProvider(format, "", "")
			zb := e.addBuild(image{}, zuultest.BuildSpec{Artifacts: []zuultest.ArtifactSpec{
				{Name: "debian qcow2", Path: evil, Metadata: zuulImageMeta("qcow2")},
			}})
			e.refusedOnce(zb, "debian qcow2", "backing file", host)
		})
	}
}

// TestArtifactNotWhatItClaims: a file published as raw that is a qcow2 is refused.
func TestArtifactNotWhatItClaims(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	qcow := e.qemuImage("plain.qcow2", "-f", "qcow2")
	e.oneProvider("raw", "", "")
	zb := e.addBuild(image{}, zuultest.BuildSpec{Artifacts: []zuultest.ArtifactSpec{
		{Name: "debian raw", Path: qcow, Compress: "zst", Metadata: zuulImageMeta("raw")},
	}})
	e.refusedOnce(zb, "debian raw", "claims raw", "qcow2")
}

// TestRedirectToHTTPRefused: an https artifact redirected to http is refused.
func TestRedirectToHTTPRefused(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	zuulRoot := strings.TrimSuffix(e.zuul.URL(), "/")
	redirector := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, zuulRoot+r.URL.Path, http.StatusFound)
	}))
	defer redirector.Close()
	ca := filepath.Join(e.dir, "ca.pem")
	os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: redirector.Certificate().Raw}), 0o644)
	// The redirector is the operator's, on another port of loopback: named.
	e.oneProvider("qcow2", "    ca-cert: "+ca+"\n    artifact-hosts: [127.0.0.1]\n", "")
	img := e.makeImage(1)
	zb := e.addBuild(img, zuultest.BuildSpec{Artifacts: []zuultest.ArtifactSpec{{
		Name: "debian qcow2", Path: img.qcow2, Metadata: zuulImageMeta("qcow2"),
		Publish: func(u string) string { return strings.Replace(u, zuulRoot, redirector.URL, 1) },
	}}})
	e.refusedOnce(zb, "debian qcow2", "redirect", "http://")
}

// TestUnmergedChangesNeedOptIn: a build of a change (check) newer than the
// periodic build is passed over, unless the zuul-image allows unmerged changes.
func TestUnmergedChangesNeedOptIn(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	e.oneProvider("qcow2", "", "")
	merged := e.addBuild(e.makeImage(1), zuultest.BuildSpec{Pipeline: "periodic"})
	change := e.addBuild(e.makeImage(2), zuultest.BuildSpec{Pipeline: "check", Change: 4711, Patchset: "3"})
	e.once(0)
	if _, ok := e.zuulBuildOf(merged.UUID); !ok {
		t.Fatalf("the periodic build was not fetched: %+v", e.buildsJSON())
	}
	if _, ok := e.zuulBuildOf(change.UUID); ok {
		t.Fatal("a build of an unmerged change was fetched without allow-unmerged-changes")
	}
	if n := e.zuul.BytesServed(e.artifact(change, "debian qcow2").Path); n != 0 {
		t.Fatalf("%d bytes of the change's build were downloaded", n)
	}
	e.oneProvider("qcow2", "    allow-unmerged-changes: true\n", "")
	e.once(0)
	if b, ok := e.zuulBuildOf(change.UUID); !ok || b.State != "ready" {
		t.Fatalf("with allow-unmerged-changes the change's build was not fetched: %+v", e.buildsJSON())
	}
}

// TestOversizeArtifactStopsEarly: a .zst whose content would exceed
// builder.max-image-size is stopped early and leaves nothing on disk.
func TestOversizeArtifactStopsEarly(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	e.oneProvider("raw", "", "  max-image-size: 4M\n")
	img := e.makeImageSized(1, 32<<20)
	zb := e.addBuild(img, zuultest.BuildSpec{Artifacts: []zuultest.ArtifactSpec{
		{Name: "debian raw", Path: img.raw, Compress: "zst", Metadata: zuulImageMeta("raw")},
	}})
	e.refusedOnce(zb, "debian raw", "max-image-size")
	if left, _ := os.ReadDir(filepath.Join(e.imagesDir(), ".partial")); len(left) != 0 {
		t.Errorf("partial downloads left: %v", names(left))
	}
}

// TestSparseRaw: a mostly-zero raw image takes less disk than its size.
func TestSparseRaw(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	e.oneProvider("raw", "", "")
	img := e.makeImageSized(1, 64<<20) // its first MiB random, the rest zeros
	zb := e.addBuild(img, zuultest.BuildSpec{Artifacts: []zuultest.ArtifactSpec{
		{Name: "debian raw", Path: img.raw, Compress: "zst", Metadata: zuulImageMeta("raw")},
	}})
	e.once(0)
	b, ok := e.zuulBuildOf(zb.UUID)
	if !ok {
		t.Fatal("not fetched")
	}
	path := filepath.Join(e.imagesDir(), b.ID+".raw")
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != 64<<20 || st.Blocks*512 > 8<<20 {
		t.Fatalf("raw image: %d bytes long, %d bytes on disk; want 64 MiB long and far less on disk", st.Size, st.Blocks*512)
	}
	if got := fileSHA256(t, path); got != img.rawSum {
		t.Fatalf("sparse file sha256 %s, want %s", got, img.rawSum)
	}
	e.checkUploaded("cloud-x", b, "raw")
}

// TestFullImagesDirBacksOff: when the images-dir has no room for an image, the
// daemon says so and waits, instead of downloading again on every poll.
func TestFullImagesDirBacksOff(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	small := e.imagesDir()
	if err := os.MkdirAll(small, 0o755); err != nil {
		t.Fatal(err)
	}
	// A small filesystem of its own for the images-dir.
	if err := syscall.Mount("tmpfs", small, "tmpfs", 0, "size=16m"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("mount a 16 MiB tmpfs for the images-dir (CI runs as root): %v", err)
		}
		testenv.Unavailable(t, "mount a 16 MiB tmpfs needs root: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(small, syscall.MNT_DETACH) })
	e.oneProvider("raw", "", "")
	random := filepath.Join(e.dir, "random.raw")
	data := make([]byte, 24<<20)
	for i := range data {
		data[i] = byte(i*7 + i>>9) // does not compress to nothing, and is no zero run
	}
	os.WriteFile(random, data, 0o644)
	zb := e.addBuild(image{}, zuultest.BuildSpec{Artifacts: []zuultest.ArtifactSpec{
		{Name: "debian raw", Path: random, Metadata: zuulImageMeta("raw")},
	}})
	d := startDaemon(t, e.cfgPath, "--debug")
	d.waitLog(t, 60*time.Second, "free space")
	requests := len(e.zuul.ArtifactRequests(e.artifact(zb, "debian raw").Path))
	// Several polls later (poll-interval is 1 s), it has not tried again.
	for range 3 {
		n := strings.Count(d.logs.String(), "had too little free space")
		testenv.WaitFor(t, 30*time.Second, "another poll to wait", func() bool {
			return strings.Count(d.logs.String(), "had too little free space") > n
		}, d.logs.String)
	}
	if again := len(e.zuul.ArtifactRequests(e.artifact(zb, "debian raw").Path)); again != requests {
		t.Fatalf("the artifact was requested %d times, then %d: no back-off", requests, again)
	}
	if !strings.Contains(d.logs.String(), "waits 1m0s") {
		t.Errorf("the log does not say how long it waits:\n%s", d.logs.String())
	}
}

// TestReplacedStateDatabase: a state database of another builder stops the
// builder; with the state lost, the leak sweep keeps each provider's last image.
func TestReplacedStateDatabase(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	e.oneProvider("qcow2", "", "")
	e.addBuild(e.makeImage(1), zuultest.BuildSpec{})
	e.once(0)
	only := e.images("cloud-x")
	if len(only) != 1 {
		t.Fatalf("cloud-x holds %d images", len(only))
	}

	// Another builder's state database put in place.
	otherDir := filepath.Join(e.dir, "other-images")
	other, err := store.Open(context.Background(), store.Options{ImagesDir: otherDir})
	if err != nil {
		t.Fatal(err)
	}
	other.Close()
	db := filepath.Join(e.imagesDir(), "builder.db")
	theirs, _ := os.ReadFile(filepath.Join(otherDir, "builder.db"))
	os.Remove(db + "-wal")
	os.Remove(db + "-shm")
	os.WriteFile(db, theirs, 0o644)
	ours, _ := os.ReadFile(filepath.Join(e.imagesDir(), "builder_id.txt"))
	theirID, _ := os.ReadFile(filepath.Join(otherDir, "builder_id.txt"))
	r := e.run("--once")
	if r.code != exitUsage || !strings.Contains(r.stderr, strings.TrimSpace(string(ours))) ||
		!strings.Contains(r.stderr, strings.TrimSpace(string(theirID))) {
		t.Fatalf("--once with another builder's state: exit %d\n%s\nwant exit %d naming both ids", r.code, r.stderr, exitUsage)
	}
	if imgs := e.images("cloud-x"); len(imgs) != 1 || imgs[0].ID != only[0].ID {
		t.Fatalf("a refused start changed Glance: %+v", imgs)
	}

	// The state lost: the builder stops, since the build files in the
	// images-dir are of no state it has, until it is told to take the
	// images-dir over; then it starts with a new, empty state. The image is
	// paused, so no new upload comes to replace the old one, which every sweep
	// sees as leaked.
	os.Remove(db)
	e.oneProvider("qcow2", "    pause: true\n", "")
	files, _ := filepath.Glob(filepath.Join(e.imagesDir(), "debian-*.qcow2"))
	if r := e.run("--once"); r.code != exitUsage || len(files) != 1 || !strings.Contains(r.stderr, filepath.Base(files[0])) ||
		!strings.Contains(r.stderr, "take-over-images-dir") {
		t.Fatalf("--once with the state lost: exit %d\n%s\nwant exit %d naming the build's file %v and what to do",
			r.code, r.stderr, exitUsage, files)
	}
	if r := e.run("take-over-images-dir"); r.code != 0 || !strings.Contains(r.stdout, filepath.Base(files[0])) {
		t.Fatalf("take-over-images-dir: exit %d\n%s%s\nwant it to list the file it leaves alone", r.code, r.stdout, r.stderr)
	}
	for range 3 {
		e.once(0)
	}
	if imgs := e.images("cloud-x"); len(imgs) != 1 || imgs[0].ID != only[0].ID {
		t.Fatalf("with the state lost, the sweep deleted the provider's only image: %+v", imgs)
	}
	// Unpaused, the newest build is fetched and uploaded again; then the old
	// image is a leak like any other.
	e.oneProvider("qcow2", "", "")
	for range 3 {
		e.once(0)
	}
	imgs := e.images("cloud-x")
	if len(imgs) != 1 || imgs[0].ID == only[0].ID {
		t.Fatalf("after a new upload the old image should be gone: %+v", imgs)
	}
}

// TestNoSecretsInLogs: a full run with a Zuul token, a password cloud and signed
// artifact URLs, one of which fails, leaves none of them in the logs, the
// listings or the state.
func TestNoSecretsInLogs(t *testing.T) {
	const (
		token = "zuul-token-3a8f1c"
		sig   = "url-signature-5c4b0a"
	)
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example", Token: token})
	// A real login and catalog; the Glance it names takes any request.
	ks := testenv.SharedKeystone(t)
	account := ks.NewAccount(t)
	password := account.Password
	region := ks.AddRegion(t)
	ks.AddEndpoint(t, ks.AddService(t, "image"), region, "public", e.glance.Endpoint)
	clouds := filepath.Join(e.dir, "clouds.yaml")
	os.WriteFile(clouds, []byte(fmt.Sprintf(`clouds:
  secret:
    auth:
      auth_url: %s/v3
      username: %s
      password: %s
      project_name: %s
      user_domain_name: Default
      project_domain_name: Default
    region_name: %s
    verify: false
`, ks.URL, account.User, password, account.Project, region)), 0o600)
	t.Setenv("OS_CLIENT_CONFIG_FILE", clouds)
	tokenFile := filepath.Join(e.dir, "zuul.token")
	os.WriteFile(tokenFile, []byte(token+"\n"), 0o600)
	e.writeYAML(`images-dir: {{IMAGES}}
zuul-images:
{{DEBIAN}}    auth-token-file: ` + tokenFile + `
  - name: broken
    api-url: {{ZUUL}}
    tenant: example
    project: org/images
    job: build-broken
    auth-token-file: ` + tokenFile + `
providers:
  - name: cloud-x
    cloud: secret
    image-format: qcow2
    diskimages:
      - name: debian
      - name: broken
`)
	signed := func(u string) string { return u + "?X-Amz-Signature=" + sig + "&X-Amz-Credential=AKIA" }
	img := e.makeImage(1)
	e.addBuild(img, zuultest.BuildSpec{Artifacts: []zuultest.ArtifactSpec{
		{Name: "debian qcow2", Path: img.qcow2, Metadata: zuulImageMeta("qcow2"), Publish: signed},
	}})
	// The broken image's signed link leads nowhere.
	e.addBuild(img, zuultest.BuildSpec{Job: "build-broken", Artifacts: []zuultest.ArtifactSpec{
		{Name: "broken qcow2", Path: img.qcow2, Metadata: zuulImageMeta("qcow2"),
			Publish: func(u string) string { return signed(strings.Replace(u, "/logs/", "/nowhere/", 1)) }},
	}})
	var all bytes.Buffer
	r := e.run("--once")
	all.WriteString(r.stderr + r.stdout)
	if r.code != exitFailed {
		t.Fatalf("--once exit %d, want %d (the broken image fails)\n%s", r.code, exitFailed, r.stderr)
	}
	// Only a login finds the Glance in the catalog.
	if len(e.images("cloud-x")) != 1 {
		t.Fatalf("the debian image was not uploaded through the password cloud:\n%s", r.stderr)
	}
	if !strings.Contains(r.stderr, "verify: false") {
		t.Errorf("no warning about verify: false:\n%s", r.stderr)
	}
	d := startDaemon(t, e.cfgPath, "--debug")
	d.waitLog(t, 30*time.Second, "broken")
	d.cmd.Process.Signal(syscall.SIGTERM)
	<-d.exited
	all.WriteString(d.logs.String())
	for _, args := range [][]string{{"dib-image-list", "--json"}, {"image-list", "--json"}, {"image-status", "--json"}, {"dib-image-list"}, {"image-list"}} {
		r := e.run(args...)
		all.WriteString(r.stdout + r.stderr)
	}
	if !strings.Contains(all.String(), "REDACTED") {
		t.Errorf("no URL was shown redacted: the failing download should have been reported")
	}
	state := filepath.Join(e.imagesDir(), "builder.db")
	for _, f := range []string{state, state + "-wal"} {
		data, _ := os.ReadFile(f)
		all.Write(data)
	}
	for _, secret := range []string{token, password, sig} {
		if i := strings.Index(all.String(), secret); i >= 0 {
			t.Errorf("%q leaked: ...%s...", secret, all.String()[max(0, i-200):min(all.Len(), i+50)])
		}
	}
}
