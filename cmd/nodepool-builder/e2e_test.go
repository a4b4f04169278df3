package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/listing"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/uploader"
	"github.com/nodepool-builder/nodepool-builder/uploader/openstack"
	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

// env is one end-to-end setup: a real Glance, a stand-in Zuul and a config.
type env struct {
	t       *testing.T
	dir     string
	glance  *testenv.Glance
	cloud   *openstack.Cloud
	zuul    *zuultest.Server
	cfgPath string
	qemuImg string
}

func newEnv(t *testing.T, zopts zuultest.ServerOptions) *env {
	t.Helper()
	e := &env{t: t, dir: t.TempDir()}
	e.qemuImg = testenv.RequireBinary(t, "qemu-img")
	e.glance = testenv.NewGlance(t)
	t.Setenv("OS_CLIENT_CONFIG_FILE", e.glance.CloudsFile)
	cloud, err := openstack.Open(context.Background(), openstack.Options{Cloud: e.glance.Cloud})
	if err != nil {
		t.Fatal(err)
	}
	e.cloud = cloud
	e.zuul = zuultest.NewServer(zopts)
	t.Cleanup(e.zuul.Close)
	e.writeConfig("")
	return e
}

// writeConfig writes a nodepool.yaml with one zuul-image and two providers on the
// same Glance: cloud-q takes qcow2, cloud-r takes raw. extra is added to the
// zuul-image entry.
func (e *env) writeConfig(extra string) {
	e.t.Helper()
	tenant := ""
	if e.zuul.Tenant() != "" {
		tenant = "    tenant: " + e.zuul.Tenant() + "\n"
	}
	cfg := fmt.Sprintf(`images-dir: %s
labels:
  - name: debian
    min-ready: 1
zuul-images:
  - name: debian
    api-url: %s
%s    project: org/images
    job: build-debian
%sproviders:
  - name: cloud-q
    cloud: %s
    image-format: qcow2
    image-name-format: '{image_name}-q-{upload_id}-{build_id}'
    diskimages:
      - name: debian
  - name: cloud-r
    cloud: %s
    image-format: raw
    diskimages:
      - name: debian
        meta:
          hw_disk_bus: scsi
builder:
  keep-uploads: 2
  keep-builds: 2
`, filepath.Join(e.dir, "images"), e.zuul.URL(), tenant, extra, e.glance.Cloud, e.glance.Cloud)
	e.cfgPath = filepath.Join(e.dir, "nodepool.yaml")
	if err := os.WriteFile(e.cfgPath, []byte(cfg), 0o644); err != nil {
		e.t.Fatal(err)
	}
}

// result is what one run of the command printed and returned.
type result struct {
	code           int
	stdout, stderr string
}

func (e *env) run(args ...string) result {
	e.t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), append([]string{"nodepool-builder", "-c", e.cfgPath}, args...), &out, &errb)
	return result{code, out.String(), errb.String()}
}

func (e *env) once(wantCode int) result {
	e.t.Helper()
	r := e.run("--once")
	if r.code != wantCode {
		e.t.Fatalf("--once exited %d, want %d\nstderr:\n%s", r.code, wantCode, r.stderr)
	}
	return r
}

// image is a generated disk image in raw and qcow2 form.
type image struct {
	raw, qcow2       string
	rawSum, qcow2Sum string
}

func (e *env) makeImage(seed int64) image {
	e.t.Helper()
	dir := filepath.Join(e.dir, fmt.Sprintf("src-%d", seed))
	os.MkdirAll(dir, 0o755)
	img := image{raw: filepath.Join(dir, "disk.raw"), qcow2: filepath.Join(dir, "disk.qcow2")}
	data := make([]byte, 3<<20)
	rand.New(rand.NewSource(seed)).Read(data[:1<<20]) // the rest stays zero, as disks do
	if err := os.WriteFile(img.raw, data, 0o644); err != nil {
		e.t.Fatal(err)
	}
	if out, err := exec.Command(e.qemuImg, "convert", "-f", "raw", "-O", "qcow2", img.raw, img.qcow2).CombinedOutput(); err != nil {
		e.t.Fatalf("qemu-img convert: %v: %s", err, out)
	}
	img.rawSum, img.qcow2Sum = fileSHA256(e.t, img.raw), fileSHA256(e.t, img.qcow2)
	return img
}

func zuulImageMeta(format string) map[string]any {
	return map[string]any{"type": "zuul_image", "image_name": "debian", "format": format}
}

