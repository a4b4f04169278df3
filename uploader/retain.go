package uploader

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// Retain applies retention: per image the newest keep-builds ready builds stay, per
// (image, provider) the newest keep-uploads ready uploads stay, and an older build
// stays while one of its uploads does. Everything else is marked deleting, as are
// the uploads of images a provider no longer lists and the builds of images no
// longer in the config. Failed builds older than the image's newest build go too.
// Only records this builder is responsible for are touched (see responsibility).
// A pass that releases more uploads of an image in a provider than it keeps
// there (a config change that drops the image, say) says so at warning level.
func (u *Uploader) Retain(ctx context.Context) error {
	st := u.opts.Store
	builds, err := st.Builds(ctx, store.BuildFilter{})
	if err != nil {
		return err
	}
	uploads, err := st.Uploads(ctx, store.UploadFilter{})
	if err != nil {
		return err
	}
	plan := planRetention(u.opts.Config, st.BuilderID(), builds, uploads)
	return u.writeRetention(ctx, plan, uploads)
}

// retention is what a Retain pass changes, decided from what it read. Records
// are as read: the writes compare against their versions.
type retention struct {
	// uploads are marked deleting on their own, in this order.
	uploads []uploadRelease
	// forget are failed uploads that are history: their records go.
	forget []store.Upload
	// builds are marked deleting, each in one write with its uploads.
	builds []buildRelease
}

type uploadRelease struct {
	upload store.Upload
	why    string
}

type buildRelease struct {
	build store.Build
	why   string
	// uploads go deleting in the build's write, but for those the pass
	// released on their own: written twice, they would make it fail.
	uploads []store.Upload
}

// planRetention decides a Retain pass of builder builderID with config cfg from
// all the builds (newest first, as the store lists them) and uploads of the state.
func planRetention(cfg *config.Config, builderID string, builds []store.Build, uploads []store.Upload) retention {
	resp := responsibleFor(cfg, builderID, builds)
	created := map[string]time.Time{}
	for _, b := range builds {
		created[b.ID] = b.Created
	}
	var plan retention
	keptBuild := plan.releaseUploads(cfg, resp, uploads, created)
	plan.releaseBuilds(cfg, resp, builds, uploads, keptBuild)
	return plan
}

// releaseUploads plans, per image and provider, the uploads to release and the
// failed ones to forget; it returns the builds that stay because an upload of
// theirs does.
func (plan *retention) releaseUploads(cfg *config.Config, resp responsibility, uploads []store.Upload,
	created map[string]time.Time) (keptBuild map[string]bool) {
	keepUploads := max(cfg.Builder.KeepUploads, 1)
	upsBy := map[placement][]store.Upload{}
	for _, up := range uploads {
		k := placement{up.Image, up.Provider}
		upsBy[k] = append(upsBy[k], up)
	}
	release := func(up store.Upload, why string) {
		if up.State != store.Deleting && up.State != store.Uploading {
			plan.uploads = append(plan.uploads, uploadRelease{up, why})
		}
	}
	keptBuild = map[string]bool{}
	for _, k := range slices.SortedFunc(maps.Keys(upsBy), placement.compare) {
		ups := upsBy[k]
		p := cfg.Provider(k.provider)
		if p == nil {
			// Without its config the cloud can't be reached; its uploads wait.
			for _, up := range ups {
				keptBuild[up.BuildID] = true
			}
			continue
		}
		if !resp.configured[k.image] || p.Entry(k.image) == nil {
			why := "image no longer listed for this provider"
			if !resp.configured[k.image] {
				why = "image is no longer in the config"
			}
			for _, up := range ups {
				if up.State == store.Uploading {
					keptBuild[up.BuildID] = true
				}
				if resp.upload(up) {
					release(up, why)
				}
			}
			continue
		}
		sortUploadsNewestFirst(ups, created)
		kept := 0
		newestReady := time.Time{}
		for _, up := range ups {
			switch up.State {
			case store.Ready:
				if kept < keepUploads {
					kept++
					keptBuild[up.BuildID] = true
					if created[up.BuildID].After(newestReady) {
						newestReady = created[up.BuildID]
					}
				} else {
					release(up, fmt.Sprintf("more than keep-uploads (%d) ready uploads", keepUploads))
				}
			case store.Uploading:
				keptBuild[up.BuildID] = true
			}
		}
		// A failed upload is history once a newer upload is ready; one that
		// still holds its half-made image goes once Delete has deleted that.
		for _, up := range ups {
			if up.State == store.Failed && up.ExternalID == "" && !newestReady.IsZero() && !created[up.BuildID].After(newestReady) {
				plan.forget = append(plan.forget, up)
			}
		}
	}
	return keptBuild
}

