package builder

import (
	"context"

	"github.com/nodepool-builder/nodepool-builder/metrics"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// sessionBackend is a backend that holds a session to a server and tells whether
// it is connected: ZooKeeper's.
type sessionBackend interface{ Connected() bool }

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
	if zk, ok := b.store.Backend.(sessionBackend); ok {
		m.WatchZooKeeper(zk.Connected)
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
