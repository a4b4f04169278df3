package uploader

import (
	"context"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// responsibility says which records this builder may release, delete or
// rewrite. The state may be shared with other builders (Python nodepool-builders
// among them) whose configs differ from this one, so every such decision asks
// it first. The rule is nodepool's (_cleanupImage): a builder that neither has
// an image in its config nor a build of it was never responsible for it, and
// ignores it. Narrower than nodepool: of an image that left this config, only
// this builder's own builds and their uploads are acted on; another builder that
// still makes the image keeps its builds and uploads. Uploads to a provider not
// in this config are never touched: nothing here can reach that cloud, and it
// is another builder's.
type responsibility struct {
	configured map[string]bool // images of this config
	providers  map[string]bool // providers of this config
	builderID  string
	ownBuild   map[string]bool // build ids of this builder's builds
	ownImage   map[string]bool // images with a build of this builder
}

// responsibility reads who made which build.
func (u *Uploader) responsibility(ctx context.Context) (responsibility, error) {
	builds, err := u.opts.Store.Builds(ctx, store.BuildFilter{})
	if err != nil {
		return responsibility{}, err
	}
	return responsibleFor(u.opts.Config, u.opts.Store.BuilderID(), builds), nil
}

// responsibleFor is the responsibility of builder builderID with config cfg,
// given all the builds of the state.
func responsibleFor(cfg *config.Config, builderID string, builds []store.Build) responsibility {
	r := responsibility{
		configured: map[string]bool{},
		providers:  map[string]bool{},
		builderID:  builderID,
		ownBuild:   map[string]bool{},
		ownImage:   map[string]bool{},
	}
	for _, name := range cfg.ImageNames() {
		r.configured[name] = true
	}
	for _, p := range cfg.Providers {
		r.providers[p.Name] = true
	}
	for _, b := range builds {
		if b.BuilderID == r.builderID {
			r.ownBuild[b.ID] = true
			r.ownImage[b.Image] = true
		}
	}
	return r
}

// image tells whether this builder is, or was, responsible for an image: it is
// in the config, or this builder has a build of it.
func (r responsibility) image(name string) bool { return r.configured[name] || r.ownImage[name] }

// build tells whether this builder may release or delete a build: one of an
// image in its config, or one it made.
func (r responsibility) build(b store.Build) bool {
	return r.configured[b.Image] || b.BuilderID == r.builderID
}

// upload tells whether this builder may release, delete or settle an upload: to
// a provider in its config, of an image in its config or of a build it made.
func (r responsibility) upload(up store.Upload) bool {
	return r.providers[up.Provider] && (r.configured[up.Image] || r.ownBuild[up.BuildID])
}
