package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/metrics/metricstest"
	"github.com/nodepool-builder/nodepool-builder/status"
	"github.com/nodepool-builder/nodepool-builder/uploader"
	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

// reportDeadline bounds the time from a report's publication to the start of
// the download of the build it names. The daemon takes a few milliseconds; the
// bound is loose so that a loaded machine stays green, and far below the
// poll-interval of 600 s, so that only the report can have made the poll.
const reportDeadline = 5 * time.Second

// mqttDaemon is a daemon whose zuul-image is polled every 600 s, with
// builder.zuul-mqtt at a real broker and its status pages on a port of the test.
type mqttDaemon struct {
	*daemon
	e      *env
	broker *testenv.Mosquitto
	pages  string // the status pages' base URL
}

// startMQTTDaemon writes the config (section is builder.zuul-mqtt's keys,
// indented under it) and starts the daemon; it returns once the daemon
// listens and has made its first poll and the poll every connect asks for.
func startMQTTDaemon(t *testing.T, e *env, broker *testenv.Mosquitto, section string) *mqttDaemon {
	t.Helper()
	e.writeConfig("    poll-interval: 600\n")
	port := testenv.FreePort(t)
	f, err := os.OpenFile(e.cfgPath, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	// The config ends with the builder section.
	fmt.Fprintf(f, "  webapp:\n    listen-address: 127.0.0.1\n    port: %d\n  zuul-mqtt:\n%s", port, section)
	f.Close()
	d := &mqttDaemon{daemon: startDaemon(t, e.cfgPath), e: e, broker: broker, pages: fmt.Sprintf("http://127.0.0.1:%d", port)}
	d.waitLog(t, 30*time.Second, `msg="listening to Zuul's reports"`)
	testenv.WaitFor(t, 30*time.Second, "the first poll and the poll after the connect", func() bool {
		return len(e.zuul.BuildsCalls()) == 2
	}, d.logs.String)
	return d
}

// report publishes the stand-in Zuul's MQTT report of a build, as Zuul's
// reporter would; it returns when mosquitto_pub was started.
func (d *mqttDaemon) report(t *testing.T, uuid string) time.Time {
	t.Helper()
	topic, payload, err := d.e.zuul.MQTTReport(uuid)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	d.broker.Publish(t, topic, payload)
	return start
}

// fetchedAfter waits until the daemon starts the download of a Zuul build,
// at most reportDeadline after since, and returns how long after since it
// began, by the daemon's log.
func (d *mqttDaemon) fetchedAfter(t *testing.T, since time.Time, uuid string) time.Duration {
	t.Helper()
	var at time.Time
	testenv.WaitFor(t, reportDeadline, "the download of "+uuid+" to start", func() bool {
		var ok bool
		at, ok = logLineTime(t, d.logs.String(), `msg="new Zuul build"`, "zuul_build="+uuid)
		return ok
	}, d.logs.String)
	return at.Sub(since)
}

// status is what the daemon last said of its listener.
func (d *mqttDaemon) status(t *testing.T) status.ZuulMQTT {
	t.Helper()
	var s status.ZuulMQTT
	data, err := os.ReadFile(filepath.Join(d.e.dir, "images", "zuul-mqtt-status.json"))
	if err == nil {
		err = json.Unmarshal(data, &s)
	}
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return s
}

// readyBuild tells whether the Zuul build uuid is a ready build.
func (e *env) readyBuild(uuid string) bool {
	for _, b := range e.buildsJSON() {
		if b.ZuulBuildUUID == uuid && b.State == "ready" {
			return true
		}
	}
	return false
}

// activeIn waits until both providers hold an active image of the Zuul build uuid.
func (d *mqttDaemon) activeIn(t *testing.T, uuid string) {
	t.Helper()
	testenv.WaitFor(t, 90*time.Second, "the uploads of "+uuid+" to be active in Glance", func() bool {
		var id string
		for _, b := range d.e.buildsJSON() {
			if b.ZuulBuildUUID == uuid && b.State == "ready" {
				id = b.BuildID
			}
		}
		if id == "" {
			return false
		}
		active := 0
		for _, p := range []string{"cloud-q", "cloud-r"} {
			for _, img := range d.e.images(p) {
				if img.Properties[uploader.PropBuildID] == id && img.Status == "active" {
					active++
				}
			}
		}
		return active == 2
	}, d.logs.String)
}

// TestDaemonFetchesWhatZuulReportsOverMQTT: with poll-interval 600, a build
// that Zuul reports over MQTT is downloading within a few seconds of the
// report (the latency is logged) and active in Glance soon after. Reports of
// another job, of a failed build, of a check build of an unmerged change, and
// a malformed message change nothing, not even an API query; a flood of 100
// reports costs a bounded handful of queries. With the broker restarted, the
// daemon reconnects, fetches the build Zuul made while it could hear nothing,
// and uses the next report. image-status, the status page and /metrics show it.
func TestDaemonFetchesWhatZuulReportsOverMQTT(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	broker := testenv.NewMosquitto(t, testenv.MosquittoOptions{})
	d := startMQTTDaemon(t, e, broker, "    url: "+broker.URL+"\n    topics: ['zuul/#']\n")

	// A new build, reported: the download starts at once.
	zb := e.addBuild(e.makeImage(1), zuultest.BuildSpec{})
	published := d.report(t, zb.UUID)
	latency := d.fetchedAfter(t, published, zb.UUID)
	calls := e.zuul.BuildsCalls()
	t.Logf("latency from mosquitto_pub starting to the download of the reported build starting: %s (to the builds API query: %s)",
		latency, calls[len(calls)-1].Time.Sub(published))
	if len(calls) != 3 {
		t.Errorf("%d builds API queries; want 3: the first poll, the one after the connect, the one for the report", len(calls))
	}
	d.activeIn(t, zb.UUID)

	// Reports no zuul-image takes, and a malformed message: nothing is asked.
	other := e.addBuild(e.makeImage(2), zuultest.BuildSpec{Job: "build-ubuntu"})
	failed := e.addBuild(e.makeImage(3), zuultest.BuildSpec{Result: "FAILURE"})
	check := e.addBuild(e.makeImage(4), zuultest.BuildSpec{Pipeline: "check", Change: 77, Patchset: "2"})
	before := len(e.zuul.BuildsCalls())
	for _, uuid := range []string{other.UUID, failed.UUID, check.UUID} {
		d.report(t, uuid)
	}
	broker.Publish(t, "zuul/example/post/org/images", []byte(`{"action": "success", "buildset": [`))
	testenv.WaitFor(t, 10*time.Second, "the four messages counted as ignored", func() bool {
		s := d.status(t)
		return s.Ignored["no-match"] == 3 && s.Ignored["malformed"] == 1
	}, d.logs.String)
	if n := len(e.zuul.BuildsCalls()); n != before {
		t.Errorf("the reports no zuul-image takes made %d builds API queries; want none", n-before)
	}
	if s := d.status(t); s.Used != 1 || s.Polls != 1 {
		t.Errorf("status after one report used: %+v", s)
	}

	// The broker restarted, and a build made while the daemon heard nothing:
	// the poll after the reconnect fetches it.
	if err := broker.Stop(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the lost connection in the status", func() bool {
		s := d.status(t)
		return !s.Connected && s.LastError != ""
	}, d.logs.String)
	missed := e.addBuild(e.makeImage(5), zuultest.BuildSpec{})
	if err := broker.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the reconnect", func() bool {
		return strings.Count(d.logs.String(), `msg="listening to Zuul's reports"`) == 2
	}, d.logs.String)
	testenv.WaitFor(t, 60*time.Second, "the build made while the broker was down to be fetched", func() bool {
		return e.readyBuild(missed.UUID)
	}, d.logs.String)

	// The next report is used.
	next := e.addBuild(e.makeImage(6), zuultest.BuildSpec{})
	published = d.report(t, next.UUID)
	latency = d.fetchedAfter(t, published, next.UUID)
	t.Logf("latency after the broker's restart: %s", latency)
	d.activeIn(t, next.UUID)

	// A flood of reports of a build the daemon has: a handful of queries.
	_, payload, err := e.zuul.MQTTReport(next.UUID)
	if err != nil {
		t.Fatal(err)
	}
	flood := make([]string, 100)
	for i := range flood {
		flood[i] = string(payload)
	}
	var was status.ZuulMQTT
	testenv.WaitFor(t, 10*time.Second, "the status to count the two reports used", func() bool {
		was = d.status(t)
		return was.Used == 2
	}, d.logs.String)
	before = len(e.zuul.BuildsCalls())
	broker.PublishLines(t, "zuul/example/periodic/org/images", flood)
	testenv.WaitFor(t, 30*time.Second, "the flood to be read", func() bool {
		s := d.status(t)
		return s.Used-was.Used+s.Ignored["rate-limited"]-was.Ignored["rate-limited"] == 100
	}, d.logs.String)
	fams := metricstest.ScrapeURL(t, d.pages+"/metrics")
	if n := len(e.zuul.BuildsCalls()) - before; n > 3 {
		t.Errorf("a flood of 100 reports made %d builds API queries; want at most 3 (two at once, one held back)", n)
	}
	for _, c := range []struct {
		outcome string
		want    float64
	}{{"no-match", 3}, {"malformed", 1}} {
		if v, ok := fams.Value("nodepool_builder_zuul_mqtt_messages_total", "outcome", c.outcome); !ok || v != c.want {
			t.Errorf("zuul_mqtt_messages_total{outcome=%q} = %v (present %v), want %v", c.outcome, v, ok, c.want)
		}
	}
	if v, ok := fams.Value("nodepool_builder_zuul_mqtt_messages_total", "outcome", "rate-limited"); !ok || v < 98 {
		t.Errorf("zuul_mqtt_messages_total{outcome=rate-limited} = %v (present %v), want at least 98 of the flood", v, ok)
	}
	if v, ok := fams.Value("nodepool_builder_zuul_mqtt_connected"); !ok || v != 1 {
		t.Errorf("zuul_mqtt_connected = %v (present %v), want 1", v, ok)
	}
	for _, b := range e.buildsJSON() {
		if b.ZuulBuildUUID != zb.UUID && b.ZuulBuildUUID != missed.UUID && b.ZuulBuildUUID != next.UUID {
			t.Errorf("a build of a Zuul build nobody reported as a zuul-image's: %+v", b)
		}
	}

	out := e.must(0, []string{"image-status"}).stdout
	if !strings.Contains(out, "Zuul MQTT reports (daemon pid") || !strings.Contains(out, "| "+broker.URL+" | zuul/# | yes") {
		t.Errorf("image-status does not show the listener:\n%s", out)
	}
	if code, page := httpGet(t, d.pages+"/"); code != 200 || !strings.Contains(page, `<span class="state ok">connected</span>`) {
		t.Errorf("the status page does not show the listener connected: %d\n%s", code, page)
	}
}

