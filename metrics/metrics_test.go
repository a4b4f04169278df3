package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/artifacts"
	"github.com/nodepool-builder/nodepool-builder/internal/diskspace"
	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/internal/untrusted"
	"github.com/nodepool-builder/nodepool-builder/metrics/metricstest"
	"github.com/nodepool-builder/nodepool-builder/store"
)

func TestEventsShowInScrape(t *testing.T) {
	m, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	before := metricstest.Scrape(t, m.Handler())
	for _, name := range []string{"go_goroutines", "process_cpu_seconds_total"} {
		if _, ok := before[name]; !ok {
			t.Errorf("%s missing: the Go and process collectors are not registered", name)
		}
	}
	if _, ok := before.Value("nodepool_builder_uploaded_bytes_total", "image", "debian", "provider", "cloud-a"); ok {
		t.Fatal("uploaded bytes present before any upload")
	}

	m.Uploaded("debian", "cloud-a", 1000, 90*time.Second, nil)
	m.Uploaded("debian", "cloud-a", 1000, 10*time.Second, fmt.Errorf("upload data: %w", context.DeadlineExceeded))
	m.Downloaded("debian", 4096, 2*time.Minute, nil)
	m.Downloaded("debian", 10, time.Second, fmt.Errorf("fetch: %w", artifacts.ErrChecksum))
	m.DIBBuilt(DIBBuild{Image: "ubuntu", Ran: true, ExitCode: 1, Duration: time.Hour, Err: errors.New("disk-image-create exited with code 1")})
	m.DIBBuilt(DIBBuild{Image: "ubuntu", Ran: true, Duration: time.Hour})
	m.Polled("debian")
	m.LeakFound("cloud-a")
	m.LeakDeleted("cloud-a")
	m.Failed(StepDelete, &net.OpError{Op: "dial", Err: errors.New("connection refused")})

	after := metricstest.Scrape(t, m.Handler())
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"nodepool_builder_uploaded_bytes_total", []string{"image", "debian", "provider", "cloud-a"}, 1000},
		{"nodepool_builder_upload_duration_seconds", []string{"image", "debian", "provider", "cloud-a", "state", "ready"}, 1},
		{"nodepool_builder_upload_duration_seconds", []string{"image", "debian", "provider", "cloud-a", "state", "failed"}, 1},
		{"nodepool_builder_downloaded_bytes_total", []string{"image", "debian"}, 4106},
		{"nodepool_builder_download_duration_seconds", []string{"image", "debian", "state", "ready"}, 1},
		{"nodepool_builder_build_duration_seconds", []string{"image", "ubuntu", "state", "failed"}, 1},
		{"nodepool_builder_build_duration_seconds", []string{"image", "ubuntu", "state", "ready"}, 1},
		{"nodepool_builder_failures_total", []string{"step", "upload", "reason", "timeout"}, 1},
		{"nodepool_builder_failures_total", []string{"step", "download", "reason", "checksum"}, 1},
		{"nodepool_builder_failures_total", []string{"step", "build", "reason", "exit"}, 1},
		{"nodepool_builder_failures_total", []string{"step", "delete", "reason", "cloud"}, 1},
		{"nodepool_builder_leaked_images_found_total", []string{"provider", "cloud-a"}, 1},
		{"nodepool_builder_leaked_images_deleted_total", []string{"provider", "cloud-a"}, 1},
	} {
		got, ok := after.Value(c.name, c.labels...)
		if !ok || got != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	polled, ok := after.Value("nodepool_builder_last_successful_poll_timestamp_seconds", "image", "debian")
	if !ok || time.Since(time.Unix(int64(polled), 0)) > time.Minute {
		t.Errorf("last poll = %v (present %v), want about now", polled, ok)
	}
}