// addBuild publishes an image as Zuul's image jobs do: qcow2 plain, raw and vhd
// compressed with zstd.
func (e *env) addBuild(img image, spec zuultest.BuildSpec) zuultest.Build {
	e.t.Helper()
	if spec.Job == "" {
		spec.Job = "build-debian"
	}
	if spec.Artifacts == nil {
		spec.Artifacts = []zuultest.ArtifactSpec{
			{Name: "debian qcow2", Path: img.qcow2, Metadata: zuulImageMeta("qcow2")},
			{Name: "debian raw", Path: img.raw, Compress: "zst", Metadata: zuulImageMeta("raw")},
			{Name: "debian vhd", Path: img.raw, Compress: "zst", Metadata: zuulImageMeta("vhd")},
		}
	}
	b, err := e.zuul.AddBuild(spec)
	if err != nil {
		e.t.Fatal(err)
	}
	return b
}

func (e *env) artifact(b zuultest.Build, name string) zuultest.Artifact {
	for _, a := range b.Artifacts {
		if a.Name == name {
			return a
		}
	}
	e.t.Fatalf("build has no artifact %q", name)
	return zuultest.Artifact{}
}

// images returns the Glance images a provider holds, by our properties.
func (e *env) images(provider string) []uploader.CloudImage {
	e.t.Helper()
	imgs, err := e.cloud.List(context.Background(), map[string]string{uploader.PropProvider: provider})
	if err != nil {
		e.t.Fatal(err)
	}
	sort.Slice(imgs, func(a, b int) bool { return imgs[a].Name < imgs[b].Name })
	return imgs
}

