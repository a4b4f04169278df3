// Package uploader reconciles the store against the clouds: it plans the uploads
// that are missing and runs them one at a time, keeps the newest, deletes the
// rest, settles uploads a stopped builder left behind and sweeps leaked images.
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
	"github.com/nodepool-builder/nodepool-builder/internal/defaults"
	"github.com/nodepool-builder/nodepool-builder/metrics"
	"github.com/nodepool-builder/nodepool-builder/progress"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// Defaults of Options.
const (
	DefaultRetryBase    = 30 * time.Second
	DefaultPollInterval = 2 * time.Second
	DefaultCloudTimeout = 5 * time.Minute
	// DefaultCleanupGrace bounds the delete of a half-made image when an upload is
	// interrupted, the builder stopping included.
	DefaultCleanupGrace = 30 * time.Second
)

// Options configure an Uploader.
type Options struct {
	Store  *store.Store
	Config *config.Config
	// Clouds holds the image service of every provider in Config, by provider name.
	Clouds map[string]Cloud
	Logger *slog.Logger
	// RetryBase is the wait after an upload's first failure before a later step
	// tries it again; it doubles with each further failure. A cloud that could not
	// be reached is tried again after RetryBase, and that try is not counted.
	RetryBase time.Duration
	// PollInterval is how often an upload's status is checked while Glance imports it.
	PollInterval time.Duration
	// CloudTimeout bounds each cloud call of the steps other than uploads
	// (deletes, recovery, sweeps), so that a hung cloud holds up no step for long.
	CloudTimeout time.Duration
	// CleanupGrace bounds the delete of a half-made image after a failed or
	// interrupted upload.
	CleanupGrace time.Duration
	// OnSent, when set, is told how far each upload's data has gone, at most
	// once a second per upload.
	OnSent func(j Planned, sent, total int64)
	// Progress, when set, holds a task for each upload attempt while its data
	// is sent, "<build> to <provider>".
	Progress *progress.Tracker
	Now      func() time.Time
	// Metrics is told of uploads, deletes and sweeps; nil: nobody is.
	Metrics *metrics.Metrics
}

// Uploader runs the upload lifecycle of one config. Its methods are steps that
// the builder core calls: on timers in the daemon, once each with --once.
type Uploader struct {
	opts Options
	log  *slog.Logger
	// heldBack are the builds and providers whose uploads kept being deleted,
	// said once: "<build id>/<provider>".
	heldBack sync.Map
	// notOurs are the cloud images left because they are not the upload's
	// that names them, "<upload>@<external id>", or not this builder's that
	// the sweep found, "sweep@<provider>@<external id>": each said once.
	notOurs sync.Map
	// fellBack are the web-download providers sent the file instead, and
	// why, "<provider>\x00<reason>\x00<method>": each said once.
	fellBack sync.Map
}

// New returns an Uploader.
func New(opts Options) *Uploader {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	opts.RetryBase = defaults.Positive(opts.RetryBase, DefaultRetryBase)
	opts.PollInterval = defaults.Positive(opts.PollInterval, DefaultPollInterval)
	opts.CloudTimeout = defaults.Positive(opts.CloudTimeout, DefaultCloudTimeout)
	opts.CleanupGrace = defaults.Positive(opts.CleanupGrace, DefaultCleanupGrace)
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Uploader{opts: opts, log: opts.Logger}
}

// Planned is one upload to make: a ready build's file to one provider, as the plan
// saw it. The worker that runs it reads the records again before it acts.
type Planned struct {
	Build    store.Build
	Provider string
	Format   string
	// Retry is a failed upload of this build to this provider to try again.
	Retry *store.Upload
	// Asked says an operator asked for this upload (a gearman job): a failed
	// upload is tried again now, whatever its backoff and the attempts used.
	Asked bool
}

// Key names what is planned: one build to one provider. A queue holds one
// planned upload a key.
func (j Planned) Key() string { return j.Build.ID + "/" + j.Provider }

func (j Planned) String() string { return j.Build.Name() + " to " + j.Provider }