func TestStateReadAtScrape(t *testing.T) {
	m, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	builds := []store.Build{
		{ID: "1", Image: "debian", Source: store.SourceZuul, State: store.Ready},
		{ID: "2", Image: "debian", Source: store.SourceZuul, State: store.Ready},
		{ID: "3", Image: "ubuntu", Source: store.SourceDIB, State: store.Failed},
	}
	uploads := []store.Upload{
		{BuildID: "1", Image: "debian", Provider: "a", State: store.Ready, StateTime: now.Add(-time.Hour)},
		{BuildID: "2", Image: "debian", Provider: "a", State: store.Ready, StateTime: now.Add(-10 * time.Minute)},
		{BuildID: "2", Image: "debian", Provider: "b", State: store.Failed, StateTime: now},
	}
	var readErr error
	m.WatchState(func(context.Context) ([]store.Build, []store.Upload, error) { return builds, uploads, readErr })
	connected := true
	m.WatchZooKeeper(func() bool { return connected })
	m.WatchGearman(func() []Link { return []Link{{"127.0.0.1:4730", true}, {"10.0.0.1:4730", false}} })

	fams := metricstest.Scrape(t, m.Handler())
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"nodepool_builder_state_up", nil, 1},
		{"nodepool_builder_builds", []string{"image", "debian", "source", "zuul", "state", "ready"}, 2},
		{"nodepool_builder_builds", []string{"image", "debian", "source", "zuul", "state", "failed"}, 0},
		{"nodepool_builder_builds", []string{"image", "ubuntu", "source", "dib", "state", "failed"}, 1},
		{"nodepool_builder_uploads", []string{"image", "debian", "provider", "a", "state", "ready"}, 2},
		{"nodepool_builder_uploads", []string{"image", "debian", "provider", "b", "state", "failed"}, 1},
		{"nodepool_builder_zookeeper_connected", nil, 1},
		{"nodepool_builder_gearman_connected", []string{"server", "127.0.0.1:4730"}, 1},
		{"nodepool_builder_gearman_connected", []string{"server", "10.0.0.1:4730"}, 0},
	} {
		got, ok := fams.Value(c.name, c.labels...)
		if !ok || got != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	age, ok := fams.Value("nodepool_builder_upload_age_seconds", "image", "debian", "provider", "a")
	if !ok || age < 600 || age > 660 {
		t.Errorf("upload age = %v (present %v), want the newest ready upload's, about 600 s", age, ok)
	}
	if _, ok := fams.Value("nodepool_builder_upload_age_seconds", "image", "debian", "provider", "b"); ok {
		t.Error("upload age given for a provider with no ready upload")
	}

	// Level-triggered: the next scrape sees the state as it is then.
	readErr = errors.New("database is locked")
	connected = false
	fams = metricstest.Scrape(t, m.Handler())
	if v, ok := fams.Value("nodepool_builder_state_up"); !ok || v != 0 {
		t.Errorf("state_up = %v (present %v) after a failed read, want 0", v, ok)
	}
	if _, ok := fams["nodepool_builder_builds"]; ok {
		t.Error("build counts given although the state could not be read")
	}
	if v, _ := fams.Value("nodepool_builder_zookeeper_connected"); v != 0 {
		t.Errorf("zookeeper_connected = %v after the session went, want 0", v)
	}
}

