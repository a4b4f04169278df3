// Package uploader reconciles the store against the clouds: it uploads the newest
// ready build of every image to every provider that lists it, keeps the newest,
// deletes the rest, recovers from crashes and sweeps leaked cloud images.
package uploader

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// Options configure an Uploader.
type Options struct {
	Store  *store.Store
	Config *config.Config
	// Clouds holds the image service of every provider in Config, by provider name.
	Clouds map[string]Cloud
	Logger *slog.Logger
	// RetryBase is the wait after an upload's first failure before a later step
	// tries it again; it doubles with each further failure.
	RetryBase time.Duration // default 30s
	// PollInterval is how often an upload's status is checked while Glance imports it.
	PollInterval time.Duration // default 2s
	Now          func() time.Time
}

// Uploader runs the upload lifecycle. Its methods are steps: the daemon calls them
// in a loop, --once calls each once.
type Uploader struct {
	opts Options
	log  *slog.Logger
}

// New returns an Uploader.
func New(opts Options) *Uploader {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.RetryBase <= 0 {
		opts.RetryBase = 30 * time.Second
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = 2 * time.Second
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Uploader{opts: opts, log: opts.Logger}
}

// Step is one reconcile pass against the store: upload what is missing, drop files
// uploaded everywhere, apply retention and delete what was released. It returns every
// failure, joined. The leak sweep, which lists whole clouds, is separate: Sweep.
func (u *Uploader) Step(ctx context.Context) error {
	var errs []error
	if err := u.Upload(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := u.DropUploaded(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := u.Retain(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := u.Delete(ctx); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// job is one upload to do: a build's file to one provider.
type job struct {
	provider *config.Provider
	build    store.Build
	file     store.File
	retry    *store.Upload // a failed upload of this build to retry, if any
}

// Upload makes sure that, for every (provider, image) that is not paused, the newest
// ready build with the provider's format has a ready upload there. Uploads run in
// parallel, at most builder.upload-workers at once; one provider's failures never
// hold back another.
func (u *Uploader) Upload(ctx context.Context) error {
	jobs, err := u.plan(ctx)
	if err != nil {
		return err
	}
	workers := u.opts.Config.Builder.UploadWorkers
	if workers <= 0 {
		workers = 1
	}
	sem := make(chan struct{}, workers)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for _, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				mu.Lock()
				errs = append(errs, fmt.Errorf("upload %s to %s: %w", j.build.Name(), j.provider.Name, ctx.Err()))
				mu.Unlock()
				return
			}
			defer func() { <-sem }()
			if err := u.run(ctx, j); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (u *Uploader) plan(ctx context.Context) ([]job, error) {
	cfg := u.opts.Config
	var jobs []job
	for i := range cfg.Providers {
		p := &cfg.Providers[i]
		for _, pi := range p.DiskImages {
			if pi.Pause {
				continue
			}
			format := p.Format()
			builds, err := u.opts.Store.Builds(ctx, store.BuildFilter{Image: pi.Name, State: store.Ready})
			if err != nil {
				return nil, err
			}
			// The newest build that has (or had, before delete-after-upload) the format.
			var newest *store.Build
			var file store.File
			for k := range builds {
				if f, ok := builds[k].File(format); ok {
					newest, file = &builds[k], f
					break
				}
			}
			if newest == nil {
				continue
			}
			ups, err := u.opts.Store.Uploads(ctx, store.UploadFilter{BuildID: newest.ID, Provider: p.Name})
			if err != nil {
				return nil, err
			}
			j := job{provider: p, build: *newest, file: file}
			done := false
			for k := range ups {
				switch ups[k].State {
				case store.Ready, store.Uploading:
					done = true
				case store.Failed:
					switch {
					case ups[k].Attempts >= u.maxAttempts():
						// It stays failed until the next build.
						done = true
					case ups[k].NextAttempt.After(u.opts.Now()):
						// Not yet: a later step retries it.
						done = true
					case j.retry == nil:
						j.retry = &ups[k]
					}
				}
			}
			switch {
			case done:
			case !file.Present:
				// Removed after its uploads: a provider that wants it now needs a new build.
				u.log.Warn("cannot upload: the build's file was removed after upload (delete-after-upload)",
					"image", pi.Name, "build", newest.ID, "provider", p.Name, "format", format)
			default:
				jobs = append(jobs, j)
			}
		}
	}
	return jobs, nil
}

func (u *Uploader) maxAttempts() int {
	if n := u.opts.Config.Builder.UploadAttempts; n > 0 {
		return n
	}
	return 1
}

// run uploads one build to one provider, retrying with backoff.
func (u *Uploader) run(ctx context.Context, j job) error {
	st := u.opts.Store
	cloud, ok := u.opts.Clouds[j.provider.Name]
	if !ok {
		return fmt.Errorf("upload %s to %s: no cloud is open for this provider", j.build.Name(), j.provider.Name)
	}
	var rec store.Upload
	if j.retry != nil {
		rec = *j.retry
	} else {
		var err error
		if rec, err = st.CreateUpload(ctx, j.build.ID, j.provider.Name, j.file.Format); err != nil {
			return err
		}
	}
	log := u.log.With("image", j.build.Image, "build", j.build.ID, "provider", j.provider.Name, "upload", rec.ID)
	if rec.Attempts > 0 {
		log.Info("retrying upload", "attempt", rec.Attempts+1, "last_error", rec.LastError)
	}
	// The attempt counts from its start, so one a crash interrupted counts too.
	rec.Attempts++
	rec.State, rec.LastError, rec.ExternalID, rec.ExternalName = store.Uploading, "", "", ""
	if err := st.UpdateUpload(ctx, rec); err != nil {
		return err
	}
	err := u.attempt(ctx, cloud, j, &rec, log)
	if err == nil {
		rec.State, rec.LastError = store.Ready, ""
		if err := st.UpdateUpload(ctx, rec); err != nil {
			return err
		}
		log.Info("upload ready", "external_id", rec.ExternalID, "name", rec.ExternalName)
		return nil
	}
	log.Warn("upload failed", "attempt", rec.Attempts, "error", err)
	// Whatever was made of this attempt in the cloud goes.
	if rec.ExternalID != "" {
		if derr := cloud.Delete(context.WithoutCancel(ctx), rec.ExternalID); derr != nil {
			log.Warn("could not delete half-made image; the leak sweep will", "external_id", rec.ExternalID, "error", derr)
		}
	}
	next := "it stays failed until the next build"
	if rec.Attempts < u.maxAttempts() {
		// Retried by a later step, after a wait that doubles with each failure.
		rec.NextAttempt = u.opts.Now().Add(u.opts.RetryBase << min(rec.Attempts-1, 10))
		next = "next try after " + rec.NextAttempt.Format(time.RFC3339)
	}
	rec.State, rec.LastError, rec.ExternalID = store.Failed, err.Error(), ""
	if uerr := st.UpdateUpload(context.WithoutCancel(ctx), rec); uerr != nil {
		return errors.Join(err, uerr)
	}
	return fmt.Errorf("upload %s to %s failed (attempt %d of %d; %s): %w",
		j.build.Name(), j.provider.Name, rec.Attempts, u.maxAttempts(), next, err)
}

// ImageName fills a provider's image-name-format.
func ImageName(format string, image, buildID, uploadID string, now time.Time) string {
	r := strings.NewReplacer(
		"{image_name}", image,
		"{timestamp}", fmt.Sprint(now.Unix()),
		"{upload_id}", uploadID,
		"{build_id}", buildID,
	)
	return r.Replace(format)
}

// Properties are the Glance properties of an upload: the image's metadata, the
// provider entry's meta, and the properties that tie the cloud image to the store.
func (u *Uploader) Properties(p *config.Provider, b store.Build, f store.File, rec store.Upload) map[string]string {
	props := map[string]string{}
	cfg := u.opts.Config
	if zi := cfg.ZuulImage(b.Image); zi != nil {
		for k, v := range zi.Metadata {
			props[k] = v
		}
	}
	if di := cfg.DiskImage(b.Image); di != nil {
		for k, v := range di.Metadata {
			props[k] = v
		}
	}
	if pi := p.Image(b.Image); pi != nil {
		for k, v := range pi.Meta {
			props[k] = v
		}
	}
	props[PropBuildID] = b.ID
	props[PropUploadID] = rec.ID
	props[PropProvider] = p.Name
	props[PropBuilderID] = u.opts.Store.BuilderID()
	props[PropImage] = b.Image
	if f.MD5 != "" {
		props["owner_specified.openstack.md5"] = f.MD5
	}
	if f.SHA256 != "" {
		props["owner_specified.openstack.sha256"] = f.SHA256
	}
	return props
}

// Glance properties that tie a cloud image to this builder's store.
const (
	PropBuildID   = "nodepool_build_id"
	PropUploadID  = "nodepool_upload_id"
	PropProvider  = "nodepool_provider_name"
	PropBuilderID = "nodepool_builder_id"
	PropImage     = "nodepool_image_name"
)

func sortUploadsNewestFirst(ups []store.Upload, created map[string]time.Time) {
	sort.SliceStable(ups, func(a, b int) bool {
		ca, cb := created[ups[a].BuildID], created[ups[b].BuildID]
		if !ca.Equal(cb) {
			return ca.After(cb)
		}
		return ups[a].ID > ups[b].ID
	})
}
