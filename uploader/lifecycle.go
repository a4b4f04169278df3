package uploader

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"

	"github.com/nodepool-builder/nodepool-builder/metrics"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// skipChanged passes on the error of a step's compare-and-set change. A record that
// changed meanwhile is left to the next pass, which reads it afresh: that is no
// failure.
func (u *Uploader) skipChanged(err error) error {
	if errors.Is(err, store.ErrConflict) {
		u.log.Info("record changed meanwhile; the next pass looks again", "detail", err)
		return nil
	}
	return err
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
			var drop []string
			for _, f := range b.Files {
				if f.Present && !slices.Contains(di.KeepFormats, f.Format) {
					drop = append(drop, f.Format)
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
			if err := st.DropFiles(ctx, &b, drop); err != nil {
				if !errors.Is(err, store.ErrConflict) { // else: changed meanwhile; the next pass looks again
					errs = append(errs, err)
				}
				continue
			}
			for _, format := range drop {
				u.log.Info("removed uploaded file (delete-after-upload)", "build", b.Name(), "format", format)
			}
		}
	}
	return errors.Join(errs...)
}

// Delete carries out what was released: cloud images first (retried on every
// step until the cloud agrees), then records; a deleting build's files go at once,
// its record once none of its uploads is left. A failed upload that still holds
// its half-made image (the cloud could not delete it when the attempt failed)
// is deleted the same way, image then record, as nodepool's cleanup deletes
// failed uploads. Records this builder is not responsible for are left to the
// builder that is.
func (u *Uploader) Delete(ctx context.Context) error {
	resp, err := u.responsibility(ctx)
	if err != nil {
		return err
	}
	errs := u.deleteUploads(ctx, resp)
	took, berrs := u.deleteBuilds(ctx, resp)
	errs = append(errs, berrs...)
	if took {
		// Uploads a deleting build took with it (one released by a Python
		// builder, which marks only the build) go now, not a pass later.
		errs = append(errs, u.deleteUploads(ctx, resp)...)
		_, berrs = u.deleteBuilds(ctx, resp)
		errs = append(errs, berrs...)
	}
	return errors.Join(errs...)
}

