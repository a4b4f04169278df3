package source

import (
	"context"
	"errors"

	"github.com/nodepool-builder/nodepool-builder/store"
)

// Recover settles this builder's builds that no step of this runner is on
// but that are recorded building: a builder that stopped or crashed left them.
// Under the image's build lock, each one's source abandons it (stops what it
// left running), then it is recorded failed, InterruptedReason, and its files
// are removed. sources are the sources of the config in force, by name; a
// build of a source no longer there is settled all the same.
func (r *Runner) Recover(ctx context.Context, sources map[store.SourceName]Source) error {
	st := r.opts.Store
	builds, err := st.Builds(ctx, store.BuildFilter{State: store.Building})
	if err != nil {
		return err
	}
	var errs []error
	for _, bd := range builds {
		if bd.BuilderID != st.BuilderID() || r.Busy(bd.Image) {
			continue
		}
		// The image's build lock: a step of this builder holds it while it
		// makes a build.
		lctx, unlock, err := st.Hold(ctx, store.LockKey{Image: bd.Image})
		if errors.Is(err, store.ErrHeld) {
			continue
		}
		if err == nil {
			err = r.recover(lctx, sources[bd.Source], bd)
			unlock()
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// recover settles one build left building, under its image's lock.
func (r *Runner) recover(ctx context.Context, src Source, bd store.Build) error {
	// Read again under the lock: a step that finished before it was taken
	// changed the record.
	cur, err := r.opts.Store.Build(ctx, bd.ID)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if cur.State != store.Building || cur.Version != bd.Version {
		return nil
	}
	if src != nil {
		if err := src.Abandon(ctx, cur); err != nil {
			return err
		}
	}
	r.log.Warn("build was interrupted; removing its files", "build", cur.Name())
	if _, err := r.opts.Store.WriterOf(cur).Abort(ctx, InterruptedReason, nil); err != nil && !errors.Is(err, store.ErrConflict) {
		return err
	}
	return nil
}
