package uploader

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nodepool-builder/nodepool-builder/store"
)

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

	var errs []error
	markUpload := func(up store.Upload, why string) {
		if up.State == store.Deleting {
			return
		}
		u.log.Info("releasing upload", "upload", up.String(), "external_id", up.ExternalID, "reason", why)
		up.State = store.Deleting
		if err := st.UpdateUpload(ctx, up); err != nil {
			errs = append(errs, err)
		}
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
				if err := st.DeleteUpload(ctx, up); err != nil {
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
			u.log.Info("releasing build", "build", b.Name(), "reason", release)
			if err := st.SetBuildState(ctx, b.ID, store.Deleting, release); err != nil {
				errs = append(errs, err)
				continue
			}
			for _, up := range uploads {
				if up.BuildID == b.ID && up.State != store.Uploading {
					markUpload(up, "its build is being deleted")
				}
			}
		}
	}
	return errors.Join(errs...)
}

// DropUploaded removes from disk the files of diskimages with delete-after-upload
// once the build is uploaded to every provider that lists the image; formats in
// keep-formats stay. The file records stay, marked not present, so the build still
// counts as having those formats.
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
			if len(b.Formats()) == 0 {
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
			for _, f := range b.Files {
				if !f.Present || slices.Contains(di.KeepFormats, f.Format) {
					continue
				}
				if err := st.RemoveFormat(b.Image, b.ID, f.Format); err != nil {
					errs = append(errs, err)
					continue
				}
				if err := st.MarkFileRemoved(ctx, b.ID, f.Format); err != nil {
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

// Delete carries out what Retain released: cloud images first (retried on every
// step until the cloud agrees), then records; a deleting build's files go at once,
// its record once none of its uploads is left.
func (u *Uploader) Delete(ctx context.Context) error {
	st := u.opts.Store
	var errs []error
	ups, err := st.Uploads(ctx, store.UploadFilter{State: store.Deleting})
	if err != nil {
		return err
	}
	for _, up := range ups {
		if up.ExternalID != "" {
			cloud, ok := u.opts.Clouds[up.Provider]
			if !ok {
				errs = append(errs, fmt.Errorf("delete upload %s: provider %s is not in the config; its image %s stays", up, up.Provider, up.ExternalID))
				continue
			}
			if err := cloud.Delete(ctx, up.ExternalID); err != nil {
				errs = append(errs, fmt.Errorf("delete upload %s (image %s) in %s: %w", up, up.ExternalID, up.Provider, err))
				continue
			}
			u.log.Info("deleted cloud image", "upload", up.String(), "external_id", up.ExternalID)
		}
		if err := st.DeleteUpload(ctx, up); err != nil {
			errs = append(errs, err)
		}
	}
	builds, err := st.Builds(ctx, store.BuildFilter{State: store.Deleting})
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, b := range builds {
		if err := st.RemoveBuildFiles(b.Image, b.ID); err != nil {
			errs = append(errs, err)
			continue
		}
		left, err := st.Uploads(ctx, store.UploadFilter{BuildID: b.ID})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		pending := false
		for _, up := range left {
			switch up.State {
			case store.Failed:
				if err := st.DeleteUpload(ctx, up); err != nil {
					errs = append(errs, err)
				}
				continue
			case store.Ready:
				// Finished after its build was released (an upload already under
				// way then): it goes with its build.
				up.State = store.Deleting
				if err := st.UpdateUpload(ctx, up); err != nil {
					errs = append(errs, err)
				}
			}
			pending = true
		}
		if pending {
			continue
		}
		if err := st.DeleteBuild(ctx, b.ID); err != nil {
			errs = append(errs, err)
			continue
		}
		u.log.Info("deleted build", "build", b.Name())
	}
	return errors.Join(errs...)
}

// Leak is a cloud image tagged with this builder's id that the store does not hold.
type Leak struct {
	Provider string
	Image    Image
}

// Leaks lists, per provider, the cloud images this builder tagged whose upload the
// store does not hold.
func (u *Uploader) Leaks(ctx context.Context, provider string) ([]Leak, error) {
	live := map[string]bool{}
	ups, err := u.opts.Store.Uploads(ctx, store.UploadFilter{})
	if err != nil {
		return nil, err
	}
	for _, up := range ups {
		if up.ExternalID != "" {
			live[up.Provider+"\x00"+up.ExternalID] = true
		}
	}
	var out []Leak
	var errs []error
	for _, p := range u.opts.Config.Providers {
		if provider != "" && p.Name != provider {
			continue
		}
		cloud, ok := u.opts.Clouds[p.Name]
		if !ok {
			continue
		}
		// Providers may share a cloud: each sweeps only the images made for it.
		imgs, err := cloud.List(ctx, map[string]string{PropBuilderID: u.opts.Store.BuilderID(), PropProvider: p.Name})
		if err != nil {
			errs = append(errs, fmt.Errorf("list images of %s: %w", p.Name, err))
			continue
		}
		for _, img := range imgs {
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
		if err := u.opts.Clouds[l.Provider].Delete(ctx, l.Image.ID); err != nil {
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

// Recover settles what a stopped builder left in flight: an upload that was in
// progress becomes ready if its cloud image finished, else its image is deleted and
// the upload is retried; a build that was in progress fails and its files go
// (downloads in .partial stay, to be resumed).
func (u *Uploader) Recover(ctx context.Context) error {
	st := u.opts.Store
	var errs []error
	ups, err := st.Uploads(ctx, store.UploadFilter{State: store.Uploading})
	if err != nil {
		return err
	}
	for _, up := range ups {
		if err := u.recoverUpload(ctx, up); err != nil {
			errs = append(errs, err)
		}
	}
	builds, err := st.Builds(ctx, store.BuildFilter{State: store.Building})
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, b := range builds {
		u.log.Warn("build was interrupted; removing its files", "build", b.Name())
		if err := st.RemoveBuildFiles(b.Image, b.ID); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := st.SetBuildState(ctx, b.ID, store.Failed, "interrupted: the builder stopped during this build"); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (u *Uploader) recoverUpload(ctx context.Context, up store.Upload) error {
	cloud, ok := u.opts.Clouds[up.Provider]
	if !ok {
		return nil
	}
	var found []Image
	if up.ExternalID != "" {
		img, err := cloud.Get(ctx, up.ExternalID)
		switch {
		case err == nil:
			found = append(found, img)
		case !errors.Is(err, ErrNotFound):
			return fmt.Errorf("recover upload %s: %w", up, err)
		}
	} else {
		imgs, err := cloud.List(ctx, map[string]string{
			PropBuilderID: u.opts.Store.BuilderID(),
			PropBuildID:   up.BuildID,
			PropUploadID:  up.ID,
			PropProvider:  up.Provider,
		})
		if err != nil {
			return fmt.Errorf("recover upload %s: %w", up, err)
		}
		found = imgs
	}
	for i, img := range found {
		if i == 0 && img.Status == "active" {
			up.State, up.ExternalID, up.ExternalName, up.LastError = store.Ready, img.ID, img.Name, ""
			u.log.Info("interrupted upload had finished; it is ready", "upload", up.String(), "external_id", img.ID)
			return u.opts.Store.UpdateUpload(ctx, up)
		}
		if err := cloud.Delete(ctx, img.ID); err != nil {
			return fmt.Errorf("recover upload %s: delete half-made image %s: %w", up, img.ID, err)
		}
	}
	u.log.Warn("upload was interrupted; it will be retried", "upload", up.String())
	up.State, up.ExternalID, up.LastError = store.Failed, "", "interrupted: the builder stopped during this upload"
	return u.opts.Store.UpdateUpload(ctx, up)
}
