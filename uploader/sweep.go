package uploader

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/metrics"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// Leak is a cloud image tagged with this builder's id that the store does not hold.
type Leak struct {
	Provider string
	Image    CloudImage
}

// ListError is a provider whose cloud images could not all be listed: the
// leaks Leaks returns with it lack some or all of that provider's.
type ListError struct {
	Provider string
	Err      error
}

func (e *ListError) Error() string { return fmt.Sprintf("list images of %s: %v", e.Provider, e.Err) }
func (e *ListError) Unwrap() error { return e.Err }

// Leaks lists, per provider (all when provider is empty; each cloud listed
// once, the clouds in parallel), the cloud images this builder tagged whose
// upload the store does not hold. A provider whose cloud cannot be listed is
// a *ListError, joined with the others', and the leaks of the rest are still
// returned.
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
	lists, errs := u.list(ctx, providers)
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

// list lists, for each provider, the cloud images this builder made for it,
// the clouds in parallel. Providers that share a cloud client share one
// listing of it, whose images go to the provider each names; with one
// provider on a cloud, the cloud filters by provider itself.
func (u *Uploader) list(ctx context.Context, providers []*config.Provider) ([][]CloudImage, []error) {
	type group struct {
		cloud   Cloud
		members map[string]int // provider name: index in providers
	}
	var groups []*group
	shared := map[Cloud]*group{}
	for i, p := range providers {
		c := u.opts.Clouds[p.Name]
		// Only a client of a comparable type can be a map key.
		comparable := reflect.TypeOf(c).Comparable()
		if comparable && shared[c] != nil {
			shared[c].members[p.Name] = i
			continue
		}
		g := &group{cloud: c, members: map[string]int{p.Name: i}}
		groups = append(groups, g)
		if comparable {
			shared[c] = g
		}
	}
	lists := make([][]CloudImage, len(providers))
	errs := make([]error, len(providers))
	var wg sync.WaitGroup
	for _, g := range groups {
		wg.Go(func() {
			cctx, cancel := u.cloudCtx(ctx)
			defer cancel()
			match := map[string]string{PropBuilderID: u.opts.Store.BuilderID()}
			if len(g.members) == 1 {
				for name := range g.members {
					match[PropProvider] = name
				}
			}
			imgs, err := g.cloud.List(cctx, match)
			for name, i := range g.members {
				if err != nil {
					errs[i] = &ListError{Provider: name, Err: err}
				}
			}
			for _, img := range imgs {
				// Providers may share a cloud: each sweeps only the images
				// made for it.
				i, ok := g.members[img.Properties[PropProvider]]
				if !ok {
					continue
				}
				// Anyone may tag an image of theirs that the credentials
				// reach with this builder's id: it is not the builder's.
				if err := ownedByProject(cctx, g.cloud, img); errors.Is(err, errOtherProject) {
					if _, said := u.notOurs.LoadOrStore("sweep@"+img.Properties[PropProvider]+"@"+img.ID, true); !said {
						u.log.Warn("leaving a cloud image tagged with this builder's id that is not the builder's; check who made it",
							"provider", img.Properties[PropProvider], "external_id", img.ID, "name", img.Name, "reason", err)
					}
					continue
				} else if err != nil {
					errs[i] = &ListError{Provider: img.Properties[PropProvider], Err: err}
					continue
				}
				lists[i] = append(lists[i], img)
			}
		})
	}
	wg.Wait()
	return lists, errs
}

// Sweep deletes leaked images: tagged with this builder's id, unknown to the store,
// and seen so on two sweeps in a row (so an upload whose record is being written
// is never taken for a leak). Images of an image this builder is not
// responsible for (named by nodepool_image_name, neither in its config nor built
// by it) are left alone, as every other record of such an image is;
// alien-image-list still shows them. It does nothing when builder.leak-sweep
// is off.
func (u *Uploader) Sweep(ctx context.Context) error {
	if !u.opts.Config.Builder.LeakSweep {
		return nil
	}
	start := u.opts.Now()
	leaks, err := u.Leaks(ctx, "")
	var errs []error
	if err != nil {
		u.opts.Metrics.Failed(metrics.StepSweep, err)
		errs = append(errs, err)
	}
	resp, err := u.responsibility(ctx)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	leaks = slices.DeleteFunc(leaks, func(l Leak) bool {
		image, named := l.Image.Properties[PropImage]
		if !named || resp.image(image) {
			return false
		}
		u.log.Debug("leaving a cloud image of an image this builder is not responsible for",
			"provider", l.Provider, "external_id", l.Image.ID, "image", image)
		return true
	})
	byProvider := map[string]map[string]bool{}
	for _, p := range u.opts.Config.Providers {
		byProvider[p.Name] = map[string]bool{}
	}
	last, err := u.lastImages(ctx, leaks)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, l := range leaks {
		byProvider[l.Provider][l.Image.ID] = true
		if last[l.Provider+"\x00"+l.Image.ID] {
			u.log.Warn("keeping a cloud image unknown to the store: it is the newest active image of its image in "+
				"this provider, and the store holds no ready upload there (was the state lost?); it goes once one is ready",
				"provider", l.Provider, "external_id", l.Image.ID, "name", l.Image.Name, "image", l.Image.Properties[PropImage])
			continue
		}
		first, err := u.opts.Store.LeakMark(ctx, l.Provider, l.Image.ID)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !first.Before(start) {
			u.opts.Metrics.LeakFound(l.Provider)
			u.log.Info("cloud image unknown to the store; deleting it if still so on the next sweep",
				"provider", l.Provider, "external_id", l.Image.ID, "name", l.Image.Name)
			continue
		}
		cctx, cancel := u.cloudCtx(ctx)
		err = u.opts.Clouds[l.Provider].Delete(cctx, l.Image.ID)
		cancel()
		if err != nil {
			u.opts.Metrics.Failed(metrics.StepSweep, err)
			errs = append(errs, fmt.Errorf("delete leaked image %s in %s: %w", l.Image.ID, l.Provider, err))
			continue
		}
		u.opts.Metrics.LeakDeleted(l.Provider)
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

// lastImages picks, among leaked images, those the sweep must keep: for each
// (image, provider) for which the store holds no ready upload, the newest active
// leaked image. With the state lost, every image the builder made looks leaked;
// this keeps a provider from losing the last image it can boot. Images made
// before they carried nodepool_image_name count as one image per provider.
func (u *Uploader) lastImages(ctx context.Context, leaks []Leak) (map[string]bool, error) {
	ready, err := u.opts.Store.Uploads(ctx, store.UploadFilter{State: store.Ready})
	if err != nil {
		return nil, err
	}
	served := map[string]bool{}
	for _, up := range ready {
		served[up.Provider+"\x00"+up.Image] = true
	}
	newest := map[string]CloudImage{}
	for _, l := range leaks {
		k := l.Provider + "\x00" + l.Image.Properties[PropImage]
		if served[k] || l.Image.Status != "active" {
			continue
		}
		if cur, ok := newest[k]; !ok || l.Image.Created.After(cur.Created) ||
			(l.Image.Created.Equal(cur.Created) && l.Image.ID > cur.ID) {
			newest[k] = l.Image
		}
	}
	keep := map[string]bool{}
	for k, img := range newest {
		provider, _, _ := strings.Cut(k, "\x00")
		keep[provider+"\x00"+img.ID] = true
	}
	return keep, nil
}
