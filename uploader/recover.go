package uploader

import (
	"context"
	"errors"
	"fmt"

	"github.com/nodepool-builder/nodepool-builder/store"
)

// Recover settles uploads left uploading by work that is gone: a builder that
// stopped, or a worker that could not record its outcome. An upload whose lock
// another worker holds, of this builder or another, is left alone. An upload
// whose cloud image is active becomes ready once it passes the checks and the
// post-upload hook that it may not have passed before; anything else of it in
// the cloud is deleted and the upload is tried again. An image that is not the
// upload's (see uploadsImage), whatever its record says, is neither adopted
// nor deleted: it stays, and the upload is failed without it. It runs on every
// pass, so an upload the cloud could not be asked about is settled once it
// can. Uploads this builder is not responsible for are another builder's to
// settle.
func (u *Uploader) Recover(ctx context.Context) error {
	ups, err := u.opts.Store.Uploads(ctx, store.UploadFilter{State: store.Uploading})
	if err != nil || len(ups) == 0 {
		return err
	}
	resp, err := u.responsibility(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, up := range ups {
		if !resp.upload(up) {
			continue
		}
		lctx, unlock, err := u.opts.Store.Hold(ctx, store.LockKey{Image: up.Image, BuildID: up.BuildID, Provider: up.Provider})
		if errors.Is(err, store.ErrHeld) || errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err == nil {
			err = u.recoverUpload(lctx, up)
			unlock()
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (u *Uploader) recoverUpload(ctx context.Context, up store.Upload) error {
	st := u.opts.Store
	// Read again under the lock: a worker that finished before it was taken
	// changed the record, and what was read before must not be acted on.
	fresh, err := st.Uploads(ctx, store.UploadFilter{BuildID: up.BuildID, Provider: up.Provider})
	if err != nil {
		return err
	}
	var cur *store.Upload
	for i := range fresh {
		if fresh[i].ID == up.ID && fresh[i].Version == up.Version && fresh[i].State == store.Uploading {
			cur = &fresh[i]
		}
	}
	if cur == nil {
		return nil
	}
	up = *cur
	p := u.opts.Config.Provider(up.Provider)
	cloud, ok := u.opts.Clouds[up.Provider]
	if p == nil || !ok {
		return nil // its cloud is not configured: it waits until it is
	}
	log := u.log.With("upload", up.String())
	cctx, cancel := u.cloudCtx(ctx)
	defer cancel()
	// Only the upload's own image is adopted or deleted: the record may be
	// forged, or wrong, and the image it names an operator's or another tool's.
	var found []CloudImage
	var notOurs error
	if up.ExternalID != "" {
		img, err := recordedImage(cctx, cloud, up)
		switch {
		case err == nil:
			found = append(found, img)
		case errors.Is(err, errNotOurs):
			notOurs = err
			u.leaveNotOurs(up, up.ExternalID, err, "not adopting or deleting a cloud image that is not this upload's: the image stays, "+
				"and the upload is failed without it; check who wrote the record")
		case !errors.Is(err, ErrNotFound):
			return fmt.Errorf("recover upload %s: %w", up, err)
		}
	} else {
		// Not by builder id: the upload may be another builder's, which
		// tagged its image with its own id.
		imgs, err := cloud.List(cctx, map[string]string{
			PropBuildID:  up.BuildID,
			PropUploadID: up.ID,
			PropProvider: up.Provider,
		})
		if err != nil {
			return fmt.Errorf("recover upload %s: %w", up, err)
		}
		for _, img := range imgs {
			err := uploadsImage(cctx, cloud, up, img)
			if errors.Is(err, errNotOurs) {
				u.leaveNotOurs(up, img.ID, err, "not adopting or deleting a cloud image that is not this upload's, found by its properties: "+
					"the image stays; check who made it")
				continue
			}
			if err != nil {
				return fmt.Errorf("recover upload %s: %w", up, err)
			}
			found = append(found, img)
		}
	}
	reason := "interrupted: the builder stopped during this upload"
	switch {
	case notOurs != nil:
		reason = fmt.Sprintf("interrupted; the image %.80q its record named was left in the cloud: %v", up.ExternalID, notOurs)
	case up.LastError != "":
		// A worker of an older version that failed and could not delete
		// its image left it uploading, for us.
		reason = up.LastError
	}
	for i, img := range found {
		if i == 0 && img.Status == "active" {
			err := u.adopt(ctx, up, img)
			if err == nil {
				if err := u.skipChanged(u.opts.Store.MarkUploadReady(ctx, &up, img.ID, img.Name)); err != nil {
					return err
				}
				log.Info("interrupted upload had finished; it is ready", "external_id", img.ID)
				return nil
			}
			reason = "interrupted, and its image failed the checks: " + err.Error()
			log.Warn("interrupted upload's image failed the checks; deleting it", "external_id", img.ID, "error", err)
		}
		if err := cloud.Delete(cctx, img.ID); err != nil {
			return fmt.Errorf("recover upload %s: delete half-made image %s: %w", up, img.ID, err)
		}
		log.Info("deleted half-made image", "external_id", img.ID, "status", img.Status)
	}
	log.Warn("upload was interrupted; it will be retried", "reason", reason)
	up.ExternalID, up.ExternalName = "", ""
	return u.skipChanged(u.opts.Store.MarkUploadFailed(ctx, &up, reason, u.opts.Now()))
}

// adopt runs the checks an upload passes before it is ready on the image an
// interrupted upload made: what the cloud stored is the build's file, and the
// provider's post-upload hook passes.
func (u *Uploader) adopt(ctx context.Context, up store.Upload, img CloudImage) error {
	st := u.opts.Store
	b, err := st.Build(ctx, up.BuildID)
	if err != nil {
		return err
	}
	if b.State != store.Ready {
		// An upload that followed the download of a build that was never
		// made ready: its image is of bytes nothing verified.
		return fmt.Errorf("build %s is %s, not ready", b.Name(), b.State)
	}
	f, ok := b.File(up.Format)
	if !ok {
		return fmt.Errorf("build %s has no %s file", b.Name(), up.Format)
	}
	if err := checkStored(img, f); err != nil {
		return err
	}
	p := u.opts.Config.Provider(up.Provider)
	if p.PostUploadHook == "" {
		return nil
	}
	if !f.Present {
		return fmt.Errorf("the post-upload-hook cannot run: the build's %s file was removed", up.Format)
	}
	path, err := st.FilePath(b.Image, b.ID, up.Format)
	if err != nil {
		return fmt.Errorf("the post-upload-hook cannot run: %w", err)
	}
	hctx, cancel := context.WithTimeout(ctx, p.UploadTimeout())
	defer cancel()
	return runHook(hctx, p.PostUploadHook, p.Name, img.ID, path)
}
