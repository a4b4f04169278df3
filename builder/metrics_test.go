package builder

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/metrics"
	"github.com/nodepool-builder/nodepool-builder/metrics/metricstest"
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
