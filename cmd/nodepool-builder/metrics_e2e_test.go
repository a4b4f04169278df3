package main

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/builder"
	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/metrics"
	"github.com/nodepool-builder/nodepool-builder/metrics/metricstest"
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
	before := metricstest.Scrape(t, m.Handler())
	e.addBuild(e.makeImage(2), zuultest.BuildSpec{})
	if err := b.Once(ctx); err != nil {
		t.Fatal(err)
	}
	after := metricstest.Scrape(t, m.Handler())

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
		b, _ := before.Value(c.name, c.labels...)
		a, ok := after.Value(c.name, c.labels...)
		if b != c.before || !ok || (c.grew && a <= b) || (!c.grew && a != b) {
			t.Errorf("%s%v: %v before, %v after (present %v); want %v before, grown %v", c.name, c.labels, b, a, ok, c.before, c.grew)
		}
	}
	if n, _ := after.Value("nodepool_builder_uploads", append(q, "state", "ready")...); n != 2 {
		t.Errorf("ready uploads to cloud-q after the second build: %v, want 2", n)
	}
	if age, ok := after.Value("nodepool_builder_upload_age_seconds", q...); !ok || age > 60 {
		t.Errorf("age of the newest ready upload to cloud-q: %v (present %v), want under a minute", age, ok)
	}
	if _, ok := after.Value("nodepool_builder_last_successful_poll_timestamp_seconds", "image", "debian"); !ok {
		t.Error("no successful poll recorded")
	}
}
