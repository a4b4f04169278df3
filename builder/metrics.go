package builder

import (
	"context"

	"github.com/nodepool-builder/nodepool-builder/metrics"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// watchMetrics has the metrics read the state, and the ZooKeeper session when
// the state is there, at every scrape.
func (b *Builder) watchMetrics() {
	m := b.opts.Metrics
	m.WatchState(func(ctx context.Context) ([]store.Build, []store.Upload, error) {
		builds, err := b.store.Builds(ctx, store.BuildFilter{})
		if err != nil {
			return nil, nil, err
		}
		uploads, err := b.store.Uploads(ctx, store.UploadFilter{})
		return builds, uploads, err
	})
	if sess := b.store.Session(); sess != nil {
		m.WatchZooKeeper(sess.Connected)
	}
}

// links are the connections to the gearman servers, for the metrics.
func (g *gearmanService) links() []metrics.Link {
	var out []metrics.Link
	for _, s := range g.w.Status().Servers {
		out = append(out, metrics.Link{Server: s.Address, Connected: s.Connected})
	}
	return out
}
