package builder

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/metrics"
	"github.com/nodepool-builder/nodepool-builder/metrics/metricstest"
	"github.com/nodepool-builder/nodepool-builder/status"
	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
	"github.com/nodepool-builder/nodepool-builder/zuulmqtt"
)

// mqttRig is a builder whose zuul-image zimg is polled every hour from a
// stand-in Zuul, with builder.zuul-mqtt at a real broker.
type mqttRig struct {
	*rig
	zuul *zuultest.Server
	logs *logBuffer
	m    *metrics.Metrics
}

func (r *mqttRig) text(extra string) string {
	return strings.NewReplacer("{{ZUUL}}", r.zuul.URL(), "{{EVERY}}", "3600", "%s", r.st.Dir()).Replace(zuulImage) +
		"builder:\n" + extra
}

func mqttSection(url string) string { return "  zuul-mqtt:\n    url: " + url + "\n" }

func newMQTTRig(t *testing.T, broker *testenv.Mosquitto) *mqttRig {
	t.Helper()
	zuul := zuultest.NewServer(zuultest.ServerOptions{})
	t.Cleanup(zuul.Close)
	r := &mqttRig{zuul: zuul, logs: &logBuffer{}}
	m, err := metrics.New(metrics.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r.m = m
	text := strings.NewReplacer("{{ZUUL}}", zuul.URL(), "{{EVERY}}", "3600").Replace(zuulImage) + "builder:\n" + mqttSection(broker.URL)
	r.rig = newRig(t, text, func(o *Options) {
		o.Logger = slog.New(slog.NewTextHandler(r.logs, nil))
		o.Metrics = m
	})
	return r
}

func (r *mqttRig) polls() int { return len(r.zuul.BuildsCalls()) }

func (r *mqttRig) state() zuulmqtt.State {
	s, _ := r.b.mqtt.Load().state()
	return s
}

// report publishes on broker the report of a build of zimg that the builds
// API does not list (any longer): what the poll it leads to finds is up to
// the API, not the report.
func (r *mqttRig) report(broker *testenv.Mosquitto) {
	r.t.Helper()
	b, err := r.zuul.AddBuild(zuultest.BuildSpec{Job: "build-zimg"})
	if err != nil {
		r.t.Fatal(err)
	}
	topic, payload, err := r.zuul.MQTTReport(b.UUID)
	if err != nil {
		r.t.Fatal(err)
	}
	r.zuul.RemoveBuild(b.UUID)
	broker.Publish(r.t, topic, payload)
}

func (r *mqttRig) show() string {
	return "log:\n" + r.logs.b.String()
}

// TestZuulMQTTReportPollsNow: with builder.zuul-mqtt, the daemon polls every
// zuul-image once it is connected, and a report of a build of zimg's job makes
// it poll zimg at once, though its poll-interval is an hour; the connection
// and the messages show in the status file and the metrics. A reload (the
// Reload signal) that changes the settings listens with the new ones, counting on; one whose files
// do not read is refused; one without the section stops listening.
func TestZuulMQTTReportPollsNow(t *testing.T) {
	broker := testenv.NewMosquitto(t, testenv.MosquittoOptions{})
	r := newMQTTRig(t, broker)
	r.run()
	// The first poll, and the one every connect asks for.
	testenv.WaitFor(t, 10*time.Second, "the first poll and the poll after the connect", func() bool {
		return r.polls() == 2 && r.state().Connected
	}, r.show)
	if r.logs.count("connected to Zuul's MQTT broker: polling every zuul-image now") != 1 {
		t.Errorf("the log does not say the connect polls every zuul-image\n%s", r.show())
	}

	r.report(broker)
	testenv.WaitFor(t, 5*time.Second, "a poll for the report", func() bool { return r.polls() == 3 }, r.show)
	if s := r.state(); s.Used != 1 || s.Hints != 1 {
		t.Errorf("state after one report: %+v; want it used once, one poll", s)
	}
	if r.logs.count(`msg="polling a zuul-image now: Zuul reported a successful build of its job over MQTT" part=zuul-mqtt`) != 1 {
		t.Errorf("the log does not say the report made zimg be polled\n%s", r.show())
	}
	broker.Publish(t, "zuul/example/post/org/images", []byte("{not json"))
	testenv.WaitFor(t, 5*time.Second, "the malformed message counted", func() bool {
		return r.state().Ignored[zuulmqtt.IgnoredMalformed] == 1
	}, r.show)
	testenv.WaitFor(t, 5*time.Second, "the status file to show the listener", func() bool {
		s, err := status.ReadZuulMQTT(r.st)
		return err == nil && s != nil && s.Listening && s.Connected && s.URL == broker.URL && s.Used == 1 && s.Polls == 1 &&
			s.Ignored[zuulmqtt.IgnoredMalformed] == 1 && !s.LastMessage.IsZero() && !s.Stale(time.Now())
	}, r.show)
	fams := metricstest.Scrape(t, r.m.Handler())
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"nodepool_builder_zuul_mqtt_connected", nil, 1},
		{"nodepool_builder_zuul_mqtt_messages_total", []string{"outcome", "used"}, 1},
		{"nodepool_builder_zuul_mqtt_messages_total", []string{"outcome", "malformed"}, 1},
		{"nodepool_builder_zuul_mqtt_messages_total", []string{"outcome", "no-match"}, 0},
		{"nodepool_builder_zuul_mqtt_polls_total", nil, 1},
	} {
		if got, ok := fams.Value(c.name, c.labels...); !ok || got != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}

	// New settings: another broker.
	other := testenv.NewMosquitto(t, testenv.MosquittoOptions{})
	r.confirm(r.text(mqttSection(other.URL)))
	testenv.WaitFor(t, 10*time.Second, "the listener on the new broker, and its poll after the connect", func() bool {
		s := r.state()
		return s.URL == other.URL && s.Connected && r.polls() == 4
	}, r.show)
	r.report(other)
	testenv.WaitFor(t, 5*time.Second, "a poll for the report on the new broker", func() bool { return r.polls() == 5 }, r.show)
	if s := r.state(); s.Used != 2 || s.Ignored[zuulmqtt.IgnoredMalformed] != 1 {
		t.Errorf("state on the new broker: %+v; want the counts of both listeners (used 2, malformed 1)", s)
	}

	// Files that do not read: the reload is refused, the listener stays.
	r.confirm(r.text("  zuul-mqtt:\n    url: mqtts://127.0.0.1:1\n    ca-cert: " + filepath.Join(r.dir, "absent-ca.pem") + "\n"))
	testenv.WaitFor(t, 10*time.Second, "the reload to be refused", func() bool { return r.logs.count("config not reloaded") == 1 }, r.show)
	if r.logs.count("builder.zuul-mqtt: read ca-cert") != 1 || r.state().URL != other.URL {
		t.Errorf("the refused reload does not say why, or changed the listener (%s)\n%s", r.state().URL, r.show())
	}

	// Without the section: no listener, and the status file says so.
	r.confirm(r.text("  keep-builds: 2\n"))
	testenv.WaitFor(t, 10*time.Second, "the listener to stop", func() bool {
		s, err := status.ReadZuulMQTT(r.st)
		return err == nil && s != nil && !s.Listening && !s.Connected && s.Used == 2
	}, r.show)
	if _, ok := metricstest.Scrape(t, r.m.Handler())["nodepool_builder_zuul_mqtt_connected"]; ok {
		t.Error("zuul_mqtt_connected given while no listener runs")
	}
}

