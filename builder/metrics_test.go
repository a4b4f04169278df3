package builder

import (
	"context"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/metrics"
	"github.com/nodepool-builder/nodepool-builder/metrics/metricstest"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/store/zookeeper"
)

// TestMetricsReadGearmanAndState: the daemon's metrics read the state and the
// link to a real gearmand at each scrape, as they are then.
func TestMetricsReadGearmanAndState(t *testing.T) {
	gd := testenv.NewGearmand(t)
	r := newRig(t, twoImages+"builder:\n  gearman-servers: [{host: "+gd.Host+", port: "+strconv.Itoa(gd.Port)+"}]\n")
	m, err := metrics.New(metrics.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r.b.opts.Metrics = m
	r.b.watchMetrics()
	r.run()
	value := func(name string, labels ...string) func() float64 {
		return func() float64 {
			v, _ := metricstest.Scrape(t, m.Handler()).Value(name, labels...)
			return v
		}
	}
	connected := value("nodepool_builder_gearman_connected", "server", gd.Addr)
	testenv.WaitFor(t, 10*time.Second, "gearman_connected 1", func() bool { return connected() == 1 })

	r.build("img-a")
	ready := value("nodepool_builder_uploads", "image", "img-a", "provider", "pa", "state", "ready")
	testenv.WaitFor(t, 10*time.Second, "a ready upload counted", func() bool { return ready() == 1 })

	if err := gd.Stop(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "gearman_connected 0 with gearmand stopped", func() bool { return connected() == 0 })
	if err := gd.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "gearman_connected 1 again", func() bool { return connected() == 1 })
}

// TestMetricsReadZooKeeperSession: with the state in a real ZooKeeper, the
// daemon's metrics tell whether its session is there, at each scrape.
func TestMetricsReadZooKeeperSession(t *testing.T) {
	z := testenv.NewZooKeeper(t, testenv.ZooKeeperOptions{})
	ctx := context.Background()
	r := newRig(t, twoImages, func(o *Options) {
		zb, err := zookeeper.Open(ctx, zookeeper.Options{Servers: []string{z.Addr}, Chroot: "/metrics",
			Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
		if err != nil {
			t.Fatal(err)
		}
		st, err := store.Open(ctx, store.Options{ImagesDir: o.Config.ImagesDir, Backend: zb})
		if err != nil {
			zb.Close()
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		o.Store = st
	})
	m, err := metrics.New(metrics.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r.b.opts.Metrics = m
	r.b.watchMetrics()
	connected := func() float64 {
		v, _ := metricstest.Scrape(t, m.Handler()).Value("nodepool_builder_zookeeper_connected")
		return v
	}
	testenv.WaitFor(t, 10*time.Second, "zookeeper_connected 1", func() bool { return connected() == 1 })
	if err := z.Stop(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "zookeeper_connected 0 with ZooKeeper stopped", func() bool { return connected() == 0 })
}
