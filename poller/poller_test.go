package poller

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/artifacts"
	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/source"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/store/storetest"
	"github.com/nodepool-builder/nodepool-builder/zuulapi"
	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

type fixture struct {
	t       *testing.T
	qemuImg string
	st      *store.Store
	raw     storetest.Raw // writes the records a test sets up
	cfg     *config.Config
	zuul    *zuultest.Server
	p       *Poller
	run     *source.Runner // the core's build path, as the builder runs the poller
	logs    bytes.Buffer   // the poller's log; read it once a poll has returned
}

func newFixture(t *testing.T, providerFormats ...string) *fixture {
	t.Helper()
	dir := t.TempDir()
	st, raw := storetest.Open(t, store.Options{ImagesDir: dir})
	t.Cleanup(func() { st.Close() })
	zuul := zuultest.NewServer(zuultest.ServerOptions{Tenant: "example"})
	t.Cleanup(zuul.Close)
	cfg := &config.Config{
		ImagesDir: dir,
		ZuulImages: []config.ZuulImage{{
			Name: "debian", APIURL: zuul.URL(), Tenant: "example", Project: "org/images", JobName: "build-debian",
		}},
	}
	for i, f := range providerFormats {
		cfg.Providers = append(cfg.Providers, config.Provider{
			Name: "p" + string(rune('a'+i)), ImageFormat: f, DiskImages: []config.ProviderImage{{Name: "debian"}},
		})
	}
	f := &fixture{t: t, st: st, raw: raw, cfg: cfg, zuul: zuul, qemuImg: testenv.RequireBinary(t, "qemu-img")}
	f.newPoller()
	return f
}

func (f *fixture) newPoller() {
	client, err := zuulapi.New(zuulapi.Options{APIURL: f.zuul.URL(), Tenant: "example", RetryMax: -1})
	if err != nil {
		f.t.Fatal(err)
	}
	f.p = New(Options{
		Store:  f.st,
		Config: f.cfg,
		Fetchers: map[string]*artifacts.Fetcher{
			"debian": {Attempts: 2, Backoff: time.Millisecond},
		},
		Clients: map[string]Builds{"debian": client},
		Logger:  slog.New(slog.NewTextHandler(&f.logs, nil)),
	})
	f.run = source.NewRunner(source.Options{Store: f.st, Config: func() *config.Config { return f.cfg }, Logger: f.p.log})
}

// Outcome says what one poll did.
type Outcome struct {
	Ingested *store.Build // the build made ready, if any
	Skipped  string       // why nothing was done, if nothing was
}

// poll is one step of the builder's loop on a zuul-image.
func (f *fixture) poll(ctx context.Context, image string) (Outcome, error) {
	res, err := f.run.Step(ctx, f.p, image)
	return Outcome{Ingested: res.Build, Skipped: res.Skipped}, err
}

// buildNow is an operator's request for a build of a zuul-image.
func (f *fixture) buildNow(ctx context.Context, image, request string) (store.Build, error) {
	return f.run.BuildNow(ctx, f.p, image, request, nil)
}

func meta(format string) map[string]any {
	return map[string]any{"type": "zuul_image", "format": format}
}

func (f *fixture) publish(arts ...zuultest.ArtifactSpec) zuultest.Build {
	f.t.Helper()
	b, err := f.zuul.AddBuild(zuultest.BuildSpec{Job: "build-debian", Project: "org/images", Artifacts: arts})
	if err != nil {
		f.t.Fatal(err)
	}
	return b
}

// image returns a small real image in format whose disk holds tag: the poller
// checks with qemu-img that what it fetches is what it claims.
func (f *fixture) image(format, tag string) []byte {
	f.t.Helper()
	// A raw image is at least a MiB of whole sectors; zeros cost nothing compressed.
	raw := make([]byte, 1<<20)
	copy(raw, strings.Repeat(format+" data "+tag, 1000))
	if format == "raw" {
		return raw
	}
	dir := f.t.TempDir()
	in, out := filepath.Join(dir, "in.raw"), filepath.Join(dir, "out")
	os.WriteFile(in, raw, 0o644)
	qemuFormat := map[string]string{"vhd": "vpc"}[format]
	if qemuFormat == "" {
		qemuFormat = format
	}
	if msg, err := exec.Command(f.qemuImg, "convert", "-f", "raw", "-O", qemuFormat, in, out).CombinedOutput(); err != nil {
		f.t.Fatalf("make a %s image: %v: %s", format, err, msg)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		f.t.Fatal(err)
	}
	return data
}

