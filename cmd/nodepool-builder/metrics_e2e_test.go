package main

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/nodepool-builder/nodepool-builder/builder"
	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/metrics"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

// TestMetricsFollowUploadsToGlance uploads to a real Glance twice: --once with
// STATSD_HOST set sends nodepool's image_update names for each ready upload;
// then a builder in-process with Metrics shows, scraped before and after its
// pass, the uploads, bytes and durations growing.
func TestMetricsFollowUploadsToGlance(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	sd := testenv.NewStatsd(t)
	t.Setenv("STATSD_HOST", sd.Host)
	t.Setenv("STATSD_PORT", sd.Port)
	e.addBuild(e.makeImage(1), zuultest.BuildSpec{})
	e.once(0)
	want := []string{
		"nodepool.image_update.debian.cloud-q:*", "nodepool.image_update.debian.cloud-q:1|c",
		"nodepool.image_update.debian.cloud-r:*", "nodepool.image_update.debian.cloud-r:1|c",
	}
	got := sd.Wait(t, 10*time.Second, want...)
	if extra := sd.Quiet(200 * time.Millisecond); len(got) != len(want) || len(extra) > 0 {
		t.Errorf("statsd lines = %q then %q, want a timer and a counter per provider, nothing for the download", got, extra)
	}

	ctx := context.Background()
	cfg, err := config.Load(e.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	st, err := builder.OpenState(ctx, cfg, builder.StateOptions{Access: store.Create, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	m, err := metrics.New(metrics.Options{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	b, err := builder.New(ctx, builder.Options{Config: cfg, Store: st, Logger: log, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	before := scrapeMetrics(t, m)
	e.addBuild(e.makeImage(2), zuultest.BuildSpec{})
	if err := b.Once(ctx); err != nil {
		t.Fatal(err)
	}
	after := scrapeMetrics(t, m)

	q := []string{"image", "debian", "provider", "cloud-q"}
	for _, c := range []struct {
		name   string
		labels []string
		before float64 // the value before the pass, exactly
		grew   bool    // after > before; else after == before
	}{
		// The first run's uploads, read from the state at the scrape.
		{"nodepool_builder_uploads", append(q, "state", "ready"), 1, true},
		{"nodepool_builder_builds", []string{"image", "debian", "source", "zuul", "state", "ready"}, 1, true},
		{"nodepool_builder_uploaded_bytes_total", q, 0, true},
		{"nodepool_builder_upload_duration_seconds", append(q, "state", "ready"), 0, true},
		{"nodepool_builder_downloaded_bytes_total", []string{"image", "debian"}, 0, true},
		{"nodepool_builder_download_duration_seconds", []string{"image", "debian", "state", "ready"}, 0, true},
		{"nodepool_builder_state_up", nil, 1, false},
	} {
		b, _ := metricValue(before, c.name, c.labels...)
		a, ok := metricValue(after, c.name, c.labels...)
		if b != c.before || !ok || (c.grew && a <= b) || (!c.grew && a != b) {
			t.Errorf("%s%v: %v before, %v after (present %v); want %v before, grown %v", c.name, c.labels, b, a, ok, c.before, c.grew)
		}
	}
	if n, _ := metricValue(after, "nodepool_builder_uploads", append(q, "state", "ready")...); n != 2 {
		t.Errorf("ready uploads to cloud-q after the second build: %v, want 2", n)
	}
	if age, ok := metricValue(after, "nodepool_builder_upload_age_seconds", q...); !ok || age > 60 {
		t.Errorf("age of the newest ready upload to cloud-q: %v (present %v), want under a minute", age, ok)
	}
	if _, ok := metricValue(after, "nodepool_builder_last_successful_poll_timestamp_seconds", "image", "debian"); !ok {
		t.Error("no successful poll recorded")
	}
}

// scrapeMetrics gets /metrics from m's handler and parses it as Prometheus does.
func scrapeMetrics(t *testing.T, m *metrics.Metrics) map[string]*dto.MetricFamily {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(rec.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// metricValue is the value of a family's series with exactly these labels (a
// histogram's: its count); ok false when there is none.
func metricValue(fams map[string]*dto.MetricFamily, name string, labels ...string) (float64, bool) {
	for _, m := range fams[name].GetMetric() {
		if len(m.GetLabel())*2 != len(labels) {
			continue
		}
		match := true
		for i, l := range m.GetLabel() {
			// The exposition sorts labels by name; so must the caller.
			if l.GetName() != labels[2*i] || l.GetValue() != labels[2*i+1] {
				match = false
			}
		}
		if !match {
			continue
		}
		switch {
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}