// Plan lists the uploads that are missing: for every (provider, image) that is
// not paused, the newest ready build that has the provider's format needs a
// ready upload there. A failed upload is planned again once its backoff has
// passed, until upload-attempts are used up.
func (u *Uploader) Plan(ctx context.Context) ([]Planned, error) {
	cfg, st := u.opts.Config, u.opts.Store
	builds, err := st.Builds(ctx, store.BuildFilter{State: store.Ready})
	if err != nil {
		return nil, err
	}
	uploads, err := st.Uploads(ctx, store.UploadFilter{})
	if err != nil {
		return nil, err
	}
	byBuild := map[string][]store.Upload{}
	for _, up := range uploads {
		k := up.BuildID + "/" + up.Provider
		byBuild[k] = append(byBuild[k], up)
	}
	now := u.opts.Now()
	var planned []Planned
	for i := range cfg.Providers {
		p := &cfg.Providers[i]
		format := p.Format()
		for _, pi := range p.DiskImages {
			if pi.Pause {
				continue
			}
			// Builds come newest first: the newest that has (or had, before
			// delete-after-upload) the format.
			var newest *store.Build
			var file store.File
			for k := range builds {
				if builds[k].Image != pi.Name {
					continue
				}
				if f, ok := builds[k].File(format); ok {
					newest, file = &builds[k], f
					break
				}
			}
			if newest == nil {
				continue
			}
			if newest.BuilderID != st.BuilderID() {
				continue // its files are on the host of the builder that made it
			}
			j := Planned{Build: *newest, Provider: p.Name, Format: format}
			if !u.needed(byBuild[j.Key()], now, &j) {
				continue
			}
			if j.Retry == nil && u.uploadsGone(*newest, p.Name) {
				continue
			}
			if !u.Uploadable(p.Name, file) && file.URL != "" {
				// Never downloaded: the poller fetches it into the build.
				u.log.Debug("not uploading yet: the build's file was not downloaded, since only clouds that fetch it "+
					"themselves needed it", "image", pi.Name, "build", newest.ID, "provider", p.Name, "format", format)
				continue
			}
			if !u.Uploadable(p.Name, file) {
				// Removed after its uploads: a provider that wants it now needs a new build.
				u.log.Warn("cannot upload: the build's file was removed after upload (delete-after-upload)",
					"image", pi.Name, "build", newest.ID, "provider", p.Name, "format", format)
				continue
			}
			planned = append(planned, j)
		}
	}
	return planned, nil
}

// needed tells, from a build's uploads to one provider, whether an upload is to
// be made now; it sets j.Retry to the failed upload to try again, if any.
func (u *Uploader) needed(ups []store.Upload, now time.Time, j *Planned) bool {
	j.Retry = nil
	for k := range ups {
		switch ups[k].State {
		case store.Ready, store.Uploading:
			return false
		case store.Failed:
			if !j.Asked {
				switch {
				case ups[k].Attempts >= u.maxAttempts():
					return false // it stays failed until the next build
				case ups[k].NextAttempt.After(now):
					return false // a later step retries it
				}
			}
			if j.Retry == nil || betterRetry(ups[k], *j.Retry) {
				retry := ups[k]
				j.Retry = &retry
			}
		}
	}
	return true
}

// reuploadCause is why an upload this builder made of its own build is gone
// though its rotation did not release it.
const reuploadCause = "deleted by an operator (image-delete), or by another program: likely a Python " +
	"nodepool-builder sharing the state whose nodepool.yaml does not list the image under this provider, or " +
	"does not declare the zuul-image (\"- {name: <image>, pause: true}\" under its diskimages)"

// countUpload records a new upload of the builder's own build b to a provider;
// one that is not its first there says so at warning level: the ones before
// were deleted.
func (u *Uploader) countUpload(log *slog.Logger, b store.Build, provider string) {
	n, err := u.opts.Store.CountUpload(b, provider)
	switch {
	case err != nil:
		log.Warn("could not count the upload in the build's mark", "error", err)
	case n > 1:
		log.Warn(fmt.Sprintf("uploading the build to this provider again: an upload of it this builder made there is "+
			"gone, %s; once it was uploaded again upload-attempts (%d) times, it is not any more", reuploadCause,
			u.maxAttempts()), "uploads", n)
	}
}