// TestZuulMQTTReadAtScrape: the listener to Zuul's MQTT reports is read at
// every scrape: its connection, its last message, and its messages by outcome;
// while no listener runs, none of its series is there.
func TestZuulMQTTReadAtScrape(t *testing.T) {
	m, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	last := time.Unix(1_800_000_000, 500_000_000)
	s, running := ZuulMQTT{Connected: true, LastMessage: last, Used: 3, Polls: 4,
		Ignored: map[string]uint64{"malformed": 2, "no-match": 0}}, true
	m.WatchZuulMQTT(func() (ZuulMQTT, bool) { return s, running })
	fams := metricstest.Scrape(t, m.Handler())
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"nodepool_builder_zuul_mqtt_connected", nil, 1},
		{"nodepool_builder_zuul_mqtt_last_message_timestamp_seconds", nil, 1_800_000_000.5},
		{"nodepool_builder_zuul_mqtt_messages_total", []string{"outcome", "used"}, 3},
		{"nodepool_builder_zuul_mqtt_messages_total", []string{"outcome", "malformed"}, 2},
		{"nodepool_builder_zuul_mqtt_messages_total", []string{"outcome", "no-match"}, 0},
		{"nodepool_builder_zuul_mqtt_polls_total", nil, 4},
	} {
		got, ok := fams.Value(c.name, c.labels...)
		if !ok || got != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}

	s.Connected, s.LastMessage = false, time.Time{}
	fams = metricstest.Scrape(t, m.Handler())
	if v, ok := fams.Value("nodepool_builder_zuul_mqtt_connected"); !ok || v != 0 {
		t.Errorf("zuul_mqtt_connected = %v (present %v) with the connection lost, want 0", v, ok)
	}
	if _, ok := fams["nodepool_builder_zuul_mqtt_last_message_timestamp_seconds"]; ok {
		t.Error("a last message time given before any message arrived")
	}

	running = false
	fams = metricstest.Scrape(t, m.Handler())
	for name := range fams {
		if strings.HasPrefix(name, "nodepool_builder_zuul_mqtt_") {
			t.Errorf("%s given while no listener runs", name)
		}
	}
}

func TestNilDoesNothing(t *testing.T) {
	var m *Metrics
	m.Uploaded("a", "b", 1, time.Second, nil)
	m.Downloaded("a", 1, time.Second, errors.New("x"))
	m.DIBBuilt(DIBBuild{Image: "a", Ran: true})
	m.Polled("a")
	m.Failed(StepPoll, errors.New("x"))
	m.LeakFound("a")
	m.LeakDeleted("a")
	m.WatchState(nil)
	m.WatchGearman(nil)
	m.WatchZooKeeper(nil)
	m.WatchZuulMQTT(nil)
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 404 {
		t.Errorf("nil Metrics' handler answered %d, want 404", rec.Code)
	}
	if err := m.Close(); err != nil {
		t.Error(err)
	}
}

func TestClassify(t *testing.T) {
	for _, c := range []struct {
		step Step
		err  error
		want Reason
	}{
		{StepUpload, fmt.Errorf("upload: %w", context.Canceled), ReasonCancelled},
		{StepDownload, fmt.Errorf("read: %w", os.ErrDeadlineExceeded), ReasonTimeout},
		{StepDownload, fmt.Errorf("fetch: %w", diskspace.ErrNoSpace), ReasonSpace},
		{StepBuild, fmt.Errorf("write: %w", &os.PathError{Op: "write", Path: "x", Err: syscall.ENOSPC}), ReasonSpace},
		{StepDownload, fmt.Errorf("refused: %w", untrusted.ErrUnsafe), ReasonRefused},
		{StepDownload, fmt.Errorf("check: %w", untrusted.ErrTooLarge), ReasonRefused},
		{StepDownload, &artifacts.MissingError{Missing: []string{"raw"}}, ReasonRefused},
		{StepPoll, &net.OpError{Op: "dial", Err: errors.New("connection refused")}, ReasonHTTP},
		{StepSweep, &net.OpError{Op: "dial", Err: errors.New("connection refused")}, ReasonCloud},
		{StepUpload, statusErr(503), ReasonCloud},
		{StepBuild, errors.New("DIB exited 0 but left no raw file"), ReasonOther},
	} {
		if got := Classify(c.step, c.err); got != c.want {
			t.Errorf("Classify(%s, %v) = %s, want %s", c.step, c.err, got, c.want)
		}
	}
}

type statusErr int

func (e statusErr) Error() string      { return fmt.Sprintf("HTTP %d", int(e)) }
func (e statusErr) GetStatusCode() int { return int(e) }