func (f *fixture) standard(tag string) []zuultest.ArtifactSpec {
	return []zuultest.ArtifactSpec{
		{Name: "qcow2", Data: f.image("qcow2", tag), Metadata: meta("qcow2")},
		{Name: "raw", Data: f.image("raw", tag), Compress: "zst", Metadata: meta("raw")},
		{Name: "vhd", Data: f.image("vhd", tag), Metadata: meta("vhd")},
	}
}

func TestPollFetchesOnlyNeededFormats(t *testing.T) {
	f := newFixture(t, "qcow2", "raw")
	zb := f.publish(f.standard("1")...)
	out, err := f.poll(context.Background(), "debian")
	if err != nil {
		t.Fatal(err)
	}
	if out.Ingested == nil || out.Ingested.State != store.Ready || out.Ingested.Zuul.UUID != zb.UUID {
		t.Fatalf("outcome = %+v", out)
	}
	if got := strings.Join(out.Ingested.Formats(), ","); got != "qcow2,raw" {
		t.Fatalf("formats = %s", got)
	}
	for _, a := range zb.Artifacts {
		served := f.zuul.BytesServed(a.Path)
		if (a.Name == "vhd") != (served == 0) {
			t.Errorf("artifact %s: %d bytes served", a.Name, served)
		}
	}
	raw := mustPath(f.st.FilePath("debian", out.Ingested.ID, "raw"))
	data, _ := os.ReadFile(raw)
	if !bytes.Equal(data, f.image("raw", "1")) {
		t.Fatal("raw file is not the decompressed artifact")
	}
	if sum, _ := store.ReadSidecar(raw + ".sha256"); sum != zb.Artifacts[1].SHA256 {
		t.Fatalf("sidecar sha256 %s, want %s", sum, zb.Artifacts[1].SHA256)
	}
	// Polling again finds nothing new.
	out, err = f.poll(context.Background(), "debian")
	if err != nil || out.Ingested != nil {
		t.Fatalf("second poll = %+v, %v", out, err)
	}
	// A newer build is ingested.
	f.publish(f.standard("2")...)
	out, err = f.poll(context.Background(), "debian")
	if err != nil || out.Ingested == nil {
		t.Fatalf("poll of a newer build = %+v, %v", out, err)
	}
}

// A build carries the connection settings of the zuul-image's declaration in
// nodepool.yaml, which its upload records take to nodepool-launcher.
func TestPollRecordsTheDeclaredConnection(t *testing.T) {
	f := newFixture(t, "raw")
	zi := &f.cfg.ZuulImages[0]
	zi.Username, zi.PythonPath, zi.ShellType = "debian", "/usr/bin/python3", "sh"
	f.publish(f.standard("1")...)
	out, err := f.poll(context.Background(), "debian")
	if err != nil || out.Ingested == nil {
		t.Fatalf("poll = %+v, %v", out, err)
	}
	b, err := f.st.Build(context.Background(), out.Ingested.ID)
	if err != nil {
		t.Fatal(err)
	}
	if b.Username != "debian" || b.PythonPath != "/usr/bin/python3" || b.ShellType != "sh" {
		t.Errorf("build = %+v, want username debian, python-path /usr/bin/python3, shell-type sh", b)
	}
}