// glanceData returns the sha256 of an image's data as Glance serves it.
func (e *env) glanceData(id string) string {
	e.t.Helper()
	resp, err := http.Get(strings.TrimSuffix(e.glance.Endpoint, "/") + "/v2/images/" + id + "/file")
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		e.t.Fatalf("download image %s from Glance: %s", id, resp.Status)
	}
	h := sha256.New()
	if _, err := io.Copy(h, resp.Body); err != nil {
		e.t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func (e *env) uploadsJSON() []listing.Upload {
	e.t.Helper()
	r := e.run("image-list", "--json")
	if r.code != 0 {
		e.t.Fatalf("image-list: %d %s", r.code, r.stderr)
	}
	var rows []listing.Upload
	if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil {
		e.t.Fatalf("image-list --json: %v\n%s", err, r.stdout)
	}
	return rows
}

func (e *env) buildsJSON() []listing.Build {
	e.t.Helper()
	r := e.run("dib-image-list", "--json")
	if r.code != 0 {
		e.t.Fatalf("dib-image-list: %d %s", r.code, r.stderr)
	}
	var rows []listing.Build
	if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil {
		e.t.Fatalf("dib-image-list --json: %v\n%s", err, r.stdout)
	}
	return rows
}

func fileSHA256(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	io.Copy(h, f)
	return hex.EncodeToString(h.Sum(nil))
}

func TestOnceUploadsEachProviderItsFormat(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	img := e.makeImage(1)
	zb := e.addBuild(img, zuultest.BuildSpec{})
	e.once(0)

	q, r := e.images("cloud-q"), e.images("cloud-r")
	if len(q) != 1 || len(r) != 1 {
		t.Fatalf("cloud-q holds %d images, cloud-r %d; want one each", len(q), len(r))
	}
	if q[0].DiskFormat != "qcow2" || r[0].DiskFormat != "raw" || q[0].Status != "active" || r[0].Status != "active" {
		t.Fatalf("formats/status: cloud-q %s %s, cloud-r %s %s", q[0].DiskFormat, q[0].Status, r[0].DiskFormat, r[0].Status)
	}
	if got := e.glanceData(q[0].ID); got != img.qcow2Sum {
		t.Errorf("cloud-q image data sha256 %s, want the qcow2's %s", got, img.qcow2Sum)
	}
	if got := e.glanceData(r[0].ID); got != img.rawSum {
		t.Errorf("raw uploaded from the .zst artifact differs from the original: %s, want %s", got, img.rawSum)
	}
	if r[0].Properties["hw_disk_bus"] != "scsi" || r[0].Properties["owner_specified.openstack.sha256"] != img.rawSum {
		t.Errorf("cloud-r properties = %v", r[0].Properties)
	}
	if !strings.HasPrefix(q[0].Name, "debian-q-0000000001-") {
		t.Errorf("image-name-format not applied: %s", q[0].Name)
	}
	if n := e.zuul.BytesServed(e.artifact(zb, "debian vhd").Path); n != 0 {
		t.Errorf("a format no provider needs was downloaded (%d bytes)", n)
	}

	rows := e.uploadsJSON()
	if len(rows) != 2 {
		t.Fatalf("image-list rows = %+v", rows)
	}
	for _, row := range rows {
		if row.State != "ready" || row.Image != "debian" || row.UploadID != "0000000001" || row.ExternalID == "" || row.StateTime == "" {
			t.Errorf("image-list row = %+v", row)
		}
	}
	builds := e.buildsJSON()
	if len(builds) != 1 || builds[0].Source != "zuul" || builds[0].ZuulBuildUUID != zb.UUID ||
		strings.Join(builds[0].Formats, ",") != "qcow2,raw" || builds[0].ID != store.BuildName("debian", builds[0].BuildID) {
		t.Fatalf("dib-image-list = %+v", builds)
	}
	// The files on disk carry DIB-style checksum sidecars.
	raw := filepath.Join(e.dir, "images", "debian-"+builds[0].BuildID+".raw")
	if sum, err := store.ReadSidecar(raw + ".sha256"); err != nil || sum != img.rawSum {
		t.Errorf("raw .sha256 sidecar = %q, %v", sum, err)
	}
	table := e.run("image-list")
	if !strings.Contains(table.stdout, "| Build ID") || !strings.Contains(table.stdout, "cloud-q") {
		t.Errorf("image-list table:\n%s", table.stdout)
	}

	// Nothing new: the second run downloads and uploads nothing.
	served := e.zuul.BytesServed(e.artifact(zb, "debian qcow2").Path) + e.zuul.BytesServed(e.artifact(zb, "debian raw").Path)
	e.once(0)
	again := e.zuul.BytesServed(e.artifact(zb, "debian qcow2").Path) + e.zuul.BytesServed(e.artifact(zb, "debian raw").Path)
	if again != served {
		t.Errorf("second run downloaded %d more bytes", again-served)
	}
	q2, r2 := e.images("cloud-q"), e.images("cloud-r")
	if len(q2) != 1 || len(r2) != 1 || q2[0].ID != q[0].ID || r2[0].ID != r[0].ID {
		t.Errorf("second run changed the clouds: %v %v", q2, r2)
	}
}

func TestOnceRotatesUploads(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	var first []uploader.CloudImage
	var firstBuild string
	for i := int64(1); i <= 4; i++ {
		e.addBuild(e.makeImage(i), zuultest.BuildSpec{})
		e.once(0)
		for _, p := range []string{"cloud-q", "cloud-r"} {
			if n := len(e.images(p)); n > 2 {
				t.Fatalf("after build %d %s holds %d images; keep-uploads is 2", i, p, n)
			}
		}
		if i == 1 {
			first = append(e.images("cloud-q"), e.images("cloud-r")...)
			firstBuild = e.buildsJSON()[0].BuildID
		}
	}
	for _, img := range first {
		if _, err := e.cloud.Get(context.Background(), img.ID); err == nil {
			t.Errorf("oldest upload %s (%s) still in Glance", img.ID, img.Name)
		}
	}
	matches, _ := filepath.Glob(filepath.Join(e.dir, "images", "debian-"+firstBuild+".*"))
	if len(matches) != 0 {
		t.Errorf("oldest build's files still on disk: %v", matches)
	}
	if n := len(e.buildsJSON()); n != 2 {
		t.Errorf("%d builds kept, keep-builds is 2", n)
	}
	if n := len(e.uploadsJSON()); n != 4 {
		t.Errorf("%d uploads kept, want 2 per provider", n)
	}
}

func TestOnceRefusesCorruptArtifact(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	good := e.makeImage(1)
	e.addBuild(good, zuultest.BuildSpec{})
	e.once(0)
	before := append(e.images("cloud-q"), e.images("cloud-r")...)

	bad := e.makeImage(2)
	wrong := zuulImageMeta("raw")
	wrong["sha256"] = strings.Repeat("0", 64)
	zb := e.addBuild(bad, zuultest.BuildSpec{Artifacts: []zuultest.ArtifactSpec{
		{Name: "debian qcow2", Path: bad.qcow2, Metadata: zuulImageMeta("qcow2")},
		{Name: "debian raw", Path: bad.raw, Compress: "zst", Metadata: wrong},
	}})
	r := e.once(1)
	if !strings.Contains(r.stderr, "checksum") {
		t.Errorf("--once did not say the checksum failed:\n%s", r.stderr)
	}
	after := append(e.images("cloud-q"), e.images("cloud-r")...)
	if len(after) != len(before) {
		t.Fatalf("a corrupt build changed the clouds: %d images before, %d after", len(before), len(after))
	}
	for i := range before {
		if before[i].ID != after[i].ID {
			t.Fatalf("a corrupt build changed the clouds: %v -> %v", before, after)
		}
	}
	builds := e.buildsJSON()
	if builds[0].State != "failed" || builds[0].ZuulBuildUUID != zb.UUID || !strings.Contains(builds[0].Reason, "checksum") {
		t.Errorf("corrupt build not recorded as failed with its reason: %+v", builds[0])
	}
	st := e.run("image-status", "--json")
	var rows []listing.ImageJSON
	if err := json.Unmarshal([]byte(st.stdout), &rows); err != nil || len(rows) != 1 {
		t.Fatalf("image-status --json: %v\n%s", err, st.stdout)
	}
	if r := rows[0]; r.LastZuulBuild == nil || *r.LastZuulBuild != zb.UUID || *r.LastZuulOutcome != "failed" ||
		r.LastZuulReason == nil || !strings.Contains(*r.LastZuulReason, "checksum") {
		t.Errorf("image-status does not show the refused Zuul build and why: %+v", r)
	}
	rawPath := e.artifact(zb, "debian raw").Path
	requests := len(e.zuul.ArtifactRequests(rawPath))
	e.once(0)
	e.once(0)
	if n := len(e.zuul.ArtifactRequests(rawPath)); n != requests {
		t.Errorf("the refused build was fetched again: %d requests, then %d", requests, n)
	}
}

func TestOnceResumesDroppedDownload(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	img := e.makeImage(1)
	zb := e.addBuild(img, zuultest.BuildSpec{})
	qa, ra := e.artifact(zb, "debian qcow2"), e.artifact(zb, "debian raw")
	e.zuul.DropAfter(qa.Path, qa.ServedSize/2)
	e.zuul.DropAfter(ra.Path, ra.ServedSize/3)
	e.once(0)
	for _, a := range []zuultest.Artifact{qa, ra} {
		var ranged bool
		for _, req := range e.zuul.ArtifactRequests(a.Path) {
			if req.Method == http.MethodGet && req.Range != "" && !strings.HasPrefix(req.Range, "bytes=0-") {
				ranged = true
			}
		}
		if !ranged {
			t.Errorf("%s: no Range request after the drop: %+v", a.Name, e.zuul.ArtifactRequests(a.Path))
		}
		if served := e.zuul.BytesServed(a.Path); served >= 2*a.ServedSize {
			t.Errorf("%s: %d bytes served for a %d-byte file: not resumed", a.Name, served, a.ServedSize)
		}
	}
	q, r := e.images("cloud-q"), e.images("cloud-r")
	if len(q) != 1 || len(r) != 1 {
		t.Fatalf("images after resumed download: %d %d", len(q), len(r))
	}
	if got := e.glanceData(r[0].ID); got != img.rawSum {
		t.Errorf("resumed .zst download uploaded different bytes")
	}
	if got := e.glanceData(q[0].ID); got != img.qcow2Sum {
		t.Errorf("resumed download uploaded different bytes")
	}
}

func TestOnceZuulShapesWhiteLabelAndToken(t *testing.T) {
	cases := []struct {
		name string
		opts zuultest.ServerOptions
	}{
		{"zuul 9 flat ref", zuultest.ServerOptions{Tenant: "example", Shape: zuultest.Shape9}},
		{"zuul 10 nested ref", zuultest.ServerOptions{Tenant: "example", Shape: zuultest.Shape10}},
		{"white-label root", zuultest.ServerOptions{Tenant: "example", WhiteLabel: true}},
		{"token-protected tenant", zuultest.ServerOptions{Tenant: "example", Token: "s3cret"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, c.opts)
			extra := ""
			if c.opts.WhiteLabel {
				// No tenant: the builder learns it from /api/info.
				e.writeConfigNoTenant()
			}
			if c.opts.Token != "" {
				tok := filepath.Join(e.dir, "token")
				os.WriteFile(tok, []byte(c.opts.Token+"\n"), 0o600)
				extra = "    auth-token-file: " + tok + "\n"
				e.writeConfig(extra)
			}
			zb := e.addBuild(e.makeImage(1), zuultest.BuildSpec{Project: "org/images", Branch: "main"})
			e.once(0)
			if len(e.images("cloud-q")) != 1 || len(e.images("cloud-r")) != 1 {
				t.Fatal("no uploads")
			}
			if b := e.buildsJSON(); b[0].ZuulBuildUUID != zb.UUID {
				t.Fatalf("ingested %s, want %s", b[0].ZuulBuildUUID, zb.UUID)
			}
			calls := e.zuul.BuildsCalls()
			if len(calls) == 0 {
				t.Fatal("no builds API calls")
			}
			last := calls[len(calls)-1]
			for _, want := range []string{"project=org%2Fimages", "job_name=build-debian", "result=SUCCESS", "complete=true"} {
				if !strings.Contains(last.RawQuery, want) {
					t.Errorf("builds query %q lacks %s", last.RawQuery, want)
				}
			}
			if c.opts.Token != "" && last.Authorization != "Bearer "+c.opts.Token {
				t.Errorf("Authorization = %q", last.Authorization)
			}
		})
	}
}