func TestStatsdLines(t *testing.T) {
	for _, c := range []struct {
		prefix, name string
		v            int64
		typ, want    string
	}{
		{"", "nodepool.dib_image_build.debian.status.rc", 0, "g", "nodepool.dib_image_build.debian.status.rc:0|g"},
		{"site", "nodepool.image_update.debian.cloud-a", 1, "c", "site.nodepool.image_update.debian.cloud-a:1|c"},
		{"", "nodepool.image_update.debian.cloud-a", 1500, "ms", "nodepool.image_update.debian.cloud-a:1500|ms"},
	} {
		if got := line(c.prefix, c.name, c.v, c.typ); got != c.want {
			t.Errorf("line(%q, %q) = %q, want %q", c.prefix, c.name, got, c.want)
		}
	}
	if got := key("a:b|c@d e\nf.g"); got != "a_b_c_d_e_f.g" {
		t.Errorf("key = %q", got)
	}
}

func TestStatsdEnv(t *testing.T) {
	env := func(vars map[string]string) func(string) string { return func(k string) string { return vars[k] } }
	m, err := New(Options{Getenv: env(map[string]string{"STATSD_PORT": "9999"})})
	if err != nil || m.statsd != nil {
		t.Errorf("without STATSD_HOST: statsd %v, err %v; want off", m.statsd, err)
	}
	if _, err := New(Options{Getenv: env(map[string]string{"STATSD_HOST": "127.0.0.1", "STATSD_PORT": "statsd"})}); err == nil {
		t.Error("STATSD_PORT=statsd accepted")
	}
}

// TestStatsdPackets sends to a UDP listener and reads nodepool's names back.
func TestStatsdPackets(t *testing.T) {
	sd := testenv.NewStatsd(t)
	m, err := New(Options{Getenv: sd.Getenv("site")})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	path := filepath.Join(t.TempDir(), "ubuntu-1.qcow2")
	if err := os.WriteFile(path, make([]byte, 64<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	size, _ := diskSize(path)
	m.DIBBuilt(DIBBuild{Image: "ubuntu", Ran: true, Duration: 2500 * time.Millisecond, Files: map[string]string{"qcow2": path}})
	m.Uploaded("ubuntu", "cloud-a", 64<<10, 1200*time.Millisecond, nil)
	m.Uploaded("ubuntu", "cloud-b", 64<<10, time.Second, errors.New("a failed upload sends nothing"))
	m.DIBBuilt(DIBBuild{Image: "ubuntu", Ran: true, ExitCode: -15, Duration: time.Second,
		Err: fmt.Errorf("cancelled (%w) and killed", context.Canceled)})

	want := []string{
		"site.nodepool.dib_image_build.ubuntu.status.rc:0|g",
		"site.nodepool.dib_image_build.ubuntu.status.duration:2500|ms",
		"site.nodepool.dib_image_build.ubuntu.status.last_build:*",
		fmt.Sprintf("site.nodepool.dib_image_build.ubuntu.qcow2.size:%d|g", size),
		"site.nodepool.image_update.ubuntu.cloud-a:1200|ms",
		"site.nodepool.image_update.ubuntu.cloud-a:1|c",
	}
	got := sd.Wait(t, 5*time.Second, want...)
	if len(got) != len(want) {
		t.Errorf("statsd lines = %q, want one each of %q", got, want)
	}
	for _, l := range got {
		if strings.HasPrefix(l, "site.nodepool.dib_image_build.ubuntu.status.last_build:") {
			v, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimPrefix(l, "site.nodepool.dib_image_build.ubuntu.status.last_build:"), "|g"), 10, 64)
			if err != nil || time.Since(time.Unix(v, 0)) > time.Minute || !strings.HasSuffix(l, "|g") {
				t.Errorf("last_build line %q: want a gauge of the Unix time now", l)
			}
		}
	}
	if extra := sd.Quiet(200 * time.Millisecond); len(extra) > 0 {
		t.Errorf("more statsd lines than nodepool sends (a failed upload and a build killed at a stop send none): %q", extra)
	}
}