func TestPollRefusesMissingFormatOnce(t *testing.T) {
	f := newFixture(t, "raw")
	zb := f.publish(zuultest.ArtifactSpec{Name: "qcow2", Data: f.image("qcow2", "x"), Metadata: meta("qcow2")})
	f.p.opts.QemuImg = "no-such-qemu-img" // conversion must not rescue it here
	f.cfg.Providers[0].ImageFormat = "tar"
	_, err := f.poll(context.Background(), "debian")
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "tar") || !strings.Contains(err.Error(), "qcow2") {
		t.Fatalf("poll error = %v", err)
	}
	builds, _ := f.st.Builds(context.Background(), store.BuildFilter{Image: "debian"})
	if len(builds) != 1 || builds[0].State != store.Failed || builds[0].Zuul.UUID != zb.UUID || builds[0].Reason == "" {
		t.Fatalf("builds = %+v", builds)
	}
	calls := len(f.zuul.BuildsCalls())
	out, err := f.poll(context.Background(), "debian")
	if err != nil || out.Ingested != nil {
		t.Fatalf("refused build polled again: %+v, %v", out, err)
	}
	if len(f.zuul.BuildsCalls()) != calls+1 {
		t.Fatal("second poll did not ask Zuul")
	}
	if n, _ := f.st.Builds(context.Background(), store.BuildFilter{Image: "debian"}); len(n) != 1 {
		t.Fatalf("refused build fetched again: %d builds", len(n))
	}
}

func TestPollTransientFailureRetriesNextPoll(t *testing.T) {
	f := newFixture(t, "qcow2")
	zb := f.publish(f.standard("1")...)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := f.poll(ctx, "debian"); err == nil {
		t.Fatal("poll with a cancelled context succeeded")
	}
	out, err := f.poll(context.Background(), "debian")
	if err != nil || out.Ingested == nil || out.Ingested.Zuul.UUID != zb.UUID {
		t.Fatalf("retry after a transient failure = %+v, %v", out, err)
	}
}

// TestPollArtifactNotFoundIsRetried: an artifact the object store refuses
// (404 here, as for an object deleted or expired; 401 and 403 alike) fails
// the poll's build with the store's answer as its reason, and does not settle
// the Zuul build: the next poll asks for it again, and a newer Zuul build is
// fetched as ever.
func TestPollArtifactNotFoundIsRetried(t *testing.T) {
	f := newFixture(t, "qcow2")
	ctx := context.Background()
	gone := f.publish(zuultest.ArtifactSpec{Name: "qcow2", Data: f.image("qcow2", "1"), Metadata: meta("qcow2"),
		Publish: func(url string) string { return url + "-deleted" }})
	for i := 1; i <= 2; i++ {
		out, err := f.poll(ctx, "debian")
		if err == nil || errors.Is(err, ErrRefused) || out.Ingested != nil || !strings.Contains(err.Error(), "server returned 404 Not Found") {
			t.Fatalf("poll %d of a build whose artifact is gone = %+v, %v; want a failure saying what the server answered, not a refusal", i, out, err)
		}
		builds, _ := f.st.Builds(ctx, store.BuildFilter{Image: "debian"})
		failed := 0
		for _, b := range builds {
			if b.State == store.Failed && b.Zuul.UUID == gone.UUID && strings.Contains(b.Reason, "server returned 404 Not Found") {
				failed++
			}
		}
		if failed != i {
			t.Fatalf("after poll %d: builds %+v; want %d failed, their reason the server's answer", i, builds, i)
		}
		if cur, _ := f.st.Cursor(ctx, "debian"); cur.ZuulUUID == gone.UUID {
			t.Fatalf("after poll %d the cursor settled the Zuul build: %+v", i, cur)
		}
	}
	newer := f.publish(f.standard("2")...)
	out, err := f.poll(ctx, "debian")
	if err != nil || out.Ingested == nil || out.Ingested.Zuul.UUID != newer.UUID {
		t.Fatalf("poll after a newer Zuul build = %+v, %v; want it fetched", out, err)
	}
}

