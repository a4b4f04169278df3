package uploader

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// Leak is a cloud image tagged with this builder's id that the store does not hold.
type Leak struct {
	Provider string
	Image    Image
}

// Leaks lists, per provider (all when provider is empty, each listed in
// parallel), the cloud images this builder tagged whose upload the store does not
// hold.
func (u *Uploader) Leaks(ctx context.Context, provider string) ([]Leak, error) {
	// The clouds are listed before the store is read: an upload recorded while a
	// listing runs is then seen as live, never as a leak.
	var providers []*config.Provider
	for i := range u.opts.Config.Providers {
		p := &u.opts.Config.Providers[i]
		if _, ok := u.opts.Clouds[p.Name]; ok && (provider == "" || p.Name == provider) {
			providers = append(providers, p)
		}
	}
	lists := make([][]Image, len(providers))
	errs := make([]error, len(providers))
	var wg sync.WaitGroup
	for i, p := range providers {
		wg.Go(func() {
			cctx, cancel := u.cloudCtx(ctx)
			defer cancel()
			// Providers may share a cloud: each sweeps only the images made for it.
			imgs, err := u.opts.Clouds[p.Name].List(cctx, map[string]string{PropBuilderID: u.opts.Store.BuilderID(), PropProvider: p.Name})
			if err != nil {
				errs[i] = fmt.Errorf("list images of %s: %w", p.Name, err)
			}
			lists[i] = imgs
		})
	}
	wg.Wait()
	ups, err := u.opts.Store.Uploads(ctx, store.UploadFilter{})
	if err != nil {
		return nil, err
	}
	live := map[string]bool{}
	for _, up := range ups {
		if up.ExternalID != "" {
			live[up.Provider+"\x00"+up.ExternalID] = true
		}
	}
	var out []Leak
	for i, p := range providers {
		for _, img := range lists[i] {
			if !live[p.Name+"\x00"+img.ID] {
				out = append(out, Leak{Provider: p.Name, Image: img})
			}
		}
	}
	return out, errors.Join(errs...)
}

// Sweep deletes leaked images: tagged with this builder's id, unknown to the store,
// and seen so on two sweeps in a row (so an upload whose record is being written
// is never taken for a leak). It does nothing when builder.leak-sweep is off.
func (u *Uploader) Sweep(ctx context.Context) error {
	if !u.opts.Config.Builder.LeakSweep {
		return nil
	}
	start := u.opts.Now()
	leaks, err := u.Leaks(ctx, "")
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	byProvider := map[string]map[string]bool{}
	for _, p := range u.opts.Config.Providers {
		byProvider[p.Name] = map[string]bool{}
	}
	for _, l := range leaks {
		byProvider[l.Provider][l.Image.ID] = true
		first, err := u.opts.Store.LeakMark(ctx, l.Provider, l.Image.ID)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !first.Before(start) {
			u.log.Info("cloud image unknown to the store; deleting it if still so on the next sweep",
				"provider", l.Provider, "external_id", l.Image.ID, "name", l.Image.Name)
			continue
		}
		cctx, cancel := u.cloudCtx(ctx)
		err = u.opts.Clouds[l.Provider].Delete(cctx, l.Image.ID)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("delete leaked image %s in %s: %w", l.Image.ID, l.Provider, err))
			continue
		}
		u.log.Info("deleted leaked image", "provider", l.Provider, "external_id", l.Image.ID, "name", l.Image.Name)
		delete(byProvider[l.Provider], l.Image.ID)
	}
	for p, keep := range byProvider {
		if err := u.opts.Store.ClearLeakMarks(ctx, p, keep); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