// TestDaemonListensOverTLSWithAPasswordFile: a broker that takes only TLS
// and a user with a password: the daemon logs in with the password of
// password-file, trusting ca-cert, and fetches what is reported. A wrong
// password is refused and said to be, with what to do, without the password;
// the file is read again at the next connect.
func TestDaemonListensOverTLSWithAPasswordFile(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	broker := testenv.NewMosquitto(t, testenv.MosquittoOptions{TLS: true})
	d := startMQTTDaemon(t, e, broker, fmt.Sprintf("    url: %s\n    username: %s\n    password-file: %s\n    ca-cert: %s\n",
		broker.URL, broker.Username, broker.PasswordFile, broker.CA))

	zb := e.addBuild(e.makeImage(1), zuultest.BuildSpec{})
	published := d.report(t, zb.UUID)
	latency := d.fetchedAfter(t, published, zb.UUID)
	t.Logf("latency over TLS: %s", latency)
	d.activeIn(t, zb.UUID)

	wrong := "wrong-" + broker.Password
	if err := os.WriteFile(broker.PasswordFile, []byte(wrong+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := broker.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := broker.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the wrong password to be refused", func() bool {
		s := d.status(t)
		return !s.Connected && strings.Contains(s.LastError, `refused the login as "nodepool"`) &&
			strings.Contains(s.LastError, "check username and the password in password-file")
	}, d.logs.String)
	if err := os.WriteFile(broker.PasswordFile, []byte(broker.Password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the reconnect with the right password", func() bool { return d.status(t).Connected }, d.logs.String)

	statusFile, err := os.ReadFile(filepath.Join(e.dir, "images", "zuul-mqtt-status.json"))
	if err != nil {
		t.Fatal(err)
	}
	_, page := httpGet(t, d.pages+"/")
	_, metrics := httpGet(t, d.pages+"/metrics")
	for what, text := range map[string]string{"the log": d.logs.String(), "the status file": string(statusFile),
		"image-status": e.must(0, []string{"image-status"}).stdout, "the status page": page, "/metrics": metrics} {
		if strings.Contains(text, broker.Password) {
			t.Errorf("%s shows the broker's password:\n%s", what, text)
		}
	}
}

// TestOnceDoesNotListen: --once ignores builder.zuul-mqtt: it polls, fetches
// and uploads without a word of the broker, which here does not even run.
func TestOnceDoesNotListen(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	e.writeConfig("")
	f, err := os.OpenFile(e.cfgPath, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(f, "  zuul-mqtt:\n    url: mqtt://127.0.0.1:%d\n", testenv.FreePort(t))
	f.Close()
	zb := e.addBuild(e.makeImage(1), zuultest.BuildSpec{})
	r := e.once(0)
	if strings.Contains(r.stderr, "MQTT") || strings.Contains(r.stderr, "mqtt") {
		t.Errorf("--once spoke of the MQTT broker:\n%s", r.stderr)
	}
	if !e.readyBuild(zb.UUID) {
		t.Errorf("--once did not fetch Zuul's build")
	}
}