func TestPollChecksumMismatchRefused(t *testing.T) {
	f := newFixture(t, "qcow2")
	m := meta("qcow2")
	m["sha256"] = strings.Repeat("a", 64)
	zb := f.publish(zuultest.ArtifactSpec{Name: "qcow2", Data: f.image("qcow2", "data"), Metadata: m})
	_, err := f.poll(context.Background(), "debian")
	if !errors.Is(err, ErrRefused) || !errors.Is(err, artifacts.ErrChecksum) {
		t.Fatalf("poll error = %v", err)
	}
	requests := len(f.zuul.ArtifactRequests(zb.Artifacts[0].Path))
	f.poll(context.Background(), "debian")
	if len(f.zuul.ArtifactRequests(zb.Artifacts[0].Path)) != requests {
		t.Fatal("a build with a bad checksum was fetched again")
	}
	matches, _ := filepath.Glob(filepath.Join(f.cfg.ImagesDir, "debian-*"))
	if len(matches) != 0 {
		t.Fatalf("files of the refused build left: %v", matches)
	}
}

func TestPollRequireChecksum(t *testing.T) {
	f := newFixture(t, "qcow2")
	f.cfg.ZuulImages[0].RequireChecksum = true
	m := meta("qcow2")
	m["sha256"] = "" // published without a checksum
	f.publish(zuultest.ArtifactSpec{Name: "qcow2", Data: f.image("qcow2", "data"), Metadata: m})
	_, err := f.poll(context.Background(), "debian")
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "require-checksum") {
		t.Fatalf("poll error = %v", err)
	}
}

func TestPollFetchesFormatNeededLater(t *testing.T) {
	f := newFixture(t, "qcow2")
	zb := f.publish(f.standard("1")...)
	out, err := f.poll(context.Background(), "debian")
	if err != nil {
		t.Fatal(err)
	}
	id := out.Ingested.ID
	f.cfg.Providers = append(f.cfg.Providers, config.Provider{Name: "new", ImageFormat: "raw", DiskImages: []config.ProviderImage{{Name: "debian"}}})
	out, err = f.poll(context.Background(), "debian")
	if err != nil || out.Ingested == nil || out.Ingested.ID != id {
		t.Fatalf("poll after adding a raw provider = %+v, %v", out, err)
	}
	if got := strings.Join(out.Ingested.Formats(), ","); got != "qcow2,raw" {
		t.Fatalf("formats = %s", got)
	}
	if f.zuul.BytesServed(zb.Artifacts[0].Path) != zb.Artifacts[0].ServedSize {
		t.Fatal("qcow2 downloaded twice")
	}
}

// TestPollRefusalOfALaterFormatIsKept: a format needed after the build was
// ingested whose file is refused is recorded on the build and not fetched again.
func TestPollRefusalOfALaterFormatIsKept(t *testing.T) {
	f := newFixture(t, "qcow2")
	arts := f.standard("1")
	arts[1].Metadata["sha256"] = strings.Repeat("b", 64) // the raw does not match
	zb := f.publish(arts...)
	if _, err := f.poll(context.Background(), "debian"); err != nil {
		t.Fatal(err)
	}
	f.cfg.Providers = append(f.cfg.Providers, config.Provider{Name: "new", ImageFormat: "raw", DiskImages: []config.ProviderImage{{Name: "debian"}}})
	_, err := f.poll(context.Background(), "debian")
	if !errors.Is(err, ErrRefused) || !errors.Is(err, artifacts.ErrChecksum) {
		t.Fatalf("poll of a raw that does not match: %v", err)
	}
	raw := zb.Artifacts[1].Path
	requests := len(f.zuul.ArtifactRequests(raw))
	for range 2 {
		out, err := f.poll(context.Background(), "debian")
		if err != nil || !strings.Contains(out.Skipped, "refused") {
			t.Fatalf("poll after the refusal = %+v, %v", out, err)
		}
	}
	if n := len(f.zuul.ArtifactRequests(raw)); n != requests {
		t.Fatalf("the refused raw was requested again: %d requests, then %d", requests, n)
	}
	builds, _ := f.st.Builds(context.Background(), store.BuildFilter{Image: "debian", State: store.Ready})
	if len(builds) != 1 || !strings.Contains(builds[0].Refused["raw"], "checksum") {
		t.Fatalf("the refusal is not recorded on the build: %+v", builds)
	}
}

