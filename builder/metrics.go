package builder

import (
	"context"
	"fmt"

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

// sendImageStates sends nodepool 11's builder gauges, as its cleanup worker
// does after each of its passes: for every image of the state and every image
// this builder makes, whether this builder is building it, or has its builds
// paused; for every provider this builder uploads an image to, whether it is
// uploading it there, or has its uploads paused there; and which build
// requests are pending. Nothing is read while statsd is off.
func (b *Builder) sendImageStates(ctx context.Context) error {
	m := b.opts.Metrics
	if !m.SendsStatsd() {
		return nil
	}
	p := b.cur.Load()
	names, err := b.store.ImageNames(ctx)
	if err != nil {
		return fmt.Errorf("statsd: list the images: %w", err)
	}
	paused, err := b.store.Paused(ctx)
	if err != nil {
		return fmt.Errorf("statsd: read paused images: %w", err)
	}
	requests, err := b.store.BuildRequests(ctx)
	if err != nil {
		return fmt.Errorf("statsd: read build requests: %w", err)
	}
	building, err := b.store.Builds(ctx, store.BuildFilter{State: store.Building})
	if err != nil {
		return fmt.Errorf("statsd: list builds: %w", err)
	}
	s := metrics.ImageStates{Images: names, Paused: map[string]bool{}, Providers: map[string]map[string]bool{},
		Requested: map[string]bool{}}
	for _, src := range p.sources {
		for image := range src.Images() {
			s.Images = append(s.Images, image)
			s.Paused[image] = len(store.PausedBy(paused, image, p.cfg.PausedInConfig(image))) > 0
		}
	}
	for _, pr := range p.cfg.Providers {
		for _, pi := range pr.DiskImages {
			if s.Providers[pi.Name] == nil {
				s.Providers[pi.Name] = map[string]bool{}
			}
			s.Providers[pi.Name][pr.Name] = pi.Pause
		}
	}
	for image, at := range requests {
		s.Requested[image] = !store.RequestTaken(building, image, at)
	}
	m.SendImageStates(s)
	return nil
}