// releaseBuilds plans, per image, the builds to release with their uploads.
func (plan *retention) releaseBuilds(cfg *config.Config, resp responsibility, builds []store.Build, uploads []store.Upload,
	keptBuild map[string]bool) {
	keepBuilds := max(cfg.Builder.KeepBuilds, 1)
	byImage := map[string][]store.Build{}
	for _, b := range builds {
		byImage[b.Image] = append(byImage[b.Image], b)
	}
	for _, image := range slices.Sorted(maps.Keys(byImage)) {
		readySeen := 0
		for i, b := range byImage[image] {
			why := ""
			switch {
			case b.State == store.Deleting || b.State == store.Building:
				continue
			case !resp.build(b):
				// Another builder's build of an image this config does not
				// have: that builder decides.
				continue
			case !resp.configured[image]:
				why = "image is no longer in the config"
			case b.State == store.Ready:
				readySeen++
				if readySeen > keepBuilds && !keptBuild[b.ID] {
					why = fmt.Sprintf("more than keep-builds (%d) ready builds", keepBuilds)
				}
			case b.State == store.Failed && i > 0:
				why = "failed, and a newer build exists"
			}
			if why == "" {
				continue
			}
			r := buildRelease{build: b, why: why}
			for _, up := range uploads {
				if up.BuildID == b.ID && up.State != store.Uploading && up.State != store.Deleting && resp.upload(up) {
					r.uploads = append(r.uploads, up)
				}
			}
			plan.builds = append(plan.builds, r)
		}
	}
}

// writeRetention writes a Retain pass's plan, made from uploads as read, and
// warns where it released more ready uploads than stay.
func (u *Uploader) writeRetention(ctx context.Context, plan retention, uploads []store.Upload) error {
	var errs []error
	released := map[string]bool{} // uploads this pass marked deleting
	tally := releaseTally{}
	for _, r := range plan.uploads {
		up := r.upload
		u.log.Info("releasing upload", "upload", up.String(), "external_id", up.ExternalID, "reason", r.why)
		if err := u.skipChanged(u.opts.Store.MarkUploadDeleting(ctx, &up)); err != nil {
			errs = append(errs, err)
			continue
		}
		released[up.String()] = true
		tally.released(r.upload, r.why)
	}
	for _, up := range plan.forget {
		if err := u.skipChanged(u.opts.Store.RemoveUpload(ctx, up)); err != nil {
			errs = append(errs, err)
		}
	}
	for _, r := range plan.builds {
		// The build and its uploads go deleting in one write, against the
		// versions read: an upload begun meanwhile makes it fail.
		u.log.Info("releasing build", "build", r.build.Name(), "reason", r.why)
		var taken []store.Upload
		for _, up := range r.uploads {
			if !released[up.String()] {
				taken = append(taken, up)
			}
		}
		if _, err := u.opts.Store.ReleaseBuildWith(ctx, r.build, taken, r.why); err != nil {
			// Nothing of it was written: its uploads are not counted released.
			if err = u.skipChanged(err); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		for _, up := range taken {
			released[up.String()] = true
			tally.released(up, "its build was released: "+r.why)
		}
	}
	tally.warn(u.log, uploads, released)
	return errors.Join(errs...)
}

// placement is an image in a provider.
type placement struct{ image, provider string }

func (p placement) compare(q placement) int {
	return cmp.Or(strings.Compare(p.image, q.image), strings.Compare(p.provider, q.provider))
}

// releaseTally counts the ready uploads a Retain pass released, by image and
// provider, with the reasons.
type releaseTally map[placement]*released

type released struct {
	count   int
	reasons []string
}

// released counts an upload, as read before it was released, when it was ready.
func (t releaseTally) released(up store.Upload, why string) {
	if up.State != store.Ready {
		return
	}
	k := placement{up.Image, up.Provider}
	r := t[k]
	if r == nil {
		r = &released{}
		t[k] = r
	}
	r.count++
	if !slices.Contains(r.reasons, why) {
		r.reasons = append(r.reasons, why)
	}
}

// warn logs, for each image and provider where the pass released more ready
// uploads than stay ready, what it released and why: rotation never does that,
// so it follows a change of the config (or of keep-uploads), which the operator
// should see before the cloud images go.
func (t releaseTally) warn(log *slog.Logger, before []store.Upload, released map[string]bool) {
	for k, r := range t {
		kept := 0
		for _, up := range before {
			if up.Image == k.image && up.Provider == k.provider && up.State == store.Ready && !released[up.String()] {
				kept++
			}
		}
		if r.count <= kept {
			continue
		}
		log.Warn("releasing more uploads than are kept: their cloud images are deleted next; if the config change "+
			"that caused it was a mistake, fix the config now",
			"image", k.image, "provider", k.provider, "released", r.count, "kept", kept,
			"reason", strings.Join(r.reasons, "; "))
	}
}
