package main

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/listing"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/store/storetest"
	"github.com/nodepool-builder/nodepool-builder/uploader"
	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

// adminConfig is a nodepool.yaml with every kind of image the admin commands
// treat differently: a diskimage, an abstract one, a diskimage paused in the
// config, and a zuul-image (polled every second) uploaded to two providers.
// Its diskimages run the fake DIB, and dib-image's build (due at start) takes an
// hour, so the build requests the test makes stay pending.
const adminConfig = `images-dir: {{IMAGES}}
build-log-dir: {{LOGS}}
diskimages:
  - name: dib-base
    abstract: true
    dib-cmd: {{DIB}}
    elements: [vm]
    env-vars:
      FAKE_DIB_SLEEP: "3600"
  - name: dib-image
    parent: dib-base
    elements: [debian-minimal]
  - name: dib-paused
    elements: [debian-minimal]
    pause: true
zuul-images:
{{DEBIAN}}providers:
  - name: cloud-q
    cloud: {{CLOUD}}
    image-format: qcow2
    diskimages:
      - name: debian
  - name: cloud-r
    cloud: {{CLOUD}}
    image-format: raw
    diskimages:
      - name: debian
`

// writeAdminConfig writes adminConfig for a Zuul at zuulURL and a cloud.
func writeAdminConfig(t *testing.T, dir, zuulURL, cloud string) string {
	t.Helper()
	path := filepath.Join(dir, "nodepool.yaml")
	cfg := strings.NewReplacer(
		"{{IMAGES}}", filepath.Join(dir, "images"),
		"{{LOGS}}", filepath.Join(dir, "logs", "builds"),
		"{{DIB}}", fakeDIBCmd(t),
		"{{ZUUL}}", zuulURL,
		"{{CLOUD}}", cloud,
	).Replace(strings.ReplaceAll(adminConfig, "{{DEBIAN}}", debianZuulImage))
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// buildsOf is dib-image-list --json for one image.
func (e *env) buildsOf(image string) []listing.Build {
	e.t.Helper()
	var out []listing.Build
	for _, b := range e.buildsJSON() {
		if b.Image == image {
			out = append(out, b)
		}
	}
	return out
}

// must runs a command and fails the test unless it exits with code and its
// stderr holds every one of says.
func (e *env) must(code int, args []string, says ...string) result {
	e.t.Helper()
	r := e.run(args...)
	if r.code != code {
		e.t.Fatalf("%s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.code, code, r.stdout, r.stderr)
	}
	for _, s := range says {
		if !strings.Contains(r.stderr, s) {
			e.t.Errorf("%s: stderr does not say %q:\n%s", strings.Join(args, " "), s, r.stderr)
		}
	}
	return r
}

// decode parses a command's --json output.
func decode[T any](t *testing.T, r result) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
		t.Fatalf("bad JSON: %v\n%s", err, r.stdout)
	}
	return v
}

// status returns image-status --json by image, and the images in the order listed.
func (e *env) status() (map[string]listing.ImageJSON, []string) {
	e.t.Helper()
	rows := decode[[]listing.ImageJSON](e.t, e.must(0, []string{"image-status", "--json"}))
	byImage := map[string]listing.ImageJSON{}
	var order []string
	for _, r := range rows {
		byImage[r.Image] = r
		order = append(order, r.Image)
	}
	return byImage, order
}

// refusal is a command that must be refused with an exit code and a message.
type refusal struct {
	args []string
	code int
	says []string
}

func (e *env) refusals(t *testing.T, cases []refusal) {
	t.Helper()
	for _, c := range cases {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			r := e.run(c.args...)
			if r.code != c.code {
				t.Fatalf("exit %d, want %d\nstderr:\n%s", r.code, c.code, r.stderr)
			}
			for _, s := range c.says {
				if !strings.Contains(r.stderr, s) {
					t.Errorf("stderr does not say %q:\n%s", s, r.stderr)
				}
			}
		})
	}
}

