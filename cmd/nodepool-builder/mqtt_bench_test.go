package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

// BenchmarkNewBuildLatency is how long a new build of a zuul-image waits
// before its download starts: reported over MQTT (from mosquitto_pub starting
// to the download starting, poll-interval 600), and found by polling alone at
// the default poll-interval of 60 s, the build made at a random moment of the
// interval. Each reports its mean and its worst latency. The builds are of
// benchImages zuul-images in turn, as a fleet's are: one zuul-image reported
// again and again within seconds would measure the bound on its polls (two
// at once, then one every 30 s) instead.
func BenchmarkNewBuildLatency(b *testing.B) {
	b.Run("mqtt-report", func(b *testing.B) { benchNewBuildLatency(b, true) })
	b.Run("poll-60s", func(b *testing.B) { benchNewBuildLatency(b, false) })
}

// benchImages is how many zuul-images BenchmarkNewBuildLatency's builds are of.
const benchImages = 32

func benchNewBuildLatency(b *testing.B, report bool) {
	testenv.RequireBinary(b, "qemu-img")
	zuul := zuultest.NewServer(zuultest.ServerOptions{Tenant: "example"})
	b.Cleanup(zuul.Close)
	dir := b.TempDir()
	raw := filepath.Join(dir, "disk.raw")
	data := make([]byte, 2<<20)
	for i := range 1 << 20 {
		data[i] = byte(rand.N(256))
	}
	if err := os.WriteFile(raw, data, 0o644); err != nil {
		b.Fatal(err)
	}
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "images-dir: %s\nzuul-images:\n", filepath.Join(dir, "images"))
	for i := range benchImages {
		fmt.Fprintf(&cfg, "  - name: img-%d\n    api-url: %s\n    tenant: example\n    project: org/images\n"+
			"    job: build-img-%d\n    formats: [raw]\n", i, zuul.URL(), i)
		if report {
			cfg.WriteString("    poll-interval: 600\n")
		}
	}
	var broker *testenv.Mosquitto
	if report {
		broker = testenv.NewMosquitto(b, testenv.MosquittoOptions{})
		cfg.WriteString("builder:\n  zuul-mqtt:\n    url: " + broker.URL + "\n")
	}
	path := filepath.Join(dir, "nodepool.yaml")
	if err := os.WriteFile(path, []byte(cfg.String()), 0o644); err != nil {
		b.Fatal(err)
	}
	logs := &testenv.Buffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() { done <- run(ctx, []string{"nodepool-builder", "-c", path}, logs, logs) }()
	b.Cleanup(func() {
		cancel()
		if code := <-done; code != 0 {
			b.Errorf("the daemon exited %d:\n%s", code, logs.String())
		}
	})
	polls := benchImages
	if report {
		polls *= 2 // and the ones after the connect
	}
	testenv.WaitFor(b, 30*time.Second, "the daemon's first polls", func() bool { return len(zuul.BuildsCalls()) >= polls }, logs.String)

	var total, worst time.Duration
	b.ResetTimer()
	for i := range b.N {
		image := fmt.Sprintf("img-%d", i%benchImages)
		if !report {
			// A build is made at any moment of the poll-interval: its
			// arrival, not a wait for the daemon.
			time.Sleep(rand.N(60 * time.Second))
		}
		zb, err := zuul.AddBuild(zuultest.BuildSpec{Job: "build-" + image, Artifacts: []zuultest.ArtifactSpec{
			{Name: "raw", Path: raw, Metadata: map[string]any{"type": "zuul_image", "format": "raw"}}}})
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		if report {
			topic, payload, err := zuul.MQTTReport(zb.UUID)
			if err != nil {
				b.Fatal(err)
			}
			start = time.Now()
			broker.Publish(b, topic, payload)
		}
		var at time.Time
		testenv.WaitFor(b, 2*time.Minute, "the download of "+zb.UUID, func() bool {
			var ok bool
			at, ok = logLineTime(b, logs.String(), `msg="new Zuul build"`, "zuul_build="+zb.UUID)
			return ok
		}, logs.String)
		latency := at.Sub(start)
		total += latency
		worst = max(worst, latency)
		// The step is done once its one file is: the next build finds the loop waiting.
		testenv.WaitFor(b, time.Minute, "the download of "+zb.UUID+" to complete", func() bool {
			return strings.Contains(logs.String(), "key="+image+"-zuul-"+zb.UUID+".raw")
		}, logs.String)
	}
	b.StopTimer()
	b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms-mean-latency")
	b.ReportMetric(float64(worst.Milliseconds()), "ms-worst-latency")
}

var benchLogTime = regexp.MustCompile(`^time=(\S+) `)

// logLineTime is the time of the first line of logs that holds every one of parts.
func logLineTime(tb testing.TB, logs string, parts ...string) (time.Time, bool) {
	tb.Helper()
lines:
	for _, line := range strings.Split(logs, "\n") {
		for _, p := range parts {
			if !strings.Contains(line, p) {
				continue lines
			}
		}
		m := benchLogTime.FindStringSubmatch(line)
		if m == nil {
			tb.Fatalf("a log line without its time: %s", line)
		}
		at, err := time.Parse("2006-01-02T15:04:05.000Z07:00", m[1])
		if err != nil {
			tb.Fatalf("the time of log line %q: %v", line, err)
		}
		return at, true
	}
	return time.Time{}, false
}