// writeConfigNoTenant writes the config without a tenant, for a white-label root.
func (e *env) writeConfigNoTenant() {
	e.t.Helper()
	e.writeConfig("")
	data, _ := os.ReadFile(e.cfgPath)
	out := strings.Replace(string(data), "    tenant: "+e.zuul.Tenant()+"\n", "", 1)
	os.WriteFile(e.cfgPath, []byte(out), 0o644)
}

func TestOnceWrongTokenSaysRefused(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example", Token: "right"})
	tok := filepath.Join(e.dir, "token")
	os.WriteFile(tok, []byte("wrong"), 0o600)
	e.writeConfig("    auth-token-file: " + tok + "\n")
	e.addBuild(e.makeImage(1), zuultest.BuildSpec{})
	r := e.once(1)
	if !strings.Contains(r.stderr, "refused the token") || !strings.Contains(r.stderr, tok) {
		t.Fatalf("error does not say the token was refused:\n%s", r.stderr)
	}
	// Rotating the token file fixes it without a restart.
	os.WriteFile(tok, []byte("right"), 0o600)
	e.once(0)
}

func TestSecondBuilderExitsLocked(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	lock, err := store.LockDir(filepath.Join(e.dir, "images"))
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Unlock()
	r := e.run("--once")
	if r.code != exitLocked || !strings.Contains(r.stderr, "locked by another builder") {
		t.Fatalf("exit %d, stderr:\n%s", r.code, r.stderr)
	}
}