func TestAdminCommandsWhileDaemonRuns(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	e.cfgPath = writeAdminConfig(t, e.dir, e.zuul.URL(), e.glance.Cloud)
	imagesDir := filepath.Join(e.dir, "images")
	e.addBuild(e.makeImage(1), zuultest.BuildSpec{})
	// -d: the poller logs each poll it skips for the pause, which the test waits for.
	logs := startDaemon(t, e.cfgPath, "-d").logs
	readyUploads := func(n int) func() bool {
		return func() bool {
			count := 0
			for _, row := range e.uploadsJSON() {
				if row.State == "ready" {
					count++
				}
			}
			return count == n
		}
	}
	testenv.WaitFor(t, 60*time.Second, "the first build's uploads", readyUploads(2), logs.String)

	// image-pause stops fetching a zuul-image's new builds; twice is fine.
	e.must(0, []string{"image-pause", "debian"})
	e.must(0, []string{"image-pause", "debian"})
	// A poll that began before the pause may still be asking Zuul: once a poll
	// has been skipped for the pause, it has ended.
	pausedPolls := func() int {
		n := 0
		for l := range strings.SplitSeq(logs.String(), "\n") {
			if strings.Contains(l, `msg="nothing made"`) && strings.Contains(l, "image=debian") && strings.Contains(l, "reason=paused") {
				n++
			}
		}
		return n
	}
	testenv.WaitFor(t, 30*time.Second, "a poll of debian skipped for the pause", func() bool { return pausedPolls() >= 1 }, logs.String)
	st, _ := e.status()
	if !st["debian"].Paused || !slices.Equal(st["debian"].PausedBy, []string{"image-pause"}) {
		t.Fatalf("image-status after image-pause: %+v", st["debian"])
	}
	if out := e.must(0, []string{"image-status"}).stdout; !tableRowHas(out, "debian", "True", "image-pause") {
		t.Errorf("image-status table does not show debian paused by image-pause:\n%s", out)
	}
	zb2 := e.addBuild(e.makeImage(2), zuultest.BuildSpec{})
	// Three polls skipped while the new build is there: none fetched it.
	skipped := pausedPolls()
	testenv.WaitFor(t, 60*time.Second, "three more polls of the paused debian", func() bool { return pausedPolls() >= skipped+3 }, logs.String)
	if n := len(e.buildsOf("debian")); n != 1 {
		t.Fatalf("a new Zuul build was fetched while the image was paused: %d builds\n%s", n, logs.String())
	}
	if n := e.zuul.BytesServed(e.artifact(zb2, "debian qcow2").Path); n != 0 {
		t.Fatalf("%d bytes of the new build were downloaded while the image was paused", n)
	}
	e.must(0, []string{"image-unpause", "debian"})
	e.must(0, []string{"image-unpause", "debian"})
	if st, _ := e.status(); st["debian"].Paused || len(st["debian"].PausedBy) != 0 {
		t.Fatalf("image-status after image-unpause: %+v", st["debian"])
	}
	testenv.WaitFor(t, 60*time.Second, "the new build to be fetched and uploaded after image-unpause", func() bool {
		return len(e.buildsOf("debian")) == 2 && readyUploads(4)()
	}, logs.String)

	builds := e.buildsOf("debian")
	newest, oldest := builds[0], builds[1]
	var newestR, newestQ listing.Upload
	var oldestUps []listing.Upload
	for _, u := range e.uploadsJSON() {
		switch {
		case u.BuildID == oldest.BuildID:
			oldestUps = append(oldestUps, u)
		case u.Provider == "cloud-r":
			newestR = u
		default:
			newestQ = u
		}
	}
	if len(oldestUps) != 2 || newestR.ExternalID == "" || newestQ.ExternalID == "" {
		t.Fatalf("uploads before the deletes: %+v", e.uploadsJSON())
	}

	// Deletes are recorded now and carried out by the daemon on its next pass; the
	// checks below run meanwhile.
	e.refusals(t, []refusal{
		{[]string{"dib-image-delete"}, exitUsage, []string{"needs"}},
		{[]string{"dib-image-delete", "debian-0123456789abcdef"}, exitUsage, []string{"no build", "dib-image-list"}},
		{[]string{"dib-image-delete", "nodash"}, exitUsage, []string{"<image>-<build_id>"}},
		{[]string{"dib-image-delete", store.BuildName("dib-image", oldest.BuildID)}, exitUsage, []string{"no build"}},
		{[]string{"image-delete", "--provider", "cloud-r"}, exitUsage, []string{"--image, --build-id, --upload-id"}},
		{[]string{"image-delete", "--provider", "cloud-r", "--image", "debian", "--build-id", newest.BuildID, "--upload-id", "0000000099"},
			exitUsage, []string{"no upload", "image-list"}},
		{[]string{"image-delete", "--provider", "cloud-q", "--image", "dib-image", "--build-id", newest.BuildID, "--upload-id", newestQ.UploadID},
			exitUsage, []string{"no upload"}},
	})
	dr := decode[listing.Build](t, e.must(0, []string{"dib-image-delete", "--json", oldest.ID}))
	if dr.ID != oldest.ID || dr.State != "deleting" {
		t.Errorf("dib-image-delete --json = %+v, want %s deleting", dr, oldest.ID)
	}
	ur := decode[listing.Upload](t, e.must(0, []string{"image-delete", "--json", "--provider", "cloud-r", "--image", "debian",
		"--build-id", newest.BuildID, "--upload-id", newestR.UploadID}))
	if ur.ExternalID != newestR.ExternalID || ur.State != "deleting" {
		t.Errorf("image-delete --json = %+v, want %s deleting", ur, newestR.ExternalID)
	}

	// image-build: only for diskimages that are not paused.
	e.must(0, []string{"image-pause", "dib-image"})
	e.refusals(t, []refusal{
		{[]string{"image-build"}, exitUsage, []string{"needs"}},
		{[]string{"image-build", "nope"}, exitUsage, []string{"neither a diskimage nor a zuul-image", "dib-image, dib-paused, debian"}},
		{[]string{"image-build", "dib-base"}, exitUsage, []string{"neither a diskimage nor a zuul-image"}},
		{[]string{"image-build", "debian"}, exitFailed, []string{"zuul-image", "build-debian"}},
		{[]string{"image-build", "dib-paused"}, exitFailed, []string{"paused (config)", "pause: false"}},
		{[]string{"image-build", "dib-image"}, exitFailed, []string{"paused (image-pause)", "image-unpause dib-image"}},
		{[]string{"image-pause", "nope"}, exitUsage, []string{"neither a diskimage nor a zuul-image"}},
		{[]string{"image-unpause"}, exitUsage, []string{"needs"}},
		{[]string{"image-pause", "debian", "--json"}, exitUsage, []string{"before it"}},
	})
	e.must(0, []string{"image-unpause", "dib-image"})
	if st, _ := e.status(); st["dib-image"].BuildRequest != nil {
		t.Fatalf("a refused image-build left a request: %+v", st["dib-image"])
	}
	br := decode[listing.ImageJSON](t, e.must(0, []string{"image-build", "--json", "dib-image"}))
	if br.BuildRequest == nil || *br.BuildRequest != "pending" || br.BuildRequestTime == nil {
		t.Fatalf("image-build --json = %+v, want a pending request", br)
	}
	e.must(0, []string{"image-build", "dib-image"})
	st, order := e.status()
	if !slices.Equal(order, []string{"dib-image", "dib-paused", "debian"}) {
		t.Errorf("image-status lists %v; want diskimages, then zuul-images, in config order", order)
	}
	if got := st["dib-image"]; got.BuildRequest == nil || *got.BuildRequest != "pending" ||
		got.BuildRequestTime == nil || *got.BuildRequestTime != *br.BuildRequestTime || got.Source != "dib" {
		t.Errorf("image-status of dib-image after two image-builds = %+v, want the first request pending", got)
	}
	if got := st["dib-paused"]; !got.Paused || !slices.Equal(got.PausedBy, []string{"config"}) {
		t.Errorf("image-status of dib-paused = %+v, want paused by config", got)
	}
	if got := st["debian"]; got.NewestBuild == nil || *got.NewestBuild != newest.ID || got.Source != "zuul" || got.BuildRequest != nil {
		t.Errorf("image-status of debian = %+v, want newest build %s", got, newest.ID)
	}
	out := e.must(0, []string{"image-status"}).stdout
	if h := tableHeader(out); len(h) < 4 || !slices.Equal(h[:4], []string{"Image", "Paused", "Build Request", "Build Request Age"}) ||
		!tableRowHas(out, "dib-image", "False", "pending") || !tableRowHas(out, "debian", newest.ID) {
		t.Errorf("image-status table:\n%s", out)
	}

	// alien-image-list: images tagged with this builder's id that the store does not hold.
	id, err := os.ReadFile(filepath.Join(imagesDir, "builder_id.txt"))
	if err != nil {
		t.Fatal(err)
	}
	alien, err := e.cloud.Create(ctx, uploader.ImageSpec{Name: "debian-alien", DiskFormat: "qcow2", Properties: map[string]string{
		uploader.PropBuilderID: strings.TrimSpace(string(id)), uploader.PropProvider: "cloud-q",
		uploader.PropBuildID: "0123456789abcdef", uploader.PropUploadID: "0000000001",
	}})
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := e.cloud.Create(ctx, uploader.ImageSpec{Name: "debian-foreign", DiskFormat: "qcow2", Properties: map[string]string{
		uploader.PropBuilderID: "another-builder", uploader.PropProvider: "cloud-q", uploader.PropBuildID: "0123456789abcdef",
	}})
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, u := range e.uploadsJSON() {
		known[u.ExternalID] = true
	}
	rows := decode[[]alienJSON](t, e.must(0, []string{"alien-image-list", "--json"}))
	found := false
	for _, r := range rows {
		switch {
		case r.ExternalID == alien:
			found = r.Provider == "cloud-q" && r.Name == "debian-alien"
		case r.ExternalID == foreign:
			t.Errorf("another builder's image is listed as alien: %+v", r)
		case known[r.ExternalID]:
			t.Errorf("an upload the store holds is listed as alien: %+v", r)
		}
	}
	if !found {
		t.Errorf("alien-image-list --json = %+v, want cloud-q debian-alien %s", rows, alien)
	}
	if out := e.must(0, []string{"alien-image-list"}).stdout; !slices.Equal(tableHeader(out), []string{"Provider", "Name", "Image ID"}) ||
		!tableRowHas(out, "cloud-q", "debian-alien", alien) {
		t.Errorf("alien-image-list table:\n%s", out)
	}
	for _, r := range decode[[]alienJSON](t, e.must(0, []string{"alien-image-list", "--json", "cloud-r"})) {
		if r.ExternalID == alien {
			t.Errorf("alien-image-list cloud-r lists cloud-q's image: %+v", r)
		}
	}
	e.must(exitUsage, []string{"alien-image-list", "nope"}, "not an openstack provider", "cloud-q, cloud-r")

	// The daemon reconciles at least once a minute: by then the deletes are done.
	gone := []string{newestR.ExternalID}
	for _, u := range oldestUps {
		gone = append(gone, u.ExternalID)
	}
	testenv.WaitFor(t, 100*time.Second, "the daemon to carry out dib-image-delete and image-delete", func() bool {
		for _, id := range gone {
			if _, err := e.cloud.Get(ctx, id); !errors.Is(err, uploader.ErrNotFound) {
				return false
			}
		}
		for _, b := range e.buildsJSON() {
			if b.BuildID == oldest.BuildID {
				return false
			}
		}
		for _, u := range e.uploadsJSON() {
			if u.BuildID == oldest.BuildID || u.ExternalID == newestR.ExternalID {
				return false
			}
		}
		files, _ := filepath.Glob(filepath.Join(imagesDir, oldest.ID+".*"))
		return len(files) == 0
	}, logs.String)
	// Only what was asked for went: the newest build and its cloud-q upload stay, and
	// its cloud-r upload is made again (it is the newest build), as nodepool does.
	if _, err := e.cloud.Get(ctx, newestQ.ExternalID); err != nil {
		t.Errorf("the newest build's cloud-q upload went too: %v", err)
	}
	if files, _ := filepath.Glob(filepath.Join(imagesDir, newest.ID+".*")); len(files) == 0 {
		t.Errorf("the newest build's files went too")
	}
	testenv.WaitFor(t, 30*time.Second, "the newest build's cloud-r upload to be made again", func() bool {
		for _, u := range e.uploadsJSON() {
			if u.BuildID == newest.BuildID && u.Provider == "cloud-r" && u.State == "ready" && u.UploadID != newestR.UploadID {
				return true
			}
		}
		return false
	}, logs.String)
}