// uploadsGone tells whether the builder's own build b is not to be uploaded to
// a provider again: it was uploaded there again upload-attempts times, each
// upload before deleted, not by this builder's rotation. The next build is,
// and an image-upload job makes one now.
func (u *Uploader) uploadsGone(b store.Build, provider string) bool {
	if b.BuilderID != u.opts.Store.BuilderID() {
		return false
	}
	n, err := u.opts.Store.UploadsBegun(b, provider)
	if err != nil {
		u.log.Warn("could not read the build's mark", "build", b.Name(), "error", err)
		return false
	}
	if n <= u.maxAttempts() {
		return false
	}
	if _, said := u.heldBack.LoadOrStore(b.ID+"/"+provider, true); !said {
		u.log.Warn(fmt.Sprintf("not uploading the build to this provider again: %d uploads of it this builder made "+
			"there are gone, %s", n, reuploadCause), "image", b.Image, "build", b.Name(), "provider", provider)
	}
	return true
}

// betterRetry tells whether failed upload a, rather than b, is the one to
// retry: one whose image is gone comes first (a failed upload that still holds
// its half-made image is left to the lifecycle), then the one of most attempts.
func betterRetry(a, b store.Upload) bool {
	if leftA, leftB := a.ExternalID != "", b.ExternalID != ""; leftA != leftB {
		return !leftA
	}
	return a.Attempts > b.Attempts
}

func (u *Uploader) maxAttempts() int {
	if n := u.opts.Config.Builder.UploadAttempts; n > 0 {
		return n
	}
	return 1
}

// ErrDropped is wrapped by Upload's error when the planned upload is no longer wanted: its
// build was released, its upload was deleted or made meanwhile, or the config no
// longer asks for it. Nothing was done.
var ErrDropped = errors.New("upload no longer needed")

// Upload makes one planned upload. It reads the build and its uploads again
// first, so that an upload that waited for a worker never overwrites what an operator or another step
// did meanwhile, and records the upload before any data moves. It returns the
// ready upload.
func (u *Uploader) Upload(ctx context.Context, j Planned) (store.Upload, error) {
	p := u.opts.Config.Provider(j.Provider)
	if p == nil || p.Entry(j.Build.Image) == nil || p.Entry(j.Build.Image).Pause {
		return store.Upload{}, fmt.Errorf("upload %s: %w: the provider no longer takes the image", j, ErrDropped)
	}
	cloud, ok := u.opts.Clouds[p.Name]
	if !ok {
		return store.Upload{}, fmt.Errorf("upload %s: no cloud is open for this provider", j)
	}
	// The lock nodepool's builders take to upload a build to a provider: its
	// holder, here or on another host, is the one uploader, and recovery leaves
	// what it holds alone.
	ctx, unlock, err := u.opts.Store.Hold(ctx, store.LockKey{Image: j.Build.Image, BuildID: j.Build.ID, Provider: j.Provider})
	if errors.Is(err, store.ErrHeld) || errors.Is(err, store.ErrNotFound) {
		return store.Upload{}, fmt.Errorf("upload %s: %w: %w", j, ErrDropped, err)
	}
	if err != nil {
		return store.Upload{}, fmt.Errorf("upload %s: %w", j, err)
	}
	defer unlock()
	rec, prev, b, err := u.claim(ctx, j)
	if err != nil {
		return store.Upload{}, err
	}
	// Uploading, as nodepool's builder says from the record made uploading
	// until the outcome is recorded.
	defer u.opts.Metrics.Uploading(b.Image, p.Name)()
	log := u.log.With("image", b.Image, "build", b.ID, "provider", p.Name, "upload", rec.ID)
	if j.Retry != nil {
		log.Info("retrying upload", "attempt", rec.Attempts, "last_error", j.Retry.LastError)
	}
	if prev == nil && rec.Attempts == 1 {
		u.countUpload(log, b, p.Name)
	}
	file, _ := b.File(j.Format)
	a := &attempt{u: u, planned: j, cloud: cloud, provider: p, build: b, file: file, rec: &rec, prev: prev, log: log}
	began := time.Now()
	err = a.run(ctx)
	if ctx.Err() == nil {
		// An attempt the builder stopped is no attempt: it is not counted.
		u.opts.Metrics.Uploaded(b.Image, p.Name, file.Size, time.Since(began), err)
	}
	if err == nil {
		if err := u.opts.Store.MarkUploadReady(context.WithoutCancel(ctx), &rec, rec.ExternalID, rec.ExternalName); err != nil {
			// Left uploading with its image recorded: recovery settles it.
			return rec, fmt.Errorf("upload %s: record it ready: %w", j, err)
		}
		log.Info("upload ready", "external_id", rec.ExternalID, "name", rec.ExternalName)
		return rec, nil
	}
	return rec, u.failed(ctx, a, err)
}

