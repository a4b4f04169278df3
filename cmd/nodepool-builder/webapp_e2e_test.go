package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/metrics/metricstest"
	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

// ageRE matches the Age columns of the tables, which move with the clock.
var ageRE = regexp.MustCompile(`\b\d\d:\d\d:\d\d:\d\d\b`)

func httpGet(t *testing.T, url string) (int, string) {
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
	return resp.StatusCode, string(body)
}

func TestStatusPagesOfARunningDaemon(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	e.writeConfig("    poll-interval: 1\n")
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := held.Addr().(*net.TCPAddr).Port
	f, err := os.OpenFile(e.cfgPath, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	// The config ends with the builder section: the pages' address goes in it.
	fmt.Fprintf(f, "  webapp:\n    listen-address: 127.0.0.1\n    port: %d\n    host-names: [builder.example.test]\n", port)
	f.Close()

	// A port that cannot be had stops the daemon before its loops start.
	r := e.run()
	if r.code != exitUsage || !strings.Contains(r.stderr, fmt.Sprintf("127.0.0.1:%d", port)) ||
		!strings.Contains(r.stderr, "set builder.webapp.port") || !strings.Contains(r.stderr, e.cfgPath) {
		t.Fatalf("daemon with its webapp port taken exited %d, want %d and a hint:\n%s", r.code, exitUsage, r.stderr)
	}
	held.Close()

	// The daemon sends nodepool's statsd names to a socket of the test.
	sd := testenv.NewStatsd(t)
	t.Setenv("STATSD_HOST", sd.Host)
	t.Setenv("STATSD_PORT", sd.Port)
	d := startDaemon(t, e.cfgPath)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	d.waitLog(t, 10*time.Second, "url="+base+"/")
	// The pages answer to the names host-names lists, and to no other name.
	for host, want := range map[string]int{"builder.example.test": 200, "Builder.Example.Test:8006": 200, "rebound.example.test": 421} {
		req, _ := http.NewRequest("GET", base+"/healthz", nil)
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("/healthz with Host %s: %d, want %d", host, resp.StatusCode, want)
		}
	}
	// Before any build: the state is read, and nothing is uploaded yet.
	before := metricstest.ScrapeURL(t, base+"/metrics")
	if v, ok := before.Value("nodepool_builder_state_up"); !ok || v != 1 {
		t.Fatalf("nodepool_builder_state_up = %v %v before any build, want 1", v, ok)
	}
	if v, ok := before.Value("nodepool_builder_uploads", "image", "debian", "provider", "cloud-q", "state", "ready"); ok && v != 0 {
		t.Fatalf("ready uploads before any build: %v", v)
	}
	e.addBuild(e.makeImage(1), zuultest.BuildSpec{})
	testenv.WaitFor(t, 60*time.Second, "both uploads ready", func() bool {
		n := 0
		for _, u := range e.uploadsJSON() {
			if u.State == "ready" {
				n++
			}
		}
		return n == 2
	}, d.logs.String)

	// Each page equals the command's output. The daemon may still change a
	// record (dropping uploaded files) between two reads: a page counts when
	// the command says the same before and after it.
	for _, cmd := range []string{"image-list", "dib-image-list", "image-status"} {
		testenv.WaitFor(t, 30*time.Second, cmd+".json to equal "+cmd+" --json", func() bool {
			before := e.must(0, []string{cmd, "--json"}).stdout
			code, page := httpGet(t, base+"/"+cmd+".json")
			after := e.must(0, []string{cmd, "--json"}).stdout
			var cli, web any
			if code != 200 || json.Unmarshal([]byte(before), &cli) != nil || json.Unmarshal([]byte(page), &web) != nil {
				t.Fatalf("/%s.json: %d\n%s", cmd, code, page)
			}
			if before != after {
				return false
			}
			if !reflect.DeepEqual(cli, web) {
				t.Fatalf("/%s.json differs from %s --json:\n%s\n%s", cmd, cmd, page, before)
			}
			return true
		}, d.logs.String)
		testenv.WaitFor(t, 30*time.Second, cmd+" to equal its table", func() bool {
			before := ageRE.ReplaceAllString(e.must(0, []string{cmd}).stdout, "AGE")
			code, page := httpGet(t, base+"/"+cmd)
			after := ageRE.ReplaceAllString(e.must(0, []string{cmd}).stdout, "AGE")
			if before != after {
				return false
			}
			if code != 200 || ageRE.ReplaceAllString(page, "AGE") != before {
				t.Fatalf("/%s differs from %s: %d\n%s\n%s", cmd, cmd, code, page, before)
			}
			return true
		}, d.logs.String)
	}

	// statsd: nodepool's image_update timer and counter per ready upload, and
	// nothing for the download, which nodepool has no name for. (The gauges
	// of every lifecycle pass are TestImageStateGauges's.)
	want := []string{
		"nodepool.image_update.debian.cloud-q:*", "nodepool.image_update.debian.cloud-q:1|c",
		"nodepool.image_update.debian.cloud-r:*", "nodepool.image_update.debian.cloud-r:1|c",
	}
	got := slices.DeleteFunc(sd.Wait(t, 10*time.Second, want...), stateGauge)
	if extra := slices.DeleteFunc(sd.Quiet(200*time.Millisecond), stateGauge); len(got) != len(want) || len(extra) > 0 {
		t.Errorf("statsd lines = %q then %q, want a timer and a counter per provider, nothing for the download", got, extra)
	}

	// The metrics followed: both uploads counted ready, their bytes and
	// durations, the download, the poll.
	after := metricstest.ScrapeURL(t, base+"/metrics")
	if v, _ := after.Value("nodepool_builder_builds", "image", "debian", "source", "zuul", "state", "ready"); v != 1 {
		t.Errorf("ready builds of debian = %v, want 1", v)
	}
	if v, _ := after.Value("nodepool_builder_downloaded_bytes_total", "image", "debian"); v <= 0 {
		t.Errorf("downloaded bytes of debian = %v, want > 0", v)
	}
	if v, _ := after.Value("nodepool_builder_download_duration_seconds", "image", "debian", "state", "ready"); v < 1 {
		t.Errorf("download durations of debian counted %v, want one per format fetched", v)
	}
	for _, p := range []string{"cloud-q", "cloud-r"} {
		if v, _ := after.Value("nodepool_builder_uploads", "image", "debian", "provider", p, "state", "ready"); v != 1 {
			t.Errorf("ready uploads of debian in %s = %v, want 1", p, v)
		}
		if v, _ := after.Value("nodepool_builder_uploaded_bytes_total", "image", "debian", "provider", p); v <= 0 {
			t.Errorf("uploaded bytes of debian to %s = %v, want > 0", p, v)
		}
		if v, _ := after.Value("nodepool_builder_upload_duration_seconds", "image", "debian", "provider", p, "state", "ready"); v != 1 {
			t.Errorf("upload durations of debian to %s counted %v, want 1", p, v)
		}
		if v, ok := after.Value("nodepool_builder_upload_age_seconds", "image", "debian", "provider", p); !ok || v < 0 {
			t.Errorf("age of the newest ready upload of debian in %s = %v %v", p, v, ok)
		}
	}
	if v, _ := after.Value("nodepool_builder_last_successful_poll_timestamp_seconds", "image", "debian"); v < float64(time.Now().Add(-time.Minute).Unix()) {
		t.Errorf("last successful poll of debian at %v, want within the last minute", v)
	}

	code, page := httpGet(t, base+"/")
	for _, w := range []string{`<td class="name">debian</td>`, `cloud-q: <span class="state ok"`,
		`cloud-r: <span class="state ok"`} {
		if code != 200 || !strings.Contains(page, w) {
			t.Errorf("/ lacks %q (%d):\n%s", w, code, page)
		}
	}
	// A real browser renders the page: the tables are in the DOM it built,
	// and its screenshot has their text drawn.
	br := testenv.NewBrowser(t)
	dom := br.DOM(t, base+"/")
	for _, w := range []string{"<th>Image</th>", "<th>Newest ready build</th>", `<td class="name">debian</td>`,
		"Nothing is being built, fetched or uploaded.", "Nothing failed."} {
		if !strings.Contains(dom, w) {
			t.Errorf("the browser's DOM of / lacks %q:\n%s", w, dom)
		}
	}
	shot := br.Screenshot(t, base+"/", filepath.Join(e.dir, "status.png"), 1280, 800)
	if n := testenv.DarkPixels(shot); n < 2000 {
		t.Errorf("the screenshot of / has %d dark pixels: its text was not drawn", n)
	}
	if code, body := httpGet(t, base+"/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("/healthz of a working daemon: %d %q", code, body)
	}

	// The state is overwritten with garbage under the running daemon: the
	// database, and its WAL and shared index too, which the daemon's
	// connections check before they trust the pages they cached.
	db := filepath.Join(e.dir, "images", "builder.db")
	for _, name := range []string{db, db + "-wal", db + "-shm"} {
		fi, err := os.Stat(name)
		if err != nil {
			t.Fatal(err)
		}
		garbage := strings.Repeat("not a database ", int(fi.Size())/15+1)[:fi.Size()]
		if err := os.WriteFile(name, []byte(garbage), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	testenv.WaitFor(t, 30*time.Second, "/healthz to report the state unreadable", func() bool {
		code, body := httpGet(t, base+"/healthz")
		return code == 503 && strings.Contains(body, "the state does not answer")
	}, d.logs.String)
}

func TestStatusPagesBesideALauncher(t *testing.T) {
	// nodepool-launcher on the same host holds its webapp port; the builder
	// reads the same nodepool.yaml and must neither need nor take that port.
	launcher, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer launcher.Close()
	launcherPort := launcher.Addr().(*net.TCPAddr).Port
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	builderPort := free.Addr().(*net.TCPAddr).Port
	free.Close()

	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "nodepool.yaml")
	write := func(builderWebapp string) {
		t.Helper()
		cfg := fmt.Sprintf("images-dir: %s\nwebapp:\n  listen_address: 127.0.0.1\n  port: %d\nbuilder:\n  keep-builds: 2\n%s",
			filepath.Join(dir, "images"), launcherPort, builderWebapp)
		if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	stop := func(d *daemon) {
		t.Helper()
		d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.exited:
		case <-time.After(30 * time.Second):
			t.Fatalf("the daemon did not stop within 30s of SIGTERM:\n%s", d.logs.String())
		}
	}
	builderWebapp := func(port int) string {
		return fmt.Sprintf("  webapp:\n    listen-address: 127.0.0.1\n    port: %d\n", port)
	}

	// Only the launcher's webapp: the daemon starts, serves no pages, and
	// says once where the builder's own are set.
	write("")
	d := startDaemon(t, cfgPath)
	d.waitLog(t, 10*time.Second, "the top-level webapp section is nodepool-launcher's; set builder.webapp")
	if n := strings.Count(d.logs.String(), "nodepool-launcher's"); n != 1 {
		t.Errorf("the launcher's webapp was mentioned %d times, want once:\n%s", n, d.logs.String())
	}
	stop(d)

	// builder.webapp: the pages are served on its port while the launcher
	// keeps its own.
	write(builderWebapp(builderPort))
	d = startDaemon(t, cfgPath)
	base := fmt.Sprintf("http://127.0.0.1:%d", builderPort)
	d.waitLog(t, 10*time.Second, "url="+base+"/")
	if code, body := httpGet(t, base+"/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("/healthz on builder.webapp's port: %d %q\n%s", code, body, d.logs.String())
	}
	if strings.Contains(d.logs.String(), "nodepool-launcher's") {
		t.Errorf("the launcher's webapp was mentioned with builder.webapp set:\n%s", d.logs.String())
	}
	// A changed builder.webapp takes effect at the next restart, and the
	// reload says so.
	write(builderWebapp(launcherPort + 1))
	d.cmd.Process.Signal(syscall.SIGHUP)
	d.waitLog(t, 10*time.Second, "builder.webapp changed; the status pages stay where they are until the builder is restarted")
	if code, _ := httpGet(t, base+"/healthz"); code != 200 {
		t.Fatalf("/healthz after the reload: %d", code)
	}
	stop(d)

	// builder.webapp on a port that is taken (here the launcher's): exit 2
	// naming the setting, the address and the config.
	write(builderWebapp(launcherPort))
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"nodepool-builder", "-c", cfgPath}, &out, &errb)
	addr := fmt.Sprintf("127.0.0.1:%d", launcherPort)
	if code != exitUsage || !strings.Contains(errb.String(), addr) || !strings.Contains(errb.String(), "builder.webapp.port") ||
		!strings.Contains(errb.String(), cfgPath) {
		t.Fatalf("daemon with builder.webapp's port taken exited %d, want %d naming %s, builder.webapp.port and %s:\n%s",
			code, exitUsage, addr, cfgPath, errb.String())
	}
}