func TestBadConfigExitsTwo(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "nodepool.yaml")
	os.WriteFile(cfg, []byte("images-dir: "+dir+"\nproviders:\n  - name: p\n    cloud: c\n    diskimages:\n      - name: nope\n"), 0o644)
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"nodepool-builder", "-c", cfg, "--once"}, &out, &errb)
	if code != exitUsage || !strings.Contains(errb.String(), "nodepool.yaml:6") || !strings.Contains(errb.String(), "providers[0].diskimages[0].name") {
		t.Fatalf("exit %d, stderr:\n%s", code, errb.String())
	}
	code = run(context.Background(), []string{"nodepool-builder", "-c", cfg, "config-validate"}, &out, &errb)
	if code != exitUsage {
		t.Fatalf("config-validate exit %d", code)
	}
	// An empty file is what a file cut short looks like: the daemon does not
	// start on it.
	os.WriteFile(cfg, []byte("# nodepool.yaml\n"), 0o644)
	errb.Reset()
	code = run(context.Background(), []string{"nodepool-builder", "-c", cfg}, &out, &errb)
	if code != exitUsage || !strings.Contains(errb.String(), cfg+":1: holds no config") {
		t.Fatalf("an empty config: exit %d, stderr:\n%s", code, errb.String())
	}
}