// claim turns a planned upload into an upload record in state uploading, from a fresh read
// of the build and its uploads: a new record, or the failed one to retry with its
// attempt counted, returned as it was before too (nil for a new record). The
// build is written too (compare-and-set), so that a release of the build and the
// claim never both succeed.
func (u *Uploader) claim(ctx context.Context, j Planned) (store.Upload, *store.Upload, store.Build, error) {
	st := u.opts.Store
	for range 5 {
		b, err := st.Build(ctx, j.Build.ID)
		if errors.Is(err, store.ErrNotFound) {
			return store.Upload{}, nil, b, fmt.Errorf("upload %s: %w: the build is gone", j, ErrDropped)
		}
		if err != nil {
			return store.Upload{}, nil, b, err
		}
		if b.State != store.Ready {
			return store.Upload{}, nil, b, fmt.Errorf("upload %s: %w: the build is %s", j, ErrDropped, b.State)
		}
		if f, ok := b.File(j.Format); !ok || !u.Uploadable(j.Provider, f) {
			return store.Upload{}, nil, b, fmt.Errorf("upload %s: %w: the build has no %s file", j, ErrDropped, j.Format)
		}
		ups, err := st.Uploads(ctx, store.UploadFilter{BuildID: b.ID, Provider: j.Provider})
		if err != nil {
			return store.Upload{}, nil, b, err
		}
		fresh := j
		if !u.needed(ups, u.opts.Now(), &fresh) {
			return store.Upload{}, nil, b, fmt.Errorf("upload %s: %w: it is made, running or waiting to be retried", j, ErrDropped)
		}
		if j.Retry != nil && (fresh.Retry == nil || fresh.Retry.ID != j.Retry.ID) {
			// The upload to retry was released or settled meanwhile: the next
			// plan decides afresh.
			return store.Upload{}, nil, b, fmt.Errorf("upload %s: %w: upload %s changed meanwhile", j, ErrDropped, j.Retry.ID)
		}
		var rec store.Upload
		var prev *store.Upload
		if fresh.Retry == nil {
			rec, err = st.CreateUpload(ctx, &b, j.Provider, j.Format)
		} else {
			rec, err = st.RetryUpload(ctx, &b, *fresh.Retry, j.Format)
			if fresh.Retry.ExternalID == "" {
				prev = fresh.Retry // the record retried, as it was
			}
		}
		if errors.Is(err, store.ErrConflict) {
			continue // changed meanwhile: read again
		}
		if err != nil {
			return store.Upload{}, nil, b, err
		}
		return rec, prev, b, nil
	}
	return store.Upload{}, nil, store.Build{}, fmt.Errorf("upload %s: %w: its records keep changing", j, store.ErrConflict)
}

