package config

import (
	"slices"
	"time"
)

// OwnPath is the file that holds the builder's own settings (builder,
// zuul-images), as messages name it: nodepool-builder.yaml, or nodepool.yaml
// in a one-file config.
func (c *Config) OwnPath() string {
	if c.BuilderPath != "" {
		return c.BuilderPath
	}
	return c.Path
}

// DiskImage returns the concrete diskimage called name, or nil.
func (c *Config) DiskImage(name string) *DiskImage {
	for i := range c.DiskImages {
		if c.DiskImages[i].Name == name {
			return &c.DiskImages[i]
		}
	}
	return nil
}

// ZuulImage returns the zuul-image called name, or nil.
func (c *Config) ZuulImage(name string) *ZuulImage {
	for i := range c.ZuulImages {
		if c.ZuulImages[i].Name == name {
			return &c.ZuulImages[i]
		}
	}
	return nil
}

// Provider returns the openstack provider called name, or nil.
func (c *Config) Provider(name string) *Provider {
	for i := range c.Providers {
		if c.Providers[i].Name == name {
			return &c.Providers[i]
		}
	}
	return nil
}

// ImageNames lists every image this builder makes: diskimages, then
// zuul-images, each in file order.
func (c *Config) ImageNames() []string {
	names := make([]string, 0, len(c.DiskImages)+len(c.ZuulImages))
	for _, d := range c.DiskImages {
		names = append(names, d.Name)
	}
	for _, z := range c.ZuulImages {
		names = append(names, z.Name)
	}
	return names
}

// ProvidersFor lists the providers whose diskimages name image, paused
// entries included, in file order.
func (c *Config) ProvidersFor(image string) []*Provider {
	var out []*Provider
	for i := range c.Providers {
		if c.Providers[i].Entry(image) != nil {
			out = append(out, &c.Providers[i])
		}
	}
	return out
}

// NeededFormats is the set of formats an image must be built or fetched in:
// its own formats and the format of every provider that lists it. Paused
// entries count, so that un-pausing needs no new build. The result is sorted;
// it is nil for an unknown image.
func (c *Config) NeededFormats(image string) []string {
	var formats []string
	switch {
	case c.DiskImage(image) != nil:
		formats = slices.Clone(c.DiskImage(image).Formats)
	case c.ZuulImage(image) != nil:
		formats = slices.Clone(c.ZuulImage(image).Formats)
	default:
		return nil
	}
	for _, p := range c.ProvidersFor(image) {
		formats = append(formats, p.Format())
	}
	slices.Sort(formats)
	return slices.Compact(formats)
}

// FetchedByClouds tells whether a format of zuul-image image is needed only by
// providers whose clouds fetch the image's artifact themselves (upload-method
// web-download), paused ones included: not among the image's own formats, and
// listed by at least one provider. Such a format need not be downloaded.
func (c *Config) FetchedByClouds(image, format string) bool {
	zi := c.ZuulImage(image)
	if zi == nil || slices.Contains(zi.Formats, format) {
		return false
	}
	any := false
	for _, p := range c.ProvidersFor(image) {
		if p.Format() != format {
			continue
		}
		if c.Builder.UploadMethod(p.Name) != UploadWebDownload {
			return false
		}
		any = true
	}
	return any
}

// Format is the disk format uploads to this provider use: image-format when
// set, else qcow2.
func (p *Provider) Format() string {
	if p.ImageFormat != "" {
		return p.ImageFormat
	}
	return DefaultImageFormat
}

// UploadTimeout bounds one upload attempt to this provider, its post-upload
// hook included: image-upload-timeout, or DefaultImageUploadTimeout when it is
// not set (a Provider made in code rather than parsed).
func (p *Provider) UploadTimeout() time.Duration {
	if p.ImageUploadTimeout > 0 {
		return p.ImageUploadTimeout
	}
	return DefaultImageUploadTimeout
}

// Entry returns the provider's entry for image, or nil when it does not list it.
func (p *Provider) Entry(name string) *ProviderImage {
	for i := range p.DiskImages {
		if p.DiskImages[i].Name == name {
			return &p.DiskImages[i]
		}
	}
	return nil
}

// PausedInConfig tells whether the config pauses an image (pause: true on its
// diskimage or zuul-image).
func (c *Config) PausedInConfig(name string) bool {
	if di := c.DiskImage(name); di != nil {
		return di.Pause
	}
	if zi := c.ZuulImage(name); zi != nil {
		return zi.Pause
	}
	return false
}
