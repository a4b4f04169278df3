package uploader

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nodepool-builder/nodepool-builder/metrics"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// write applies a step's compare-and-set change. A record that changed meanwhile
// is left to the next pass, which reads it afresh: that is no failure.
func (u *Uploader) write(ctx context.Context, what string, changes ...store.Change) error {
	err := u.opts.Store.Write(ctx, changes...)
	if errors.Is(err, store.ErrConflict) {
		u.log.Info("record changed meanwhile; the next pass looks again", "change", what, "detail", err)
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// Retain applies retention: per image the newest keep-builds ready builds stay, per
// (image, provider) the newest keep-uploads ready uploads stay, and an older build
// stays while one of its uploads does. Everything else is marked deleting, as are
// the uploads of images a provider no longer lists and the builds of images no
// longer in the config. Failed builds older than the image's newest build go too.
func (u *Uploader) Retain(ctx context.Context) error {
	st, cfg := u.opts.Store, u.opts.Config
	builds, err := st.Builds(ctx, store.BuildFilter{})
	if err != nil {
		return err
	}
	uploads, err := st.Uploads(ctx, store.UploadFilter{})
	if err != nil {
		return err
	}
	byImage := map[string][]store.Build{}
	created := map[string]time.Time{}
	for _, b := range builds {
		byImage[b.Image] = append(byImage[b.Image], b)
		created[b.ID] = b.Created
	}
	type key struct{ image, provider string }
	upsBy := map[key][]store.Upload{}
	for _, up := range uploads {
		k := key{up.Image, up.Provider}
		upsBy[k] = append(upsBy[k], up)
	}
	known := map[string]bool{}
	for _, name := range cfg.ImageNames() {
		known[name] = true
	}
	now := u.opts.Now()

	var errs []error
	released := map[string]bool{} // uploads this pass marked deleting
	markUpload := func(up store.Upload, why string) {
		if up.State == store.Deleting || up.State == store.Uploading {
			return
		}
		u.log.Info("releasing upload", "upload", up.String(), "external_id", up.ExternalID, "reason", why)
		up.SetState(store.Deleting, now)
		if err := u.write(ctx, "release upload "+up.String(), store.PutUpload(&up)); err != nil {
			errs = append(errs, err)
		}
		released[up.String()] = true
	}

	// keptBuild holds builds that must stay because an upload of theirs does.
	keptBuild := map[string]bool{}
	for k, ups := range upsBy {
		p := cfg.Provider(k.provider)
		if p == nil {
			// Without its config the cloud can't be reached; its uploads wait.
			for _, up := range ups {
				keptBuild[up.BuildID] = true
			}
			continue
		}
		if !known[k.image] || p.Image(k.image) == nil {
			for _, up := range ups {
				if up.State == store.Uploading {
					keptBuild[up.BuildID] = true
				}
				markUpload(up, "image no longer listed for this provider")
			}
			continue
		}
		sortUploadsNewestFirst(ups, created)
		kept := 0
		newestReady := time.Time{}
		for _, up := range ups {
			switch up.State {
			case store.Ready:
				if kept < u.keepUploads() {
					kept++
					keptBuild[up.BuildID] = true
					if created[up.BuildID].After(newestReady) {
						newestReady = created[up.BuildID]
					}
				} else {
					markUpload(up, fmt.Sprintf("more than keep-uploads (%d) ready uploads", u.keepUploads()))
				}
			case store.Uploading:
				keptBuild[up.BuildID] = true
			}
		}
		// A failed upload is history once a newer upload is ready.
		for _, up := range ups {
			if up.State == store.Failed && !newestReady.IsZero() && !created[up.BuildID].After(newestReady) {
				if err := u.write(ctx, "forget failed upload "+up.String(), store.DeleteUpload(up)); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}

	for image, bs := range byImage {
		readySeen := 0
		for i, b := range bs {
			release := ""
			switch {
			case b.State == store.Deleting || b.State == store.Building:
				continue
			case !known[image]:
				release = "image is no longer in the config"
			case b.State == store.Ready:
				readySeen++
				if readySeen > u.keepBuilds() && !keptBuild[b.ID] {
					release = fmt.Sprintf("more than keep-builds (%d) ready builds", u.keepBuilds())
				}
			case b.State == store.Failed && i > 0:
				release = "failed, and a newer build exists"
			}
			if release == "" {
				continue
			}
			// The build and its uploads go deleting in one write, against the
			// versions read: an upload begun meanwhile makes it fail.
			u.log.Info("releasing build", "build", b.Name(), "reason", release)
			b.SetState(store.Deleting, now)
			b.Reason = release
			changes := []store.Change{store.PutBuild(&b)}
			for _, up := range uploads {
				if up.BuildID == b.ID && up.State != store.Uploading && up.State != store.Deleting && !released[up.String()] {
					up.SetState(store.Deleting, now)
					changes = append(changes, store.PutUpload(&up))
				}
			}
			if err := u.write(ctx, "release build "+b.Name(), changes...); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// DropUploaded removes from disk the files of diskimages with delete-after-upload
// once the build is uploaded to every provider that lists the image; formats in
// keep-formats stay. The files stay recorded, marked not present, so the build
// still counts as having those formats.
func (u *Uploader) DropUploaded(ctx context.Context) error {
	st, cfg := u.opts.Store, u.opts.Config
	var errs []error
	for _, di := range cfg.DiskImages {
		if !di.DeleteAfterUpload {
			continue
		}
		providers := cfg.ProvidersFor(di.Name)
		if len(providers) == 0 {
			continue
		}
		builds, err := st.Builds(ctx, store.BuildFilter{Image: di.Name, State: store.Ready})
		if err != nil {
			return err
		}
		for _, b := range builds {
			if b.BuilderID != st.BuilderID() {
				continue // its files are another host's to drop
			}
			var drop []store.File
			for _, f := range b.Files {
				if f.Present && !slices.Contains(di.KeepFormats, f.Format) {
					drop = append(drop, f)
				}
			}
			if len(drop) == 0 {
				continue
			}
			ups, err := st.Uploads(ctx, store.UploadFilter{BuildID: b.ID, State: store.Ready})
			if err != nil {
				return err
			}
			uploaded := map[string]bool{}
			for _, up := range ups {
				uploaded[up.Provider] = true
			}
			all := true
			for _, p := range providers {
				all = all && uploaded[p.Name]
			}
			if !all {
				continue
			}
			// The record first: a file recorded as gone is never uploaded from.
			for _, f := range drop {
				f.Present = false
				b.SetFile(f)
			}
			if err := st.Write(ctx, store.PutBuild(&b)); err != nil {
				if !errors.Is(err, store.ErrConflict) { // else: changed meanwhile; the next pass looks again
					errs = append(errs, fmt.Errorf("record files of %s removed: %w", b.Name(), err))
				}
				continue
			}
			for _, f := range drop {
				if err := st.RemoveFormat(b.Image, b.ID, f.Format); err != nil {
					errs = append(errs, err)
					continue
				}
				u.log.Info("removed uploaded file (delete-after-upload)", "build", b.Name(), "format", f.Format)
			}
		}
	}
	return errors.Join(errs...)
}

func (u *Uploader) keepBuilds() int  { return max(u.opts.Config.Builder.KeepBuilds, 1) }
func (u *Uploader) keepUploads() int { return max(u.opts.Config.Builder.KeepUploads, 1) }

// Delete carries out what was released: cloud images first (retried on every
// step until the cloud agrees), then records; a deleting build's files go at once,
// its record once none of its uploads is left.
func (u *Uploader) Delete(ctx context.Context) error {
	errs := u.deleteUploads(ctx)
	took, berrs := u.deleteBuilds(ctx)
	errs = append(errs, berrs...)
	if took {
		// Uploads a deleting build took with it (one released by a Python
		// builder, which marks only the build) go now, not a pass later.
		errs = append(errs, u.deleteUploads(ctx)...)
		_, berrs = u.deleteBuilds(ctx)
		errs = append(errs, berrs...)
	}
	return errors.Join(errs...)
}

// deleteUploads deletes every deleting upload no other builder is on.
func (u *Uploader) deleteUploads(ctx context.Context) []error {
	st := u.opts.Store
	ups, err := st.Uploads(ctx, store.UploadFilter{State: store.Deleting})
	if err != nil {
		return []error{err}
	}
	var errs []error
	for _, up := range ups {
		// The upload's own lock, as nodepool takes it to delete one: another
		// builder deleting it now leaves it to that builder.
		held, err := st.TryLock(ctx, store.LockKey{Image: up.Image, BuildID: up.BuildID, Provider: up.Provider, UploadID: up.ID})
		if errors.Is(err, store.ErrHeld) || errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := u.deleteUpload(ctx, up); err != nil {
			errs = append(errs, err)
		}
		held.Release()
	}
	return errs
}

// deleteBuilds settles every deleting build no other builder is on, and
// tells whether one took ready uploads with it.
func (u *Uploader) deleteBuilds(ctx context.Context) (bool, []error) {
	st := u.opts.Store
	builds, err := st.Builds(ctx, store.BuildFilter{State: store.Deleting})
	if err != nil {
		return false, []error{err}
	}
	var errs []error
	took := false
	for _, b := range builds {
		held, err := st.TryLock(ctx, store.LockKey{Image: b.Image, BuildID: b.ID})
		if errors.Is(err, store.ErrHeld) || errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		t, err := u.deleteBuild(ctx, b)
		took = took || t
		if err != nil {
			errs = append(errs, err)
		}
		held.Release()
	}
	return took, errs
}

// deleteUpload deletes a deleting upload's cloud image, then its record.
func (u *Uploader) deleteUpload(ctx context.Context, up store.Upload) error {
	if up.ExternalID != "" {
		cloud, ok := u.opts.Clouds[up.Provider]
		if !ok {
			return fmt.Errorf("delete upload %s: provider %s is not in the config; its image %s stays", up, up.Provider, up.ExternalID)
		}
		cctx, cancel := u.cloudCtx(ctx)
		err := cloud.Delete(cctx, up.ExternalID)
		cancel()
		if err != nil {
			u.opts.Metrics.Failed(metrics.StepDelete, err)
			return fmt.Errorf("delete upload %s (image %s) in %s: %w", up, up.ExternalID, up.Provider, err)
		}
		u.log.Info("deleted cloud image", "upload", up.String(), "external_id", up.ExternalID)
	}
	return u.write(ctx, "delete upload record "+up.String(), store.DeleteUpload(up))
}

// deleteBuild takes a deleting build's finished uploads with it (any builder
// does), and on the builder that holds its files, removes them and then the
// record once no upload is left: as nodepool's builders do, so that no host
// keeps the files of a build the state no longer holds. It tells whether it
// took ready uploads with it.
func (u *Uploader) deleteBuild(ctx context.Context, b store.Build) (bool, error) {
	st := u.opts.Store
	own := b.BuilderID == st.BuilderID()
	if own {
		if err := st.RemoveBuildFiles(b.Image, b.ID); err != nil {
			return false, err
		}
	}
	left, err := st.Uploads(ctx, store.UploadFilter{BuildID: b.ID})
	if err != nil {
		return false, err
	}
	var errs []error
	pending, took := false, false
	for _, up := range left {
		switch up.State {
		case store.Failed:
			if err := u.write(ctx, "delete upload record "+up.String(), store.DeleteUpload(up)); err != nil {
				errs = append(errs, err)
			}
			continue
		case store.Ready:
			// Finished after its build was released (an upload already under
			// way then), or its build was released alone: it goes with its build.
			up.SetState(store.Deleting, u.opts.Now())
			if err := u.write(ctx, "release upload "+up.String(), store.PutUpload(&up)); err != nil {
				errs = append(errs, err)
			} else {
				took = true
			}
		}
		pending = true
	}
	if pending || len(errs) > 0 || !own {
		return took, errors.Join(errs...)
	}
	if err := st.Write(ctx, store.DeleteBuild(b)); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return took, nil // an upload record appeared or went meanwhile: the next pass
		}
		return took, err
	}
	u.log.Info("deleted build", "build", b.Name())
	return took, nil
}
