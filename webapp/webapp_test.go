package webapp

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/diskimage"
	"github.com/nodepool-builder/nodepool-builder/listing"
	"github.com/nodepool-builder/nodepool-builder/progress"
	"github.com/nodepool-builder/nodepool-builder/status"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/store/storetest"
)

const testConfig = `images-dir: %s
diskimages:
  - name: dib-image
zuul-images:
  - name: debian
    api-url: http://zuul.invalid
    project: org/images
    job: build-debian
providers:
  - name: cloud-a
    cloud: a
    diskimages:
      - name: debian
      - name: dib-image
  - name: cloud-b
    cloud: b
    diskimages:
      - name: debian
`

// evil is an artifact-supplied string: it must reach the page as text.
const evil = `<script>alert("x")</script>`

type fixture struct {
	st      *store.Store
	cfg     *config.Config
	ready   store.Build
	failed  store.Build // dib-image's newest build
	tracker *progress.Tracker
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	cfg, err := config.Parse(filepath.Join(dir, "nodepool.yaml"), []byte(strings.Replace(testConfig, "%s", dir, 1)), nil)
	if err != nil {
		t.Fatal(err)
	}
	st, raw := storetest.Open(t, store.Options{ImagesDir: dir, Access: store.Create})
	t.Cleanup(func() { st.Close() })
	f := &fixture{st: st, cfg: cfg, tracker: progress.NewTracker()}

	ready, err := st.CreateBuild(ctx, store.Build{Image: "debian", Source: store.SourceZuul, Zuul: store.ZuulRef{UUID: "zb1"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := raw.SetBuildState(ctx, &ready, store.Ready, ""); err != nil {
		t.Fatal(err)
	}
	f.ready = ready
	for provider, state := range map[string]store.State{"cloud-a": store.Ready, "cloud-b": store.Failed} {
		u, err := st.CreateUpload(ctx, &f.ready, provider, "qcow2")
		if err != nil {
			t.Fatal(err)
		}
		u.SetState(state, st.Now())
		if state == store.Failed {
			u.LastError = "glance said " + evil
		} else {
			u.ExternalID = "ext-" + provider
		}
		if err := raw.Write(ctx, store.PutUpload(&u)); err != nil {
			t.Fatal(err)
		}
	}
	failed, err := st.CreateBuild(ctx, store.Build{Image: "dib-image", Source: store.SourceDIB})
	if err != nil {
		t.Fatal(err)
	}
	if err := raw.SetBuildState(ctx, &failed, store.Failed, "element failed: "+evil); err != nil {
		t.Fatal(err)
	}
	f.failed = failed
	if err := raw.Write(ctx, store.PutCursor(store.Cursor{Image: "debian", ZuulID: 7, ZuulUUID: "zb2", Outcome: "failed",
		Reason: "checksum mismatch " + evil, Time: time.Now(), Waiting: "Zuul build zb3 is not fetched: add objects " + evil})); err != nil {
		t.Fatal(err)
	}
	up := f.tracker.Start(progress.Upload, ready.Name()+" to cloud-b", 4096)
	up.Add(1024)
	t.Cleanup(up.End)
	bd := f.tracker.Start(progress.Build, "dib-image-next", 0)
	bd.SetNote("running element vm")
	t.Cleanup(bd.End)
	return f
}

func (f *fixture) server(t *testing.T, opts Options) *httptest.Server {
	opts.Store, opts.Progress = f.st, f.tracker
	opts.Config = func() *config.Config { return f.cfg }
	srv := httptest.NewServer(Handler(opts))
	t.Cleanup(srv.Close)
	return srv
}

func get(t *testing.T, url string) (int, string, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header.Get("Content-Type"), string(body)
}

func TestListings(t *testing.T) {
	f := newFixture(t)
	srv := f.server(t, Options{})

	code, ctype, body := get(t, srv.URL+"/image-list.json")
	if code != 200 || ctype != "application/json" {
		t.Fatalf("/image-list.json: %d %s", code, ctype)
	}
	var ups []listing.Upload
	if err := json.Unmarshal([]byte(body), &ups); err != nil {
		t.Fatal(err)
	}
	states := map[string]string{}
	for _, u := range ups {
		states[u.Provider] = u.State + " " + u.Reason
	}
	if len(ups) != 2 || states["cloud-a"] != "ready " || states["cloud-b"] != "failed glance said "+evil {
		t.Errorf("/image-list.json = %s", body)
	}

	code, ctype, body = get(t, srv.URL+"/dib-image-list.json")
	var builds []listing.Build
	if err := json.Unmarshal([]byte(body), &builds); err != nil || code != 200 || ctype != "application/json" {
		t.Fatalf("/dib-image-list.json: %d %s %v", code, ctype, err)
	}
	if len(builds) != 2 || builds[0].Image != "dib-image" || builds[0].State != "failed" || builds[1].ID != f.ready.Name() {
		t.Errorf("/dib-image-list.json = %s", body)
	}

	code, _, body = get(t, srv.URL+"/image-status.json")
	var status []listing.ImageJSON
	if err := json.Unmarshal([]byte(body), &status); err != nil || code != 200 {
		t.Fatalf("/image-status.json: %d %v", code, err)
	}
	if len(status) != 2 || status[1].Image != "debian" || status[1].NewestBuild == nil || *status[1].NewestBuild != f.ready.Name() ||
		status[1].LastZuulOutcome == nil || *status[1].LastZuulOutcome != "failed" {
		t.Errorf("/image-status.json = %s", body)
	}
	if next := f.failed.StateTime.Add(diskimage.DefaultFailureBackoff).Format(time.RFC3339); status[0].LastFailure == nil ||
		*status[0].LastFailure != f.failed.Name() || status[0].NextAttempt == nil || *status[0].NextAttempt != next {
		t.Errorf("/image-status.json does not show dib-image's failed build and next attempt %s: %s", next, body)
	}

	for path, want := range map[string][]string{
		"/image-list":     {"| Build ID ", "| cloud-b ", "| failed ", "glance said " + evil},
		"/dib-image-list": {"| ID ", "| " + store.BuildName("dib-image", builds[0].BuildID) + " ", "| " + f.ready.Name() + " "},
		"/image-status":   {"| Image ", "| debian ", "zb2 (failed)", "| dib-image ", "Last build failures", f.failed.Name()},
	} {
		code, ctype, body := get(t, srv.URL+path)
		if code != 200 || ctype != "text/plain; charset=utf-8" {
			t.Errorf("%s: %d %s", path, code, ctype)
		}
		if !strings.HasPrefix(body, "+--") {
			t.Errorf("%s is not a table:\n%s", path, body)
		}
		for _, w := range want {
			if !strings.Contains(body, w) {
				t.Errorf("%s lacks %q:\n%s", path, w, body)
			}
		}
	}
}

func TestPage(t *testing.T) {
	f := newFixture(t)
	srv := f.server(t, Options{})
	code, ctype, body := get(t, srv.URL+"/")
	if code != 200 || ctype != "text/html; charset=utf-8" {
		t.Fatalf("/: %d %s", code, ctype)
	}
	for _, w := range []string{
		`<meta http-equiv="refresh" content="30">`,
		`<td class="name">debian</td>`, `<td class="name">dib-image</td>`,
		f.ready.Name(), // newest ready build
		// The newest upload per provider.
		`cloud-a: <span class="state ok" title="` + f.ready.Name() + `: ext-cloud-a">ready</span>`,
		`cloud-b: <span class="state bad" title="` + f.ready.Name() + `">failed</span>`,
		`last Zuul build zb2 <span class="state bad">failed</span>`,
		"Zuul build refused", "checksum mismatch &lt;script&gt;", // the cursor's refusal
		// What Zuul's newest build waits for.
		`<span class="state bad">waiting for an artifact host</span> <span class="reason">Zuul build zb3 is not fetched: add objects &lt;script&gt;`,
		"element failed: &lt;script&gt;", // the failed build
		"glance said &lt;script&gt;",     // the failed upload
		`<progress value="1024" max="4096">`, "1.0 KiB of 4.0 KiB (25%)",
		"dib-image-next", "running element vm",
		`title="` + f.ready.StateTime.UTC().Format(time.RFC3339) + `"`,
		// The diskimage whose build failed: when, and when it is next built.
		`<span class="state bad">last build failed</span>`,
		`; next attempt <span title="` + f.failed.StateTime.Add(diskimage.DefaultFailureBackoff).UTC().Format(time.RFC3339) + `">in `,
	} {
		if !strings.Contains(body, w) {
			t.Errorf("the page lacks %q", w)
		}
	}
	if strings.Contains(body, "<script") {
		t.Errorf("the page carries a script:\n%s", body)
	}
	if code, _, _ := get(t, srv.URL+"/nothing"); code != 404 {
		t.Errorf("/nothing: %d", code)
	}
}

func TestHealthAndMetrics(t *testing.T) {
	f := newFixture(t)
	// Health reads the state, as the builder's does.
	health := func(ctx context.Context) error {
		if _, err := f.st.Cursor(ctx, "debian"); err != nil {
			return errors.New("the state does not answer: " + err.Error())
		}
		return nil
	}
	metrics := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "builds_total 2\n") })
	srv := f.server(t, Options{Health: health, Metrics: metrics})
	if code, ctype, body := get(t, srv.URL+"/healthz"); code != 200 || body != "ok\n" || ctype != "text/plain; charset=utf-8" {
		t.Errorf("/healthz: %d %s %q", code, ctype, body)
	}
	if code, _, body := get(t, srv.URL+"/metrics"); code != 200 || body != "builds_total 2\n" {
		t.Errorf("/metrics: %d %q", code, body)
	}
	if _, _, page := get(t, srv.URL+"/"); !strings.Contains(page, `<a href="metrics">metrics</a>`) {
		t.Errorf("/ does not link /metrics, which is served:\n%s", page)
	}
	f.st.Close()
	if code, _, body := get(t, srv.URL+"/healthz"); code != 503 || !strings.Contains(body, "the state does not answer") {
		t.Errorf("/healthz with the state closed: %d %q", code, body)
	}
	if code, _, body := get(t, srv.URL+"/image-list"); code != 500 || !strings.Contains(body, "state") {
		t.Errorf("/image-list with the state closed: %d %q", code, body)
	}

	bare := f.server(t, Options{})
	if _, _, page := get(t, bare.URL+"/"); strings.Contains(page, `href="metrics"`) {
		t.Errorf("/ links /metrics, which is not served:\n%s", page)
	}
	for _, p := range []string{"/healthz", "/metrics"} {
		if code, _, _ := get(t, bare.URL+p); code != 404 {
			t.Errorf("%s without its option: %d, want 404", p, code)
		}
	}
}