func TestProviderFormatFromCloudsYAML(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	// A second clouds.yaml entry for the same Glance that says it takes raw.
	clouds := filepath.Join(e.dir, "clouds.yaml")
	os.WriteFile(clouds, []byte(fmt.Sprintf(
		"clouds:\n  plain:\n    auth_type: none\n    image_endpoint_override: %s\n  rawcloud:\n    auth_type: none\n    image_endpoint_override: %s\n    image_format: raw\n",
		e.glance.Endpoint, e.glance.Endpoint)), 0o644)
	t.Setenv("OS_CLIENT_CONFIG_FILE", clouds)
	cfg := fmt.Sprintf(`images-dir: %s
zuul-images:
  - name: debian
    api-url: %s
    tenant: example
    project: org/images
    job: build-debian
providers:
  - name: cloud-r
    cloud: rawcloud
    diskimages:
      - name: debian
  - name: cloud-q
    cloud: plain
    diskimages:
      - name: debian
`, filepath.Join(e.dir, "images"), e.zuul.URL())
	os.WriteFile(e.cfgPath, []byte(cfg), 0o644)
	zb := e.addBuild(e.makeImage(1), zuultest.BuildSpec{})
	e.once(0)
	r, q := e.images("cloud-r"), e.images("cloud-q")
	if len(r) != 1 || r[0].DiskFormat != "raw" {
		t.Errorf("provider without image-format on a cloud with image_format raw got %+v", r)
	}
	if len(q) != 1 || q[0].DiskFormat != "qcow2" {
		t.Errorf("provider with neither setting did not get qcow2: %+v", q)
	}
	if n := e.zuul.BytesServed(e.artifact(zb, "debian vhd").Path); n != 0 {
		t.Errorf("vhd downloaded: %d bytes", n)
	}
}

// TestConfigValidateExamplesAndCorpus: the example and the accepted configs of
// the compatibility corpus validate on a host set up for them (their clouds in
// clouds.yaml, an images-dir and build-log-dir it can make); the rejected ones
// are refused with file and line.
func TestConfigValidateExamplesAndCorpus(t *testing.T) {
	t.Setenv("NODEPOOL_PORT", "8005")
	check := func(path string, want int) string {
		t.Helper()
		var out, errb bytes.Buffer
		code := run(context.Background(), []string{"nodepool-builder", "-c", path, "config-validate"}, &out, &errb)
		if code != want {
			t.Errorf("config-validate %s exited %d, want %d\n%s%s", path, code, want, out.String(), errb.String())
		}
		return errb.String()
	}
	accept, _ := filepath.Glob(filepath.Join("..", "..", "config", "testdata", "nodepool-configs", "accept", "*.yaml"))
	reject, _ := filepath.Glob(filepath.Join("..", "..", "config", "testdata", "nodepool-configs", "reject", "*.yaml"))
	if len(accept) == 0 || len(reject) == 0 {
		t.Fatal("compatibility corpus not found")
	}
	for _, f := range append([]string{filepath.Join("..", "..", "examples", "nodepool.yaml")}, accept...) {
		check(onThisHost(t, f), exitOK)
	}
	for _, f := range reject {
		msg := check(f, exitUsage)
		if !strings.Contains(msg, filepath.Base(f)+":") {
			t.Errorf("error for %s does not name the file and line: %s", f, msg)
		}
	}
}

// onThisHost copies a config into a directory of its own with its images-dir
// and build-log-dir there (line numbers kept), and points OS_CLIENT_CONFIG_FILE
// at a clouds.yaml that has each of its providers' clouds.
func onThisHost(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(config.Files{Nodepool: path})
	if err != nil {
		t.Fatalf("%s does not load: %v", path, err)
	}
	dir := t.TempDir()
	var clouds strings.Builder
	clouds.WriteString("clouds:\n")
	for _, p := range cfg.Providers {
		fmt.Fprintf(&clouds, "  %q: {auth_type: none, image_endpoint_override: 'http://127.0.0.1:9/'}\n", p.Cloud)
	}
	t.Setenv("OS_CLIENT_CONFIG_FILE", writeFileT(t, filepath.Join(dir, "clouds.yaml"), clouds.String()))
	text := regexp.MustCompile(`(?m)^(images-dir|build-log-dir):.*$`).ReplaceAllString(string(data), "# $1 is set below")
	// The state stays in SQLite: the cluster and its certificates are not here.
	text = regexp.MustCompile(`(?m)^(zookeeper-[a-z]+):.*(\n[ #].*)*$`).ReplaceAllStringFunc(text, func(block string) string {
		return strings.Repeat("#\n", strings.Count(block, "\n")) + "# zookeeper keys left out"
	})
	text += fmt.Sprintf("\nimages-dir: %s\nbuild-log-dir: %s\n", filepath.Join(dir, "images"), filepath.Join(dir, "logs"))
	if cfg.BuilderPath != "" {
		own, err := os.ReadFile(cfg.BuilderPath)
		if err != nil {
			t.Fatal(err)
		}
		writeFileT(t, filepath.Join(dir, config.BuilderFileName), string(own))
	}
	return writeFileT(t, filepath.Join(dir, filepath.Base(path)), text)
}