// TestZuulMQTTReconnectsPollOncePerInterval: a broker that goes away and
// comes back again and again (it restarts, or another client takes over the
// client id) makes the listener connect again each time; only the first
// connect (which covers the time before the listener started) and the first
// connect again poll zimg, whose poll-interval is an hour: the others do not
// poll it again within that hour. A report still makes it poll at once.
func TestZuulMQTTReconnectsPollOncePerInterval(t *testing.T) {
	broker := testenv.NewMosquitto(t, testenv.MosquittoOptions{})
	r := newMQTTRig(t, broker)
	r.run()
	const connected = "connected to Zuul's MQTT broker"
	testenv.WaitFor(t, 10*time.Second, "the first poll and the poll after the connect", func() bool {
		return r.polls() == 2 && r.state().Connected && r.logs.count(connected) == 1
	}, r.show)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for n := 2; n <= 4; n++ {
		if err := broker.Stop(); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, 10*time.Second, "the lost connection", func() bool { return !r.state().Connected }, r.show)
		if err := broker.Start(ctx); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, 20*time.Second, fmt.Sprintf("connect number %d", n), func() bool {
			return r.state().Connected && r.logs.count(connected) == n
		}, r.show)
	}
	// The report's poll comes after what the connects asked for.
	r.report(broker)
	testenv.WaitFor(t, 5*time.Second, "the report's hint and a poll", func() bool {
		return r.state().Hints == 1 && r.polls() >= 4
	}, r.show)
	if n := r.polls(); n != 4 {
		t.Errorf("%d polls after four connects and a report, want 4: the start's, the first connect's, the first connect again's, the report's\n%s", n, r.show())
	}
	if r.logs.count("not_polled_again=1") != 2 {
		t.Errorf("the log does not say that the connects after the second did not poll zimg again\n%s", r.show())
	}
}

