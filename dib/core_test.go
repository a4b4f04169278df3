package dib

import (
	"context"
	"errors"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/source"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// core is a Source as the builder runs it: through the core's one build path,
// with slots bounding the builds that run at once (nil: no bound).
type core struct {
	*Source
	run *source.Runner
}

func inCore(s *Source, slots chan struct{}) core {
	cfg := s.opts.Config
	return core{s, source.NewRunner(source.Options{Store: s.opts.Store, Config: func() *config.Config { return cfg },
		Logger: s.log, Slots: slots, Now: s.opts.Now})}
}

// Step is one step of the builder's loop on the image: a ready build when it
// made one.
func (c core) Step(ctx context.Context, image string) (*store.Build, error) {
	res, err := c.run.Step(ctx, c.Source, image)
	return res.Build, err
}

// BuildNow is an operator's request for a build.
func (c core) BuildNow(ctx context.Context, image, request string) (store.Build, error) {
	return c.run.BuildNow(ctx, c.Source, image, request, nil)
}

// Build is a build made now, whatever the schedule says.
func (c core) Build(ctx context.Context, image string) (store.Build, error) {
	return c.BuildNow(ctx, image, "")
}

// Due is why a step would build the image now; "" when it would not: it is
// busy, paused, not due, or held back by a failed build.
func (c core) Due(ctx context.Context, image string) (string, error) {
	paused, err := c.opts.Store.Paused(ctx)
	if err != nil {
		return "", err
	}
	if _, ok := paused[image]; ok || c.run.Busy(image) || c.opts.Config.PausedInConfig(image) {
		return "", nil
	}
	w, err := c.Source.Due(ctx, image, source.Look{})
	var back *HeldBack
	if errors.As(err, &back) {
		return "", nil
	}
	if w.Todo == nil {
		return "", err
	}
	return w.Todo.Reason, err
}