// TestPollPassesOverUnmergedChanges: the newest build of a change is passed over
// for the newest build of merged code, unless the zuul-image allows changes.
func TestPollPassesOverUnmergedChanges(t *testing.T) {
	f := newFixture(t, "qcow2")
	merged, err := f.zuul.AddBuild(zuultest.BuildSpec{Job: "build-debian", Project: "org/images", Pipeline: "post", Artifacts: f.standard("1")})
	if err != nil {
		t.Fatal(err)
	}
	change, err := f.zuul.AddBuild(zuultest.BuildSpec{Job: "build-debian", Project: "org/images", Pipeline: "check", Change: 99,
		Patchset: "2", Artifacts: f.standard("2")})
	if err != nil {
		t.Fatal(err)
	}
	out, err := f.poll(context.Background(), "debian")
	if err != nil || out.Ingested == nil || out.Ingested.Zuul.UUID != merged.UUID {
		t.Fatalf("poll = %+v, %v; want the merged build %s", out, err, merged.UUID)
	}
	f.cfg.ZuulImages[0].AllowUnmergedChanges = true
	out, err = f.poll(context.Background(), "debian")
	if err != nil || out.Ingested == nil || out.Ingested.Zuul.UUID != change.UUID {
		t.Fatalf("poll with allow-unmerged-changes = %+v, %v; want the change's build %s", out, err, change.UUID)
	}
	// Only changes: nothing to fetch, and the reason says what to do.
	g := newFixture(t, "qcow2")
	if _, err := g.zuul.AddBuild(zuultest.BuildSpec{Job: "build-debian", Project: "org/images", Pipeline: "check", Change: 7, Artifacts: g.standard("3")}); err != nil {
		t.Fatal(err)
	}
	out, err = g.poll(context.Background(), "debian")
	if err != nil || out.Ingested != nil || !strings.Contains(out.Skipped, "allow-unmerged-changes") {
		t.Fatalf("poll of changes only = %+v, %v", out, err)
	}
}