// TestZuulMQTTCanonicalProject: a zuul-image whose project is written by its
// canonical name is polled by the short name Zuul stores, and a report, which
// names the project as Zuul stores it, matches it as the poll's answer does:
// it makes the daemon poll at once.
func TestZuulMQTTCanonicalProject(t *testing.T) {
	broker := testenv.NewMosquitto(t, testenv.MosquittoOptions{})
	zuul := zuultest.NewServer(zuultest.ServerOptions{})
	t.Cleanup(zuul.Close)
	// A build of the project, so that the stand-in's tenant knows it.
	if _, err := zuul.AddBuild(zuultest.BuildSpec{Job: "build-other"}); err != nil {
		t.Fatal(err)
	}
	r := &mqttRig{zuul: zuul, logs: &logBuffer{}}
	text := strings.NewReplacer("{{ZUUL}}", zuul.URL(), "{{EVERY}}", "3600", "project: org/images",
		"project: review.example.com/org/images").Replace(zuulImage) + "builder:\n" + mqttSection(broker.URL)
	r.rig = newRig(t, text, func(o *Options) { o.Logger = slog.New(slog.NewTextHandler(r.logs, nil)) })
	r.run()
	testenv.WaitFor(t, 10*time.Second, "the first poll and the poll after the connect", func() bool {
		return r.polls() == 2 && r.state().Connected
	}, r.show)
	r.report(broker)
	testenv.WaitFor(t, 5*time.Second, "a poll for the report", func() bool { return r.polls() == 3 }, r.show)
	for _, c := range r.zuul.BuildsCalls() {
		if got := c.Query.Get("project"); got != "org/images" {
			t.Errorf("a poll asked for project %q, want org/images", got)
		}
	}
}

// TestZuulMQTTFilesMustRead: a builder whose zuul-mqtt names a password file
// that does not read is not made: the config is unusable.
func TestZuulMQTTFilesMustRead(t *testing.T) {
	r := newRig(t, twoImages)
	dir := t.TempDir()
	path := filepath.Join(dir, "nodepool.yaml")
	text := "images-dir: " + r.st.Dir() + "\nbuilder:\n  zuul-mqtt:\n    url: mqtt://127.0.0.1:1\n" +
		"    username: nodepool\n    password-file: " + filepath.Join(dir, "absent") + "\n"
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(config.Files{Nodepool: path})
	if err != nil {
		t.Fatal(err)
	}
	_, err = New(t.Context(), Options{Config: cfg, Store: r.st})
	if !errors.Is(err, config.ErrUnusable) || !strings.Contains(err.Error(), "builder.zuul-mqtt: read password-file") {
		t.Fatalf("New = %v; want the password file named, and the config unusable", err)
	}
}

// TestMissedPollsOncePerInterval: a connect polls a zuul-image again only
// once its poll-interval has passed since a connect last polled it; an image
// new to the config is polled at its first connect, one gone is forgotten.
func TestMissedPollsOncePerInterval(t *testing.T) {
	m := &missedPolls{last: map[string]time.Time{}}
	images := []config.ZuulImage{{Name: "hourly", PollInterval: time.Hour}, {Name: "minutely", PollInterval: time.Minute}}
	t0 := time.Now()
	for _, c := range []struct {
		at     time.Duration
		images []config.ZuulImage
		want   []string
	}{
		{0, images, []string{"hourly", "minutely"}},
		{10 * time.Second, images, nil},
		{time.Minute, images, []string{"minutely"}},
		{time.Minute + time.Second, append(images, config.ZuulImage{Name: "new", PollInterval: time.Hour}), []string{"new"}},
		{time.Hour, images[1:], []string{"minutely"}},
		{time.Hour + time.Second, images, []string{"hourly"}},
	} {
		if got := m.due(c.images, t0.Add(c.at)); !slices.Equal(got, c.want) {
			t.Errorf("a connect at +%s polls %v, want %v", c.at, got, c.want)
		}
	}
}