// deleteUploads deletes every deleting upload, and every failed one that holds
// a cloud image, that this builder is responsible for and no other builder is on.
func (u *Uploader) deleteUploads(ctx context.Context, resp responsibility) []error {
	st := u.opts.Store
	ups, err := st.Uploads(ctx, store.UploadFilter{State: store.Deleting})
	if err != nil {
		return []error{err}
	}
	failed, err := st.Uploads(ctx, store.UploadFilter{State: store.Failed})
	if err != nil {
		return []error{err}
	}
	for _, up := range failed {
		if up.ExternalID != "" {
			ups = append(ups, up)
		}
	}
	var errs []error
	for _, up := range ups {
		if !resp.upload(up) {
			continue
		}
		// The upload's own lock, as nodepool takes it to delete one: another
		// builder deleting it now leaves it to that builder.
		held, err := st.TryLock(ctx, store.LockKey{Image: up.Image, BuildID: up.BuildID, Provider: up.Provider, UploadID: up.ID})
		if errors.Is(err, store.ErrHeld) || errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err == nil {
			// Not on a context under the lock: the lock's node is the
			// upload's child, deleted with the record it guards.
			err = u.deleteUpload(ctx, up)
			held.Release()
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// deleteBuilds settles every deleting build this builder is responsible for and
// no other builder is on, and tells whether one took ready uploads with it.
func (u *Uploader) deleteBuilds(ctx context.Context, resp responsibility) (bool, []error) {
	st := u.opts.Store
	builds, err := st.Builds(ctx, store.BuildFilter{State: store.Deleting})
	if err != nil {
		return false, []error{err}
	}
	var errs []error
	took := false
	for _, b := range builds {
		if !resp.build(b) {
			continue
		}
		held, err := st.TryLock(ctx, store.LockKey{Image: b.Image, BuildID: b.ID})
		if errors.Is(err, store.ErrHeld) || errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err == nil {
			// Not on a context under the lock: the lock's node is the
			// build's child, deleted with the record it guards.
			var t bool
			t, err = u.deleteBuild(ctx, b, resp)
			took = took || t
			held.Release()
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return took, errs
}

// deleteUpload deletes a deleting upload's cloud image, then its record; the
// same for a failed upload that holds its half-made image.
func (u *Uploader) deleteUpload(ctx context.Context, up store.Upload) error {
	if up.ExternalID != "" {
		cloud, ok := u.opts.Clouds[up.Provider]
		if !ok {
			return fmt.Errorf("delete upload %s: provider %s is not in the config; its image %s stays", up, up.Provider, up.ExternalID)
		}
		cctx, cancel := u.cloudCtx(ctx)
		_, err := recordedImage(cctx, cloud, up)
		switch {
		case errors.Is(err, errNotOurs):
			cancel()
			u.leaveNotOurs(up, up.ExternalID, err, "not deleting a cloud image that is not this upload's: the record stays; check who wrote it, "+
				"and delete the record or the image by hand if it is wrong")
			return nil
		case errors.Is(err, ErrNotFound):
			err = nil // gone already: only the record is left
		case err == nil:
			err = cloud.Delete(cctx, up.ExternalID)
		}
		cancel()
		if err != nil {
			u.opts.Metrics.Failed(metrics.StepDelete, err)
			return fmt.Errorf("delete upload %s (image %s) in %s: %w", up, up.ExternalID, up.Provider, err)
		}
		if up.State == store.Failed {
			u.log.Info("deleted the half-made image of a failed upload", "upload", up.String(), "external_id", up.ExternalID)
		} else {
			u.log.Info("deleted cloud image", "upload", up.String(), "external_id", up.ExternalID)
		}
	}
	return u.skipChanged(u.opts.Store.RemoveUpload(ctx, up))
}

// errNotOurs: a cloud image an upload record names is not that upload's.
var errNotOurs = errors.New("not this upload's image")

// glanceID is an image id as Glance makes them: a UUID.
var glanceID = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// recordedImage is the cloud image an upload record names, once checked to be
// that upload's (see uploadsImage): records are written by other programs and
// by hand too, and a wrong one must neither delete nor adopt an image of
// another's. The id must be a UUID before the cloud is asked about it. The
// error wraps ErrNotFound when the image is gone, and errNotOurs when it is
// not the upload's.
func recordedImage(ctx context.Context, cloud Cloud, up store.Upload) (CloudImage, error) {
	if !glanceID.MatchString(up.ExternalID) {
		return CloudImage{}, fmt.Errorf("%w: external id %.80q is not an image id as Glance makes them (a UUID)", errNotOurs, up.ExternalID)
	}
	img, err := cloud.Get(ctx, up.ExternalID)
	if err != nil {
		return CloudImage{}, fmt.Errorf("check whose image it is: %w", err)
	}
	if err := uploadsImage(ctx, cloud, up, img); err != nil {
		return CloudImage{}, err
	}
	return img, nil
}

// uploadsImage tells whether a cloud image is an upload's: it carries the
// properties nodepool's builders (Python nodepool 10, and this builder) set on
// what they upload: the build id, and the provider's name where it is set; and
// the upload id, or, when the ids differ, the name the record gives it
// (zookeeper-import numbers the uploads it copies anew). And it belongs to the
// project the cloud's credentials act for, when the cloud tells both: anyone
// may set properties on an image of theirs that the builder's credentials
// reach (a shared or public image, or any image for an admin). The error wraps
// errNotOurs when it is not the upload's.
func uploadsImage(ctx context.Context, cloud Cloud, up store.Upload, img CloudImage) error {
	p := img.Properties
	if p[PropBuildID] != up.BuildID {
		return fmt.Errorf("%w: the image's %s is %.80q, not the upload's build %s", errNotOurs, PropBuildID, p[PropBuildID], up.BuildID)
	}
	if p[PropUploadID] != up.ID && (up.ExternalName == "" || img.Name != up.ExternalName) {
		return fmt.Errorf("%w: the image's %s is %.80q and its name %.80q, not the upload's id %s or name %.80q", errNotOurs,
			PropUploadID, p[PropUploadID], img.Name, up.ID, up.ExternalName)
	}
	if name, ok := p[PropProvider]; ok && name != up.Provider {
		return fmt.Errorf("%w: the image's %s is %.80q, not %s", errNotOurs, PropProvider, name, up.Provider)
	}
	err := ownedByProject(ctx, cloud, img)
	if errors.Is(err, errOtherProject) {
		return fmt.Errorf("%w: %w", errNotOurs, err)
	}
	return err
}

// errOtherProject: a cloud image belongs to a project other than the one the
// cloud's credentials act for.
var errOtherProject = errors.New("another project's image")

// ownedByProject tells whether a cloud image belongs to the project the cloud's
// credentials act for, when the cloud tells both; the error wraps
// errOtherProject when it belongs to another.
func ownedByProject(ctx context.Context, cloud Cloud, img CloudImage) error {
	if img.Owner == "" {
		return nil
	}
	project, err := cloud.Project(ctx)
	if err != nil {
		return fmt.Errorf("find the project of the cloud's credentials: %w", err)
	}
	if project != "" && img.Owner != project {
		return fmt.Errorf("%w: its owner is %.80q, the credentials' project %s", errOtherProject, img.Owner, project)
	}
	return nil
}

// leaveNotOurs logs, once per upload and image, that a cloud image is not the
// upload's and is left where it is; what says what becomes of the record.
func (u *Uploader) leaveNotOurs(up store.Upload, id string, err error, what string) {
	if _, said := u.notOurs.LoadOrStore(up.String()+"@"+id, true); !said {
		u.log.Warn(what, "upload", up.String(), "external_id", id, "reason", err)
	}
}

// deleteBuild takes a deleting build's finished uploads with it (any builder
// does, for the providers of its config), and on the builder that holds its
// files, removes them and then the record once no upload is left: as nodepool's
// builders do, so that no host keeps the files of a build the state no longer
// holds. It tells whether it took ready uploads with it.
func (u *Uploader) deleteBuild(ctx context.Context, b store.Build, resp responsibility) (bool, error) {
	st := u.opts.Store
	own := b.BuilderID == st.BuilderID()
	if own {
		if err := st.ForgetBuild(b); err != nil {
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
		if !resp.upload(up) {
			// To a provider of another builder's config: that builder deletes it.
			pending = true
			continue
		}
		switch up.State {
		case store.Failed:
			if up.ExternalID != "" {
				// Its half-made image is still in the cloud: deleteUploads
				// deletes it, then the record.
				pending = true
				continue
			}
			if err := u.skipChanged(st.RemoveUpload(ctx, up)); err != nil {
				errs = append(errs, err)
			}
			continue
		case store.Ready:
			// Finished after its build was released (an upload already under
			// way then), or its build was released alone: it goes with its build.
			if err := u.skipChanged(st.MarkUploadDeleting(ctx, &up)); err != nil {
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
	if err := st.RemoveBuild(ctx, b); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return took, nil // an upload record appeared or went meanwhile: the next pass
		}
		return took, err
	}
	u.log.Info("deleted build", "build", b.Name())
	return took, nil
}
