package builder

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/uploader"
	"github.com/nodepool-builder/nodepool-builder/uploader/openstack"
)

// OpenCloud opens the image service of a provider.
type OpenCloud func(ctx context.Context, p *config.Provider) (uploader.Cloud, error)

// OpenStack is the OpenCloud of the daemon: a provider's clouds.yaml entry,
// its warnings logged to log.
func OpenStack(log *slog.Logger) OpenCloud {
	return func(ctx context.Context, p *config.Provider) (uploader.Cloud, error) {
		return openstack.Open(ctx, openstack.Options{Cloud: p.Cloud, Region: p.RegionName, Logger: log})
	}
}

// OpenClouds opens the image services of providers, by provider name.
// Providers of one clouds.yaml entry and region share its client: one login,
// and one listing per leak sweep. A provider that sets no image-format takes
// its cloud's, written into providers: the format a provider takes is part of
// what images need, settled once its cloud is open.
func OpenClouds(ctx context.Context, providers []config.Provider, open OpenCloud) (map[string]uploader.Cloud, error) {
	clouds := map[string]uploader.Cloud{}
	opened := map[[2]string]uploader.Cloud{}
	for i := range providers {
		p := &providers[i]
		key := [2]string{p.Cloud, p.RegionName}
		cloud, ok := opened[key]
		if !ok {
			var err error
			if cloud, err = open(ctx, p); err != nil {
				return nil, fmt.Errorf("provider %s: %w", p.Name, err)
			}
			opened[key] = cloud
		}
		if p.ImageFormat == "" {
			if f, ok := cloud.(interface{ ImageFormat() string }); ok {
				p.ImageFormat = config.NormalizeFormat(f.ImageFormat())
			}
		}
		clouds[p.Name] = cloud
	}
	return clouds, nil
}