// TestAdminRefusesWorkInProgress checks the refusals that depend on a build or an
// upload being under way, with the records made directly in the store; no cloud
// is needed because the commands only record intent.
func TestAdminRefusesWorkInProgress(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	e := &env{t: t, dir: dir, cfgPath: writeAdminConfig(t, dir, "http://127.0.0.1:9/", "unused")}
	st, raw := storetest.Open(t, store.Options{ImagesDir: filepath.Join(dir, "images")})
	defer st.Close()

	// A request made before a build started is being honoured by it.
	e.must(0, []string{"image-build", "dib-image"})
	building, err := st.CreateBuild(ctx, store.Build{Image: "dib-image", Source: store.SourceDIB})
	if err != nil {
		t.Fatal(err)
	}
	if s, _ := e.status(); s["dib-image"].BuildRequest == nil || *s["dib-image"].BuildRequest != "building" {
		t.Errorf("image-status of dib-image while it builds = %+v, want its request building", s["dib-image"])
	}
	e.must(exitFailed, []string{"dib-image-delete", building.Name()}, "being built", "dib-image-list")

	// A ready build with an upload in progress.
	b, err := st.CreateBuild(ctx, store.Build{Image: "debian", Source: store.SourceZuul})
	if err != nil {
		t.Fatal(err)
	}
	if err := raw.SetBuildState(ctx, &b, store.Ready, ""); err != nil {
		t.Fatal(err)
	}
	up, err := st.CreateUpload(ctx, &b, "cloud-q", "qcow2")
	if err != nil {
		t.Fatal(err)
	}
	del := []string{"image-delete", "--provider", "cloud-q", "--image", "debian", "--build-id", b.ID, "--upload-id", up.ID}
	e.must(exitFailed, del, "is uploading", "image-list")
	e.must(exitFailed, []string{"dib-image-delete", b.Name()}, "being uploaded to cloud-q")
	ups, err := st.Uploads(ctx, store.UploadFilter{BuildID: b.ID})
	if err != nil {
		t.Fatal(err)
	}
	if bb, err := st.Build(ctx, b.ID); err != nil || bb.State != store.Ready || len(ups) != 1 || ups[0].State != store.Uploading {
		t.Fatalf("refusals changed the records: build %+v (%v), uploads %+v", bb, err, ups)
	}

	// Once the upload is done, both are accepted, and again.
	up.State, up.ExternalID = store.Ready, "ext-1"
	if err := raw.Write(ctx, store.PutUpload(&up)); err != nil {
		t.Fatal(err)
	}
	e.must(0, del)
	e.must(0, del)
	e.must(0, []string{"dib-image-delete", b.Name()})
	e.must(0, []string{"dib-image-delete", b.Name()})
	bb, err := st.Build(ctx, b.ID)
	if err != nil {
		t.Fatal(err)
	}
	ups, err = st.Uploads(ctx, store.UploadFilter{BuildID: b.ID})
	if err != nil {
		t.Fatal(err)
	}
	if bb.State != store.Deleting || len(ups) != 1 || ups[0].State != store.Deleting {
		t.Fatalf("after the deletes: build %s, uploads %+v; want all deleting", bb.State, ups)
	}
}

