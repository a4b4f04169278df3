package builder

import (
	"context"
	"errors"
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

// CheckImportMethods asks the cloud of every provider whose upload-method is
// an import whether it offers that method, as config-validate does when it can
// reach the clouds (Check touches no network). A cloud that answers that it
// does not is a problem, which names what it offers; one that cannot be asked
// is a warning, since the builder asks again before each upload.
func CheckImportMethods(ctx context.Context, cfg *config.Config, open OpenCloud) (problems []error, warnings []string) {
	for i := range cfg.Providers {
		p := &cfg.Providers[i]
		method := cfg.Builder.UploadMethod(p.Name)
		if method == config.UploadPut {
			continue
		}
		cloud, err := open(ctx, p)
		if err != nil {
			continue // Check says what is wrong with the cloud's entry
		}
		imp, ok := cloud.(uploader.Importer)
		if !ok {
			problems = append(problems, fmt.Errorf("provider %s: upload-method %s: its cloud client cannot import images", p.Name, method))
			continue
		}
		err = imp.CheckImportMethod(ctx, method)
		var notOffered *openstack.ImportMethodError
		switch {
		case errors.As(err, &notOffered):
			problems = append(problems, fmt.Errorf("provider %s: upload-method %s (builder.providers in %s): %w",
				p.Name, method, config.BuilderFileName, notOffered))
		case err != nil:
			warnings = append(warnings, fmt.Sprintf("provider %s: could not ask its cloud whether it offers upload-method %s "+
				"(the builder asks again before each upload): %v", p.Name, method, err))
		}
	}
	return problems, warnings
}