// degraded is a Health error that says the builder works.
type degraded string

func (d degraded) Error() string  { return string(d) }
func (d degraded) Degraded() bool { return true }

// TestHealthDegraded: a builder that works but waits for the operator is not
// plain ok, nor unhealthy.
func TestHealthDegraded(t *testing.T) {
	f := newFixture(t)
	health := func(context.Context) error { return degraded("zuul-image debian: Zuul is behind") }
	srv := f.server(t, Options{Health: health})
	if code, _, body := get(t, srv.URL+"/healthz"); code != 200 || body != "degraded: zuul-image debian: Zuul is behind\n" {
		t.Errorf("/healthz of a degraded builder: %d %q", code, body)
	}
}

func TestServeAndStop(t *testing.T) {
	f := newFixture(t)
	opts := Options{Store: f.st, Config: func() *config.Config { return f.cfg }}
	s, err := Listen("127.0.0.1:0", opts)
	if err != nil {
		t.Fatal(err)
	}
	// The port is taken: a second server cannot have it.
	addr := strings.TrimSuffix(strings.TrimPrefix(s.URL(), "http://"), "/")
	if _, err := Listen(addr, opts); err == nil || !strings.Contains(err.Error(), addr) {
		t.Errorf("Listen on a taken port = %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	if code, _, _ := get(t, s.URL()+"image-status"); code != 200 {
		t.Errorf("image-status: %d", code)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not stop with its context")
	}
	if _, err := http.Get(s.URL()); err == nil {
		t.Error("the server still answers after it stopped")
	}
}

func TestAges(t *testing.T) {
	now := time.Now()
	for d, want := range map[time.Duration]string{
		45 * time.Second:                   "45s ago",
		12*time.Minute + 3*time.Second:     "12m 3s ago",
		3*time.Hour + 20*time.Minute:       "3h 20m ago",
		50*time.Hour + 30*time.Minute:      "2d 2h ago",
		-time.Minute /* a clock behind */ : "0s ago",
	} {
		if got := at(now.Add(-d), now).Age; got != want {
			t.Errorf("age of %s = %q, want %q", d, got, want)
		}
	}
	for d, want := range map[time.Duration]string{
		7*time.Minute + 3*time.Second: "in 7m 3s",
		0:                             "due now",
		-time.Minute:                  "due now",
	} {
		if got := ahead(now.Add(d), now).Age; got != want {
			t.Errorf("time %s ahead = %q, want %q", d, got, want)
		}
	}
	if w := at(time.Time{}, now); w.Age != "unknown" || w.RFC3339 != "" {
		t.Errorf("a time not known = %+v", w)
	}
}

// TestPageZuulMQTT: with builder.zuul-mqtt, the page shows what the daemon
// last said of its listener to Zuul's MQTT reports, escaped; without the
// section it shows nothing of it.
func TestPageZuulMQTT(t *testing.T) {
	f := newFixture(t)
	srv := f.server(t, Options{})
	if _, _, body := get(t, srv.URL+"/"); strings.Contains(body, "MQTT") {
		t.Errorf("the page shows an MQTT listener the config has not")
	}
	f.cfg.Builder.ZuulMQTT = &config.ZuulMQTT{URL: "mqtt://mqtt.example.com:1883"}
	if _, _, body := get(t, srv.URL+"/"); !strings.Contains(body, "No status yet: the daemon writes it once it listens.") {
		t.Errorf("the page before the daemon wrote the listener's status:\n%s", body)
	}
	now := time.Now()
	status.NewFile(f.st, status.ZuulMQTTPart, slog.New(slog.DiscardHandler)).Save(&status.ZuulMQTT{
		Stamp: status.Stamp{PID: 7}, Listening: true, URL: "mqtt://mqtt.example.com:1883", Topics: []string{"zuul/#"},
		Connected: false, Since: now.Add(-time.Minute), LastMessage: now.Add(-time.Hour),
		LastError: "connect to mqtt://mqtt.example.com:1883: " + evil, LastErrorAt: now.Add(-time.Minute),
		Used: 5, Polls: 6, Ignored: map[string]uint64{"no-match": 9}})
	_, _, body := get(t, srv.URL+"/")
	for _, w := range []string{
		"<h2>Zuul's MQTT reports</h2>", "<td>mqtt://mqtt.example.com:1883</td>", "<td>zuul/#</td>",
		`<span class="state bad">not connected</span> since <span title="` + now.Add(-time.Minute).UTC().Format(time.RFC3339) + `">`,
		"<td>5 used (6 polls asked for); ignored: no-match 9</td>",
		`<span class="reason">connect to mqtt://mqtt.example.com:1883: &lt;script&gt;`,
	} {
		if !strings.Contains(body, w) {
			t.Errorf("the page lacks %q", w)
		}
	}
	if strings.Contains(body, "<script") {
		t.Errorf("the page carries a script:\n%s", body)
	}
}

// request sends a GET of path to the server at base with the Host header
// given, as a browser led there by another name would.
func request(t *testing.T, base, path, host string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest("GET", base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(body)
}

// TestHostChecked: a page reached through a name other than the server's own
// (DNS rebinding: a site's name made to resolve to the builder) is refused,
// on every path, /metrics and /healthz included; loopback names, any address
// (a scrape by IP, also through NAT) and the host's own name are answered.
// Every answer says nosniff.
func TestHostChecked(t *testing.T) {
	f := newFixture(t)
	metrics := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "builds_total 2\n") })
	opts := Options{Store: f.st, Config: func() *config.Config { return f.cfg }, Progress: f.tracker,
		Health: func(context.Context) error { return nil }, Metrics: metrics}
	s, err := Listen("127.0.0.1:0", opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	base := strings.TrimSuffix(s.URL(), "/")
	port := base[strings.LastIndex(base, ":"):]
	hostname, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}

	for _, host := range []string{"rebind.example.com" + port, "rebind.example.com", "localhost.example.com" + port,
		"127.0.0.1.example.com", hostname + ".example.com" + port, "0x7f.0.0.1" + port} {
		for _, path := range []string{"/", "/image-list", "/image-status.json", "/metrics", "/healthz", "/nothing"} {
			resp, body := request(t, base, path, host)
			if resp.StatusCode != http.StatusMisdirectedRequest || resp.Header.Get("Content-Type") != "text/plain; charset=utf-8" ||
				resp.Header.Get("X-Content-Type-Options") != "nosniff" || len(body) > 200 || strings.Contains(body, "debian") {
				t.Errorf("GET %s with Host %s: %d %q %q, want a short 421 refusal with nosniff", path, host, resp.StatusCode, resp.Header, body)
			}
		}
	}
	for _, host := range []string{"127.0.0.1" + port, "127.0.0.1", "localhost" + port, "LocalHost.", "[::1]" + port, "[::1]",
		"192.0.2.7:8006", "[2001:db8::7]:8006", hostname + port} {
		for path, want := range map[string]string{"/": "debian", "/image-list": "debian", "/metrics": "builds_total", "/healthz": "ok"} {
			resp, body := request(t, base, path, host)
			if resp.StatusCode != 200 || !strings.Contains(body, want) || resp.Header.Get("X-Content-Type-Options") != "nosniff" {
				t.Errorf("GET %s with Host %s: %d %q, want 200 with nosniff", path, host, resp.StatusCode, resp.Header)
			}
		}
	}
	if resp, _ := request(t, base, "/nothing", "127.0.0.1"+port); resp.StatusCode != 404 || resp.Header.Get("X-Content-Type-Options") != "nosniff" {
		t.Errorf("GET /nothing: %d %q, want 404 with nosniff", resp.StatusCode, resp.Header)
	}
}

// TestHostNames: the names in HostNames (Listen adds its listen address) are
// answered, in any case and with a final dot; a name that only begins with
// one is not.
func TestHostNames(t *testing.T) {
	f := newFixture(t)
	srv := f.server(t, Options{HostNames: []string{"builder.example.com"}})
	for host, want := range map[string]int{
		"builder.example.com:8006": 200, "Builder.Example.COM.": 200,
		"builder.example.com.rebind.example.net:8006": 421, "example.com": 421,
	} {
		if resp, _ := request(t, srv.URL, "/image-list", host); resp.StatusCode != want {
			t.Errorf("Host %s: %d, want %d", host, resp.StatusCode, want)
		}
	}
}