// failed settles a failed attempt: whatever it made in the cloud goes, and the
// record says why and when to try again. A cloud that could not be reached does
// not count towards upload-attempts. An attempt the builder interrupted is no
// failure: see interrupted. When the half-made image cannot be deleted within
// CleanupGrace (the cloud is down, say), the upload is recorded failed with its
// image's id, interrupted or not: nothing works on it any more, and a builder
// that finds an upload uploading without a lock holder, as nodepool's do,
// drops the record and with it the only trace of the image. The lifecycle
// deletes a failed upload's image once the cloud answers (see Delete), and the
// retry is a new upload (see claim).
func (u *Uploader) failed(ctx context.Context, a *attempt, err error) error {
	rec, log := a.rec, a.log
	interrupted := ctx.Err() != nil
	// The clean-up must happen even when ctx ended, but not hold a stop for long.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), u.opts.CleanupGrace)
	defer cancel()
	var leftover error
	if rec.ExternalID != "" {
		if derr := a.cloud.Delete(cctx, rec.ExternalID); derr != nil {
			leftover = derr
			log.Warn("could not delete half-made image; it stays recorded on the failed upload and a later pass deletes it",
				"external_id", rec.ExternalID, "error", derr)
		} else {
			log.Info("deleted half-made image", "external_id", rec.ExternalID)
		}
	}
	if interrupted && leftover == nil {
		return u.interrupted(ctx, a, err)
	}
	now, retryAt := u.opts.Now(), rec.NextAttempt
	next := "it stays failed until the next build"
	switch {
	case interrupted:
		// No failed attempt, but its image is left over: failed with it, not
		// counted, and due again at once.
		rec.Attempts--
		retryAt = now
		next = "it is tried again on the next pass"
	case errors.Is(err, ErrUnavailable) && !a.created:
		rec.Attempts--
		retryAt = now.Add(u.opts.RetryBase)
		next = "the cloud could not be reached; next try after " + retryAt.Format(time.RFC3339)
	case rec.Attempts < u.maxAttempts():
		// Retried by a later step, after a wait that doubles with each failure.
		retryAt = now.Add(u.opts.RetryBase << min(rec.Attempts-1, 10))
		next = "next try after " + retryAt.Format(time.RFC3339)
	}
	// A failure is the caller's to log, from the error returned; an
	// interruption, which callers do not report, is said here.
	var reason string
	if interrupted {
		log.Info("upload interrupted; it is no failed attempt", "cause", context.Cause(ctx), "error", err, "next", next)
		reason = fmt.Sprintf("interrupted (%v), no failed attempt: %v", context.Cause(ctx), err)
	} else {
		reason = err.Error()
	}
	if leftover != nil {
		reason += fmt.Sprintf("; its half-made image %s could not be deleted (%v): a later pass deletes it", rec.ExternalID, leftover)
		next += "; its half-made image " + rec.ExternalID + " is deleted once the cloud answers"
	} else {
		rec.ExternalID = ""
	}
	// The record is local and quick to write: it gets its own bound, not what
	// the cloud left of the grace.
	wctx, wcancel := context.WithTimeout(context.WithoutCancel(ctx), DefaultCleanupGrace)
	defer wcancel()
	if uerr := u.opts.Store.MarkUploadFailed(wctx, rec, reason, retryAt); uerr != nil {
		return errors.Join(fmt.Errorf("upload %s to %s: %w", a.build.Name(), a.provider.Name, err), uerr)
	}
	if interrupted {
		return &interruptedError{fmt.Errorf("upload %s to %s interrupted (%v), not failed; %s: %w",
			a.build.Name(), a.provider.Name, context.Cause(ctx), next, err)}
	}
	return fmt.Errorf("upload %s to %s failed (attempt %d of %d; %s): %w",
		a.build.Name(), a.provider.Name, rec.Attempts, u.maxAttempts(), next, err)
}

// interrupted settles an attempt the builder stopped (it was stopping, the
// config no longer asks for the upload, or the upload's lock was lost) once its
// half-made cloud image is gone. A stop is no failure of the upload, so the
// record goes back to what it was before the attempt: a new upload's record is
// removed, and a retried one is failed again as its last real attempt left it,
// due at once. Nothing shows the upload failed, to us or to nodepool (whose
// launcher boots only ready uploads, and whose builders read no attempt
// counts), no attempt is used, and the next pass makes it again at once.
func (u *Uploader) interrupted(ctx context.Context, a *attempt, err error) error {
	rec, log := a.rec, a.log
	cause := context.Cause(ctx)
	wctx, wcancel := context.WithTimeout(context.WithoutCancel(ctx), DefaultCleanupGrace)
	defer wcancel()
	if uerr := u.opts.Store.UnclaimUpload(wctx, *rec, a.prev); uerr != nil {
		// Left uploading, with no image in the cloud: recovery settles it.
		return errors.Join(fmt.Errorf("upload %s to %s interrupted (%v): %w", a.build.Name(), a.provider.Name, cause, err), uerr)
	}
	log.Info("upload interrupted; it is no failed attempt and is made again on the next pass", "cause", cause, "error", err)
	return &interruptedError{fmt.Errorf("upload %s to %s interrupted (%v), not failed: it is made again on the next pass: %w",
		a.build.Name(), a.provider.Name, cause, err)}
}

// interruptedError is the error of an upload the builder interrupted: due work
// not done, rather than a failure.
type interruptedError struct{ err error }

func (e *interruptedError) Error() string { return e.err.Error() }
func (e *interruptedError) Unwrap() error { return e.err }

// NotDone marks the upload as due work left undone.
func (e *interruptedError) NotDone() {}

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
	if pi := p.Entry(b.Image); pi != nil {
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

// cloudCtx bounds one cloud call of a step other than an upload.
func (u *Uploader) cloudCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, u.opts.CloudTimeout)
}