// tableRowHas reports whether a row of a printed table (the one whose first cell
// is first) holds every one of cells.
func tableRowHas(out, first string, cells ...string) bool {
	for _, line := range strings.Split(out, "\n") {
		fields := strings.Split(line, "|")
		if len(fields) < 3 || strings.TrimSpace(fields[1]) != first {
			continue
		}
		var row []string
		for _, f := range fields[1 : len(fields)-1] {
			row = append(row, strings.TrimSpace(f))
		}
		ok := true
		for _, c := range cells {
			ok = ok && slices.Contains(row, c)
		}
		if ok {
			return true
		}
	}
	return false
}

// tableHeader returns the cells of a printed table's header row.
func tableHeader(out string) []string {
	lines := strings.Split(out, "\n")
	if len(lines) < 2 {
		return nil
	}
	var cells []string
	for _, f := range strings.Split(lines[1], "|") {
		if f = strings.TrimSpace(f); f != "" {
			cells = append(cells, f)
		}
	}
	return cells
}

// TestAlienImageListIncomplete: when a provider's cloud cannot be listed,
// alien-image-list prints what the other clouds listed, in the shape it
// always has, names the provider it lacks (as text, and in the JSON record
// of --log-format json), and exits 1; listing that provider alone prints an
// empty list that exits 1 too, never one that passes for "no alien images".
func TestAlienImageListIncomplete(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	// A cloud whose Glance is gone: its port is closed.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "http://" + l.Addr().String() + "/"
	l.Close()
	clouds, err := os.ReadFile(e.glance.CloudsFile)
	if err != nil {
		t.Fatal(err)
	}
	cloudsFile := filepath.Join(e.dir, "clouds.yaml")
	clouds = append(clouds, "  down:\n    auth_type: none\n    image_endpoint_override: "+down+"\n"...)
	if err := os.WriteFile(cloudsFile, clouds, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("OS_CLIENT_CONFIG_FILE", cloudsFile)
	cfg, err := os.ReadFile(e.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	withDown := strings.Replace(string(cfg), "builder:\n", "  - name: cloud-down\n    cloud: down\n    diskimages:\n      - name: debian\nbuilder:\n", 1)
	if err := os.WriteFile(e.cfgPath, []byte(withDown), 0o644); err != nil {
		t.Fatal(err)
	}
	// A first run makes the images-dir and the builder's id; its leak sweep
	// fails on the cloud that is down.
	e.once(exitFailed)
	id, err := os.ReadFile(filepath.Join(e.imagesDir(), "builder_id.txt"))
	if err != nil {
		t.Fatal(err)
	}
	alien, err := e.cloud.Create(t.Context(), uploader.ImageSpec{Name: "debian-alien", DiskFormat: "qcow2", Properties: map[string]string{
		uploader.PropBuilderID: strings.TrimSpace(string(id)), uploader.PropProvider: "cloud-q",
		uploader.PropBuildID: "0123456789abcdef", uploader.PropUploadID: "0000000001",
	}})
	if err != nil {
		t.Fatal(err)
	}
	const lacks = "alien-image-list is incomplete: the images of provider cloud-down are not in it"

	r := e.must(exitFailed, []string{"alien-image-list", "--json"}, lacks, "list images of cloud-down")
	rows := decode[[]alienJSON](t, r)
	if len(rows) != 1 || rows[0] != (alienJSON{"cloud-q", "debian-alien", alien}) {
		t.Errorf("alien-image-list --json = %+v, want cloud-q's alien image %s alone", rows, alien)
	}
	if out := e.must(exitFailed, []string{"alien-image-list"}, lacks).stdout; !tableRowHas(out, "cloud-q", "debian-alien", alien) {
		t.Errorf("alien-image-list table lacks cloud-q's alien image:\n%s", out)
	}

	r = e.must(exitFailed, []string{"--log-format", "json", "alien-image-list", "--json"})
	var rec struct {
		Msg       string   `json:"msg"`
		NotListed []string `json:"providers_not_listed"`
		Errors    []string `json:"errors"`
		ExitCode  int      `json:"exit_code"`
	}
	last := strings.TrimSpace(r.stderr)
	if i := strings.LastIndexByte(last, '\n'); i >= 0 {
		last = last[i+1:]
	}
	if err := json.Unmarshal([]byte(last), &rec); err != nil {
		t.Fatalf("the last line of stderr is no JSON record: %v\n%s", err, r.stderr)
	}
	if rec.Msg != "alien-image-list is incomplete" || !slices.Equal(rec.NotListed, []string{"cloud-down"}) ||
		len(rec.Errors) != 1 || !strings.Contains(rec.Errors[0], "list images of cloud-down") || rec.ExitCode != exitFailed {
		t.Errorf("the JSON record of the exit = %+v, want the provider not listed and its error:\n%s", rec, r.stderr)
	}
	if rows := decode[[]alienJSON](t, r); len(rows) != 1 {
		t.Errorf("alien-image-list --json with --log-format json = %+v, want cloud-q's alien image", rows)
	}

	r = e.must(exitFailed, []string{"alien-image-list", "--json", "cloud-down"}, lacks)
	if rows := decode[[]alienJSON](t, r); len(rows) != 0 {
		t.Errorf("alien-image-list --json cloud-down = %+v, want an empty list", rows)
	}
}

// TestUnpauseHintNamesTheFile: the pause of a zuul-image is lifted in its
// zuul-images entry, in nodepool-builder.yaml (nodepool.yaml in a one-file
// config); a diskimage's in nodepool.yaml.
func TestUnpauseHintNamesTheFile(t *testing.T) {
	two := &config.Config{Path: "/etc/nodepool/nodepool.yaml", BuilderPath: "/etc/nodepool/nodepool-builder.yaml",
		DiskImages: []config.DiskImage{{Name: "dib", Pause: true}}, ZuulImages: []config.ZuulImage{{Name: "zuul", Pause: true}}}
	one := *two
	one.BuilderPath = ""
	for _, tt := range []struct {
		cfg         *config.Config
		image, want string
	}{
		{two, "zuul", "set pause: false for zuul in /etc/nodepool/nodepool-builder.yaml"},
		{two, "dib", "set pause: false for dib in /etc/nodepool/nodepool.yaml"},
		{&one, "zuul", "set pause: false for zuul in /etc/nodepool/nodepool.yaml"},
	} {
		got := unpauseHint(tt.cfg, tt.image, []string{store.PausedByConfig, store.PausedByCommand})
		if want := tt.want + " and run image-unpause " + tt.image; got != want {
			t.Errorf("unpauseHint(%s, builder file %q) = %q, want %q", tt.image, tt.cfg.BuilderPath, got, want)
		}
	}
}