// TestPollSkipsAnswersNotAskedFor: a hostile Zuul answers every build whatever
// the poll asks; the newest is, each time in another way, not what was asked.
// It is skipped, and logged with its uuid escaped; the build behind it that is
// what was asked is fetched.
func TestPollSkipsAnswersNotAskedFor(t *testing.T) {
	for _, tt := range []struct {
		name string
		bad  func(*zuultest.BuildSpec)
		says string
	}{
		{"another project", func(b *zuultest.BuildSpec) { b.Project = "org/evil" }, `project \"org/evil\" is not \"org/images\"`},
		{"another job", func(b *zuultest.BuildSpec) { b.Job = "build-evil" }, `job \"build-evil\" is not \"build-debian\"`},
		{"FAILURE", func(b *zuultest.BuildSpec) { b.Result = "FAILURE" }, `result \"FAILURE\" is not \"SUCCESS\"`},
		{"final false", func(b *zuultest.BuildSpec) { b.NonFinal = true }, "not final"},
		{"another pipeline", func(b *zuultest.BuildSpec) { b.Pipeline = "check" }, `pipeline \"check\" is not one of`},
		{"another branch", func(b *zuultest.BuildSpec) { b.Branch = "stable" }, `branch \"stable\" is not \"master\"`},
		{"a uuid that is not hex", func(b *zuultest.BuildSpec) { b.UUID = "0123456789abcdef0123456789abcdef\x1b[2J\nforged" },
			`zuul_build="0123456789abcdef0123456789abcdef\x1b[2J\nforged"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, "qcow2")
			f.cfg.ZuulImages[0].Pipelines = []string{"periodic", "post"}
			f.cfg.ZuulImages[0].Branch = "master"
			f.zuul.SetIgnoreFilters(true)
			spec := func(tag string) zuultest.BuildSpec {
				return zuultest.BuildSpec{Job: "build-debian", Project: "org/images", Pipeline: "post", Branch: "master",
					Artifacts: []zuultest.ArtifactSpec{{Name: "qcow2", Data: f.image("qcow2", tag), Metadata: meta("qcow2")}}}
			}
			good, err := f.zuul.AddBuild(spec("good"))
			if err != nil {
				t.Fatal(err)
			}
			badSpec := spec("bad")
			tt.bad(&badSpec)
			bad, err := f.zuul.AddBuild(badSpec)
			if err != nil {
				t.Fatal(err)
			}
			out, err := f.poll(context.Background(), "debian")
			if err != nil || out.Ingested == nil || out.Ingested.Zuul.UUID != good.UUID {
				t.Fatalf("poll = %+v, %v; want the build asked for, %s\n%s", out, err, good.UUID, f.logs.String())
			}
			if n := f.zuul.BytesServed(bad.Artifacts[0].Path); n != 0 {
				t.Errorf("%d bytes of the build not asked for were fetched", n)
			}
			logs := f.logs.String()
			if !strings.Contains(logs, "skipping a build Zuul answered") || !strings.Contains(logs, tt.says) {
				t.Errorf("the log does not say the build was skipped for %s:\n%s", tt.says, logs)
			}
			if strings.Contains(logs, "\x1b") {
				t.Errorf("the log holds a raw escape:\n%q", logs)
			}
		})
	}
}

func TestPollConvertsUnpublishedFormat(t *testing.T) {
	qemuImg := testenv.RequireBinary(t, "qemu-img")
	f := newFixture(t, "raw")
	f.p.opts.QemuImg = qemuImg
	dir := t.TempDir()
	src := filepath.Join(dir, "disk.qcow2")
	if out, err := exec.Command(qemuImg, "create", "-f", "qcow2", src, "4M").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	f.publish(zuultest.ArtifactSpec{Name: "qcow2", Path: src, Metadata: meta("qcow2")})
	out, err := f.poll(context.Background(), "debian")
	if err != nil {
		t.Fatal(err)
	}
	raw, ok := out.Ingested.File("raw")
	if !ok || raw.Size != 4<<20 || raw.SHA256 == "" {
		t.Fatalf("converted raw = %+v (ok=%v)", raw, ok)
	}
	info, err := exec.Command(qemuImg, "info", "--output=json", mustPath(f.st.FilePath("debian", out.Ingested.ID, "raw"))).Output()
	if err != nil || !strings.Contains(string(info), `"format": "raw"`) {
		t.Fatalf("qemu-img info: %s %v", info, err)
	}
}

func TestPollPausedAndUnneeded(t *testing.T) {
	f := newFixture(t) // no provider lists the image
	f.publish(f.standard("1")...)
	out, err := f.poll(context.Background(), "debian")
	if err != nil || out.Ingested != nil || out.Skipped == "" {
		t.Fatalf("poll of an image nobody needs = %+v, %v", out, err)
	}
	f.cfg.ZuulImages[0].Formats = []string{"qcow2"}
	f.cfg.ZuulImages[0].Pause = true
	out, err = f.poll(context.Background(), "debian")
	if err != nil || out.Ingested != nil || out.Skipped != "paused" {
		t.Fatalf("poll of a paused image = %+v, %v", out, err)
	}
	f.cfg.ZuulImages[0].Pause = false
	f.st.SetPaused(context.Background(), "debian", true) // image-pause
	out, err = f.poll(context.Background(), "debian")
	if err != nil || out.Ingested != nil || out.Skipped != "paused" {
		t.Fatalf("poll of an image paused with image-pause = %+v, %v", out, err)
	}
	f.st.SetPaused(context.Background(), "debian", false)
	out, err = f.poll(context.Background(), "debian")
	if err != nil || out.Ingested == nil || strings.Join(out.Ingested.Formats(), ",") != "qcow2" {
		t.Fatalf("poll of an image with its own formats = %+v, %v", out, err)
	}
}

// TestBuildNow: an operator's request returns the build of Zuul's newest
// build, fetched now or fetched before, and says why when there is none.
func TestBuildNow(t *testing.T) {
	f := newFixture(t, "qcow2")
	ctx := context.Background()
	if _, err := f.buildNow(ctx, "debian", "r1"); err == nil || !strings.Contains(err.Error(), "no successful build") {
		t.Fatalf("BuildNow with no Zuul build = %v, want it to say Zuul has none", err)
	}
	zb := f.publish(f.standard("1")...)
	b, err := f.buildNow(ctx, "debian", "r1")
	if err != nil || b.State != store.Ready || b.Zuul.UUID != zb.UUID || b.Request != "r1" {
		t.Fatalf("BuildNow = %+v, %v; want the ready build of %s for request r1", b, err, zb.UUID)
	}
	again, err := f.buildNow(ctx, "debian", "r2")
	if err != nil || again.ID != b.ID {
		t.Fatalf("BuildNow with nothing new = %+v, %v; want build %s", again, err, b.ID)
	}
	if n, _ := f.st.Builds(ctx, store.BuildFilter{Image: "debian"}); len(n) != 1 {
		t.Fatalf("%d builds after asking twice, want 1", len(n))
	}
	// A refused newest build: the refusal is the answer.
	m := meta("qcow2")
	m["sha256"] = strings.Repeat("a", 64)
	bad := f.publish(zuultest.ArtifactSpec{Name: "qcow2", Data: f.image("qcow2", "2"), Metadata: m})
	if _, err := f.buildNow(ctx, "debian", ""); err == nil {
		t.Fatal("BuildNow of a corrupt Zuul build succeeded")
	}
	_, err = f.buildNow(ctx, "debian", "")
	if err == nil || !strings.Contains(err.Error(), bad.UUID) || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("BuildNow after the refusal = %v, want it to name %s as refused", err, bad.UUID)
	}
	f.st.SetPaused(ctx, "debian", true)
	if _, err := f.buildNow(ctx, "debian", ""); err == nil || !strings.Contains(err.Error(), "paused") {
		t.Fatalf("BuildNow of a paused image = %v", err)
	}
}

// TestPollLogsOffQueryAnswersBounded: a hostile Zuul answers, to a poll,
// more builds than the query's limit, none of those within it what was
// asked, each with a project of 64 KiB. The builds beyond the limit are not
// looked at, though one of them is what was asked; a few of the others are
// logged, with their fields clipped, and the rest counted in one line.
func TestPollLogsOffQueryAnswersBounded(t *testing.T) {
	f := newFixture(t, "qcow2")
	f.zuul.SetIgnoreFilters(true)
	f.zuul.SetIgnoreLimit(true)
	beyond, err := f.zuul.AddBuild(zuultest.BuildSpec{Job: "build-debian", Project: "org/images",
		Artifacts: []zuultest.ArtifactSpec{{Name: "qcow2", Data: f.image("qcow2", "beyond"), Metadata: meta("qcow2")}}})
	if err != nil {
		t.Fatal(err)
	}
	huge := strings.Repeat("p", 64<<10)
	for range mergedWindow + 10 {
		if _, err := f.zuul.AddBuild(zuultest.BuildSpec{Job: "build-debian", Project: huge}); err != nil {
			t.Fatal(err)
		}
	}
	out, err := f.poll(context.Background(), "debian")
	if err != nil || out.Ingested != nil {
		t.Fatalf("poll = %+v, %v; want nothing fetched: the build asked for is beyond the limit", out, err)
	}
	if n := f.zuul.BytesServed(beyond.Artifacts[0].Path); n != 0 {
		t.Errorf("%d bytes of the build beyond the limit were fetched", n)
	}
	logs := f.logs.String()
	if n := strings.Count(logs, "skipping a build Zuul answered that is not one asked for"); n != maxLoggedSkips {
		t.Errorf("%d builds logged one by one, want %d", n, maxLoggedSkips)
	}
	if !strings.Contains(logs, "skipped=20") || !strings.Contains(logs, "answered=31 limit=20") {
		t.Errorf("the log does not count the builds skipped (20) and those beyond the limit (31 answered, 20 looked at)")
	}
	if len(logs) > 8<<10 {
		t.Errorf("the log of one poll is %d bytes, want it bounded (under 8 KiB):\n%.3000s", len(logs), logs)
	}
}
