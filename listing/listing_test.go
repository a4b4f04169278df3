package listing

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/diskimage"
	"github.com/nodepool-builder/nodepool-builder/source"
	"github.com/nodepool-builder/nodepool-builder/status"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/store/storetest"
)

func TestShorten(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"  spaces\n and\tlines ", 20, "spaces and lines"},
		{"upload debian to cloud-a: connection refused", 20, "upload...ion refused"},
	} {
		if got := Shorten(tc.in, tc.n); got != tc.want || len([]rune(got)) > tc.n {
			t.Errorf("Shorten(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}

func TestAge(t *testing.T) {
	got := Age(time.Now().Add(-(26*time.Hour + 3*time.Minute + 4*time.Second)))
	if got != "01:02:03:04" && got != "01:02:03:05" {
		t.Errorf("Age = %q, want 01:02:03:04", got)
	}
	if got := Age(time.Now().Add(time.Hour)); got != "00:00:00:00" {
		t.Errorf("Age of a time to come = %q", got)
	}
}

func TestTable(t *testing.T) {
	tb := Table{Header: []string{"A", "Long header"}}
	tb.Add("wide cell", "x")
	var b bytes.Buffer
	tb.Write(&b)
	want := `+-----------+-------------+
| A         | Long header |
+-----------+-------------+
| wide cell | x           |
+-----------+-------------+
`
	if b.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", b.String(), want)
	}
}

// statusImages are the images of the image-status tests: a paused diskimage,
// another, and a zuul-image.
const statusImages = `diskimages:
  - name: dib-image
    pause: true
  - name: other
zuul-images:
  - name: debian
    api-url: http://zuul.invalid
    project: org/images
    job: build-debian
`

// TestImageStatus checks the rows' reading: pauses from both places, a
// request pending until a build started after it runs, the newest ready build.
func TestImageStatus(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	cfg, st, raw := openState(t, dir, statusImages)
	mk := func(image string, state store.State) store.Build {
		b, err := st.CreateBuild(ctx, store.Build{Image: image, Source: store.SourceDIB})
		if err != nil {
			t.Fatal(err)
		}
		if state != store.Building {
			if err := raw.SetBuildState(ctx, &b, state, ""); err != nil {
				t.Fatal(err)
			}
		}
		return b
	}
	mk("other", store.Ready)
	newest := mk("other", store.Ready)
	mk("other", store.Failed)
	if err := st.SetPaused(ctx, "dib-image", true); err != nil {
		t.Fatal(err)
	}
	if err := st.RequestBuild(ctx, "other"); err != nil {
		t.Fatal(err)
	}
	if err := raw.Write(ctx, store.PutCursor(store.Cursor{Image: "debian", ZuulUUID: "zb1", Outcome: "failed", Reason: "bad checksum"})); err != nil {
		t.Fatal(err)
	}

	images, err := ImageStatus(ctx, st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(images) != 3 || images[0].Name != "dib-image" || images[1].Name != "other" || images[2].Name != "debian" {
		t.Fatalf("images = %+v", images)
	}
	if got := strings.Join(images[0].PausedBy, ","); got != store.PausedByConfig+","+store.PausedByCommand {
		t.Errorf("dib-image paused by %q", got)
	}
	if images[1].Newest == nil || images[1].Newest.ID != newest.ID || images[1].RequestState() != "pending" {
		t.Errorf("other: newest %v, request %q", images[1].Newest, images[1].RequestState())
	}
	j := images[2].JSON()
	if j.Source != "zuul" || j.LastZuulReason == nil || *j.LastZuulReason != "bad checksum" || j.NewestBuild != nil || j.PausedBy == nil {
		t.Errorf("debian = %+v", j)
	}

	mk("other", store.Building) // started after the request
	if images, err = ImageStatus(ctx, st, cfg); err != nil || images[1].RequestState() != "building" {
		t.Errorf("other with a build started after its request: %q, %v", images[1].RequestState(), err)
	}
	var b bytes.Buffer
	WriteImageStatus(&b, images)
	for _, w := range []string{"| dib-image | True ", "config,image-pause", "| " + newest.Name() + " |", "zb1 (failed)"} {
		if !strings.Contains(b.String(), w) {
			t.Errorf("image-status table lacks %q:\n%s", w, b.String())
		}
	}
}

// TestImageStatusLastFailure: a diskimage whose newest build failed shows the
// failure, its build log and when it is next built; a paused image or one with
// a pending request has no next attempt, and a later ready build, or a build
// the builder stopped, shows no failure.
func TestImageStatusLastFailure(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	logs := filepath.Join(dir, "logs")
	cfg, st, raw := openState(t, dir, `build-log-dir: `+logs+`
diskimages:
  - name: failed
  - name: nolog
  - name: paused
    pause: true
  - name: requested
  - name: mended
  - name: stopped
zuul-images:
  - name: zuul
    api-url: http://zuul.invalid
    project: org/images
    job: build-zuul
`)
	if err := os.MkdirAll(logs, 0o755); err != nil {
		t.Fatal(err)
	}
	mk := func(image string, state store.State, reason string, log bool) store.Build {
		t.Helper()
		b, err := st.CreateBuild(ctx, store.Build{Image: image, Source: store.SourceDIB})
		if err != nil {
			t.Fatal(err)
		}
		if err := raw.SetBuildState(ctx, &b, state, reason); err != nil {
			t.Fatal(err)
		}
		if log {
			if err := os.WriteFile(filepath.Join(logs, b.Name()+".log"), []byte("Exit code: 1\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return b
	}
	failed := map[string]store.Build{}
	for _, image := range []string{"failed", "paused", "requested"} {
		failed[image] = mk(image, store.Failed, "disk-image-create exited with code 1", true)
	}
	failed["nolog"] = mk("nolog", store.Failed, "create build log dir: permission denied", false)
	mk("mended", store.Failed, "exited with code 1", true)
	mk("mended", store.Ready, "", false)
	mk("stopped", store.Failed, source.InterruptedReason, true)
	mk("zuul", store.Failed, "checksum mismatch", false)
	if err := st.RequestBuild(ctx, "requested"); err != nil {
		t.Fatal(err)
	}

	images, err := ImageStatus(ctx, st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]ImageJSON{}
	for _, r := range ImagesJSON(images) {
		rows[r.Image] = r
	}
	str := func(p *string) string {
		if p == nil {
			return "<null>"
		}
		return *p
	}
	for _, tc := range []struct {
		image, log string
		next       bool
	}{
		{"failed", filepath.Join(logs, failed["failed"].Name()+".log"), true},
		{"nolog", "<null>", true},
		{"paused", filepath.Join(logs, failed["paused"].Name()+".log"), false},
		{"requested", filepath.Join(logs, failed["requested"].Name()+".log"), false},
	} {
		r, b := rows[tc.image], failed[tc.image]
		next := "<null>"
		if tc.next {
			next = b.StateTime.Add(diskimage.DefaultFailureBackoff).Format(time.RFC3339)
		}
		if str(r.LastFailure) != b.Name() || str(r.LastFailureTime) != b.StateTime.Format(time.RFC3339) ||
			str(r.LastFailureReason) != b.Reason || str(r.LastFailureLog) != tc.log || str(r.NextAttempt) != next {
			t.Errorf("%s: last failure %s at %s (%s), log %s, next attempt %s; want %s at %s (%s), log %s, next attempt %s", tc.image,
				str(r.LastFailure), str(r.LastFailureTime), str(r.LastFailureReason), str(r.LastFailureLog), str(r.NextAttempt),
				b.Name(), b.StateTime.Format(time.RFC3339), b.Reason, tc.log, next)
		}
	}
	for _, image := range []string{"mended", "stopped", "zuul"} {
		if r := rows[image]; r.LastFailure != nil || r.LastFailureLog != nil || r.NextAttempt != nil {
			t.Errorf("%s shows a failure: %+v", image, r)
		}
	}

	var out bytes.Buffer
	WriteImageStatus(&out, images)
	if !slices.Contains(strings.Fields(strings.SplitN(out.String(), "\n", 3)[1]), "Attempt") {
		t.Errorf("image-status table has no Next Attempt column:\n%s", out.String())
	}
	next := failed["failed"].StateTime.Add(diskimage.DefaultFailureBackoff).Format(time.RFC3339)
	for _, w := range []string{next, "Last build failures", failed["failed"].Name(), filepath.Join(logs, failed["failed"].Name()+".log"),
		"disk-image-create exited with code 1", "| nolog", "(none)"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("image-status text lacks %q:\n%s", w, out.String())
		}
	}
}

// TestTablesEscapeControlCharacters: what the state holds from outside and
// the store does not check (a cloud's error, a failure's reason, a Zuul
// build's refusal) is printed with its control characters escaped, in every
// table: nothing clears the screen or starts a line of its own. (Names, ids
// and uuids with control characters are refused as the store reads them.)
func TestTablesEscapeControlCharacters(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	cfg, st, raw := openState(t, dir, statusImages)
	const evil = "\x1b[2J\nforged line \u009b31m"
	b, err := st.CreateBuild(ctx, store.Build{Image: "other", Source: store.SourceDIB})
	if err != nil {
		t.Fatal(err)
	}
	if err := raw.SetBuildState(ctx, &b, store.Failed, "exited: "+evil); err != nil {
		t.Fatal(err)
	}
	z, err := st.CreateBuild(ctx, store.Build{Image: "debian", Source: store.SourceZuul})
	if err != nil {
		t.Fatal(err)
	}
	if err := raw.SetBuildState(ctx, &z, store.Ready, ""); err != nil {
		t.Fatal(err)
	}
	u, err := st.CreateUpload(ctx, &z, "cloud", "qcow2")
	if err != nil {
		t.Fatal(err)
	}
	u.SetState(store.Failed, time.Now())
	u.ExternalName, u.ExternalID, u.LastError = "name", "id", "glance said "+evil
	if err := raw.Write(ctx, store.PutUpload(&u), store.PutCursor(store.Cursor{Image: "debian", ZuulID: 1,
		ZuulUUID: "0123", Outcome: "failed", Reason: "refused: " + evil})); err != nil {
		t.Fatal(err)
	}

	var out bytes.Buffer
	ups, err := Uploads(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	WriteUploads(&out, ups)
	builds, err := Builds(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	WriteBuilds(&out, builds)
	images, err := ImageStatus(ctx, st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	WriteImageStatus(&out, images)
	text := out.String()
	for i, r := range text {
		if r != '\n' && (r < ' ' || r == 0x7f || r >= 0x80 && r < 0xa0) {
			t.Fatalf("the tables hold %U at %d:\n%q", r, i, text)
		}
	}
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "forged") {
			t.Errorf("a line of the tables is forged: %q", line)
		}
	}
	// Reasons are shortened, their runs of white space made one space.
	for _, w := range []string{`glance said \x1b[2J forged line \u009b31m`, `exited: \x1b[2J forged line \u009b31m`} {
		if !strings.Contains(text, w) {
			t.Errorf("the tables do not show %q:\n%s", w, text)
		}
	}
}

// openState parses a config of the images-dir dir with the given keys, and
// opens its store, closed when the test ends, with its backend.
func openState(t *testing.T, dir, keys string) (*config.Config, *store.Store, storetest.Raw) {
	t.Helper()
	cfg, err := config.Parse(filepath.Join(dir, "nodepool.yaml"), []byte("images-dir: "+dir+"\n"+keys), nil)
	if err != nil {
		t.Fatal(err)
	}
	st, raw := storetest.Open(t, store.Options{ImagesDir: dir, Access: store.Create})
	t.Cleanup(func() { st.Close() })
	return cfg, st, raw
}

// TestImageStatusZuulBehind: a zuul-image whose Zuul is behind its poll
// cursor says so, in the table, under it with what to do, and in JSON.
func TestImageStatusZuulBehind(t *testing.T) {
	ctx := context.Background()
	cfg, st, raw := openState(t, t.TempDir(), statusImages)
	if err := raw.Write(ctx, store.PutCursor(store.Cursor{Image: "debian", ZuulID: 1000, ZuulUUID: "zb1", Outcome: "ready",
		BehindID: 7})); err != nil {
		t.Fatal(err)
	}
	images, err := ImageStatus(ctx, st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	j := images[2].JSON()
	if j.LastZuulID == nil || *j.LastZuulID != 1000 || j.ZuulBehindID == nil || *j.ZuulBehindID != 7 {
		t.Errorf("debian = %+v; want last_zuul_id 1000, zuul_behind_id 7", j)
	}
	var b bytes.Buffer
	WriteImageStatus(&b, images)
	for _, w := range []string{"zb1 (ready) Zuul behind", "Zuul behind the poll cursor", "zuul-cursor-reset <image>",
		"| debian | zb1          | 1000      | 7 "} {
		if !strings.Contains(b.String(), w) {
			t.Errorf("image-status table lacks %q:\n%s", w, b.String())
		}
	}

	// Not behind: nothing said.
	if err := raw.Write(ctx, store.PutCursor(store.Cursor{Image: "debian", ZuulID: 1000, ZuulUUID: "zb1", Outcome: "ready"})); err != nil {
		t.Fatal(err)
	}
	images, _ = ImageStatus(ctx, st, cfg)
	if j := images[2].JSON(); j.ZuulBehindID != nil {
		t.Errorf("debian not behind: zuul_behind_id %d", *j.ZuulBehindID)
	}
	b.Reset()
	WriteImageStatus(&b, images)
	if strings.Contains(b.String(), "behind") {
		t.Errorf("image-status of a cursor not behind says it is:\n%s", b.String())
	}
}

// TestImageStatusWaitingForHost: a zuul-image whose newest Zuul build waits
// for an artifact host says so, in the table, under it, and in JSON, before
// any Zuul build was settled too.
func TestImageStatusWaitingForHost(t *testing.T) {
	ctx := context.Background()
	cfg, st, raw := openState(t, t.TempDir(), statusImages)
	const why = "Zuul build zb2 is not fetched: add objects.example.com to the zuul-image's artifact-hosts"
	if err := raw.Write(ctx, store.PutCursor(store.Cursor{Image: "debian", Waiting: why})); err != nil {
		t.Fatal(err)
	}
	images, err := ImageStatus(ctx, st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	j := images[2].JSON()
	if j.ZuulWaiting == nil || *j.ZuulWaiting != why || j.LastZuulBuild != nil || j.LastZuulOutcome != nil {
		t.Errorf("debian = %+v; want zuul_waiting, and no Zuul build settled", j)
	}
	var b bytes.Buffer
	WriteImageStatus(&b, images)
	for _, w := range []string{"waiting for a host", "Zuul builds waiting for an artifact host", "| debian | " + why} {
		if !strings.Contains(b.String(), w) {
			t.Errorf("image-status table lacks %q:\n%s", w, b.String())
		}
	}
}

// TestImageStatusZuulMQTT: with builder.zuul-mqtt, image-status shows what the
// daemon last said of its listener: the broker, the connection, the last
// message and error, the messages used and ignored by reason; a status the
// daemon no longer keeps says so; without the section nothing is shown.
func TestImageStatusZuulMQTT(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	cfg, st, _ := openState(t, dir, statusImages+"builder:\n  zuul-mqtt:\n    url: mqtts://mqtt.example.com\n")
	images, err := ImageStatus(ctx, st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	text := func(cfg *config.Config) string {
		var b bytes.Buffer
		if err := WriteImageStatusText(&b, st, cfg, images); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	if got := text(cfg); !strings.Contains(got, "Zuul MQTT reports: no status yet") {
		t.Errorf("image-status before the daemon wrote a status:\n%s", got)
	}

	now := time.Now()
	s := status.ZuulMQTT{Stamp: status.Stamp{PID: 42}, Listening: true, URL: "mqtts://mqtt.example.com:8883",
		Topics: []string{"zuul/#", "ci/+/post/#"}, Connected: true, Since: now.Add(-time.Hour), LastMessage: now.Add(-5 * time.Second),
		LastError: "connection to mqtts://mqtt.example.com:8883 lost: EOF\x1b[2J", LastErrorAt: now.Add(-2 * time.Hour),
		Used: 3, Polls: 4, Ignored: map[string]uint64{"no-match": 7, "malformed": 1, "backlog": 0}}
	f := status.NewFile(st, status.ZuulMQTTPart, slog.New(slog.DiscardHandler))
	f.Save(&s)
	got := text(cfg)
	for _, want := range []string{
		"Zuul MQTT reports (daemon pid 42, 3 messages used, 4 polls asked for):",
		"| mqtts://mqtt.example.com:8883 | zuul/# ci/+/post/# | yes       | 00:01:00:0",
		"| 00:00:00:0",
		"| 3    | malformed 1, no-match 7 | connection to mqtts://mqtt.example.com:8883 lost: EOF\\x1b[2J | 00:02:00:0",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("image-status does not say %q:\n%s", want, got)
		}
	}

	s.Listening = false
	f.Save(&s)
	if got := text(cfg); !strings.Contains(got, "Zuul MQTT reports: the daemon is not listening; what it last said") ||
		!strings.Contains(got, "| no        |") {
		t.Errorf("image-status of a daemon that stopped listening:\n%s", got)
	}
	cfg.Builder.ZuulMQTT = nil
	if got := text(cfg); strings.Contains(got, "MQTT") {
		t.Errorf("image-status without builder.zuul-mqtt shows the listener:\n%s", got)
	}
}
