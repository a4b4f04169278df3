package uploader

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/internal/follow"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// Streams are the uploads of one format of a build being made that begin as
// it is fetched (see Stream): one per provider that needs the format, each
// fed from the file on disk as it is written, read once from Zuul, or
// fetched by the cloud itself at the artifact's URL (web-download).
type Streams struct {
	u        *Uploader
	build    store.Build
	format   string
	declared store.File // the file as the artifact declares it
	src      *follow.File
	wg       sync.WaitGroup

	mu      sync.Mutex
	file    store.File // the verified file, once Verified
	settled chan struct{}
	ready   bool
	why     error
	errs    []error // of the uploads that failed
}

// Stream starts the uploads of a format of build b, which is being fetched,
// to every provider that needs it. A provider whose upload-method is
// web-download has its cloud fetch the artifact at a.URL itself, when there
// is one; the others claim their upload and create their cloud image, then
// send the file as the build's writer downloads it into src. With src nil
// the download is not followed: only the clouds that fetch it themselves
// begin. It returns nil when no provider begins an upload, and whether the
// file is to be downloaded at all: false only when every provider that
// lists the image in this format is a web-download one whose cloud takes
// a.URL, and the image has no format of its own to keep.
//
// No upload sent from the file completes before the download is verified
// (Verified): until then src holds back the file's end. The uploads turn
// ready only once the build is (Settle); a build that fails takes the
// images begun for it with it. a.Declared carries the checksums and size
// the artifact declares, which the cloud images are tagged with as they
// are created; the download, or what a cloud fetched, must match them.
//
// The caller holds the image's build lock, and b is building; ctx bounds the
// uploads, which outlive the call, and must not end with the build lock.
// Wait waits for them.
func (u *Uploader) Stream(ctx context.Context, b store.Build, a Artifact, src *follow.File) (*Streams, bool) {
	cfg, format := u.opts.Config, a.Declared.Format
	download := !cfg.FetchedByClouds(b.Image, format)
	type begin struct {
		p           *config.Provider
		uri, webWhy string
	}
	var begins []begin
	for _, p := range cfg.ProvidersFor(b.Image) {
		if p.Format() != format {
			continue
		}
		_, hasCloud := u.opts.Clouds[p.Name]
		pause := p.Entry(b.Image).Pause || !hasCloud
		web := cfg.Builder.UploadMethod(p.Name) == config.UploadWebDownload
		why := ""
		if web {
			why = a.NotWeb
			if why == "" && !pause {
				why = u.webRefusal(ctx, p)
			}
			if why == "" {
				if !pause {
					begins = append(begins, begin{p: p, uri: a.URL})
				}
				continue
			}
			download = true // the provider is sent the file
		}
		switch {
		case !pause && src != nil:
			begins = append(begins, begin{p: p, webWhy: why})
		case web:
			// Sent the file once the build is ready: why is said now.
			u.sayFallback(p.Name, why, "")
		}
	}
	if len(begins) == 0 {
		return nil, download
	}
	s := &Streams{u: u, build: b, format: format, declared: a.Declared, src: src, settled: make(chan struct{})}
	for _, bg := range begins {
		s.wg.Go(func() { s.upload(ctx, bg.p, bg.uri, bg.webWhy) })
	}
	if src != nil {
		go func() {
			s.wg.Wait()
			src.Close()
		}()
	}
	return s, download
}

// webRefusal says why the cloud of a web-download provider cannot fetch an
// image itself now, "" when it can: it has no import, or does not offer
// web-download.
func (u *Uploader) webRefusal(ctx context.Context, p *config.Provider) string {
	imp, ok := u.opts.Clouds[p.Name].(Importer)
	if !ok {
		return "this provider's cloud client cannot import images"
	}
	cctx, cancel := u.cloudCtx(ctx)
	defer cancel()
	if err := imp.CheckImportMethod(cctx, config.UploadWebDownload); err != nil {
		return err.Error()
	}
	return ""
}

// Verified says the download is whole and verified: it is f. The uploads
// send the end of the file and wait for their images to be active. The
// build goes on whatever became of them: an upload that could not follow
// the download has failed on its own, and is retried from the file.
func (s *Streams) Verified(f store.File) {
	s.mu.Lock()
	s.file = f
	s.mu.Unlock()
	if s.src == nil {
		return
	}
	if err := s.src.Release(f.Size); err != nil {
		s.u.log.Debug("the uploads that followed the download had ended", "build", s.build.Name(), "format", s.format,
			"error", err)
	}
}

// verified is the file as Verified said it is.
func (s *Streams) verified() store.File {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.file
}

// Settle says how the build ended: ready, or not, and why. An upload turns
// ready once its image is active and the build is; otherwise its image is
// deleted and its record goes. Only the first call counts.
func (s *Streams) Settle(ready bool, why error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.settled:
		return
	default:
	}
	s.ready, s.why = ready, why
	if !ready {
		if why == nil {
			why = errors.New("the build was not made")
		}
		s.why = why
		if s.src != nil {
			s.src.Fail(fmt.Errorf("the build failed: %w", why))
		}
	}
	close(s.settled)
}

// Wait waits until every upload has ended.
func (s *Streams) Wait() { s.wg.Wait() }

// Err is, once Wait returned, why uploads failed (each recorded failed, to be
// retried from the file); nil when none did. Uploads the builder stopped, and
// those of a build that was not made, did not fail.
func (s *Streams) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return errors.Join(s.errs...)
}

// outcome waits for Settle, or for ctx to end.
func (s *Streams) outcome(ctx context.Context) (bool, error) {
	select {
	case <-s.settled:
	case <-ctx.Done():
		return false, context.Cause(ctx)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ready, s.why
}

// abandonedError is the error of a streamed upload whose build failed: no
// failed attempt of the upload.
type abandonedError struct{ err error }

func (e *abandonedError) Error() string { return e.err.Error() }
func (e *abandonedError) Unwrap() error { return e.err }

// upload runs one provider's upload, under its upload lock, as Upload does a
// job's: from the artifact's URL, fetched by the cloud, when uri is set;
// else following the download (webWhy says why a web-download provider is
// not fetching it). Nothing of it is retried here: a failed one is retried
// by the plan once the build is ready.
func (s *Streams) upload(ctx context.Context, p *config.Provider, uri, webWhy string) {
	u, b := s.u, s.build
	log := u.log.With("image", b.Image, "build", b.ID, "provider", p.Name)
	ctx, unlock, err := u.opts.Store.Hold(ctx, store.LockKey{Image: b.Image, BuildID: b.ID, Provider: p.Name})
	if err != nil {
		log.Warn("not uploading while downloading: the upload's lock", "error", err)
		return
	}
	defer unlock()
	rec, err := u.opts.Store.CreateStreamUpload(ctx, b, p.Name, s.format)
	if err != nil {
		log.Warn("not uploading while downloading: the upload could not be recorded; it is made once the build is ready",
			"error", err)
		return
	}
	defer u.opts.Metrics.Uploading(b.Image, p.Name)()
	log = log.With("upload", rec.ID)
	u.countUpload(log, b, p.Name)
	a := &attempt{u: u, planned: Planned{Build: b, Provider: p.Name, Format: s.format}, cloud: u.opts.Clouds[p.Name], provider: p,
		build: b, file: s.declared, rec: &rec, log: log, uri: uri, webWhy: webWhy}
	if uri == "" {
		a.stream = s
	}
	began := time.Now()
	err = a.run(ctx)
	var abandoned *abandonedError
	if err == nil || errors.As(err, &abandoned) {
		ready, why := s.outcome(ctx)
		switch {
		case ctx.Err() != nil:
			// The builder stops: an interrupted upload, whatever the build's fate.
			err = cmp.Or(err, why)
		case !ready:
			s.abandon(ctx, a, why)
			return
		case err == nil:
			u.opts.Metrics.Uploaded(b.Image, p.Name, a.file.Size, time.Since(began), nil)
			if err := u.opts.Store.MarkUploadReady(context.WithoutCancel(ctx), &rec, rec.ExternalID, rec.ExternalName); err != nil {
				log.Error("could not record the upload ready; the builder settles it on its next pass", "error", err)
				return
			}
			log.Info("upload ready", "external_id", rec.ExternalID, "name", rec.ExternalName)
			return
		}
	}
	if ctx.Err() == nil {
		u.opts.Metrics.Uploaded(b.Image, p.Name, a.file.Size, time.Since(began), err)
	}
	if ferr := u.failed(ctx, a, err); ferr != nil && !IsInterrupted(ferr) {
		log.Error("upload begun as the build was fetched failed; it is retried once the build is ready", "error", ferr)
		s.mu.Lock()
		s.errs = append(s.errs, ferr)
		s.mu.Unlock()
	}
}

// abandon deletes the image of an upload whose build was not made, and its
// record: it was no failed attempt, and nothing of it stays but the log.
func (s *Streams) abandon(ctx context.Context, a *attempt, why error) {
	u, rec := s.u, a.rec
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), u.opts.CleanupGrace)
	defer cancel()
	if rec.ExternalID != "" {
		if err := a.cloud.Delete(cctx, rec.ExternalID); err != nil {
			reason := fmt.Sprintf("the build was not made (%v); its image %s could not be deleted (%v): a later pass deletes it",
				why, rec.ExternalID, err)
			a.log.Warn("upload abandoned, its image left to a later pass", "reason", reason)
			if err := u.opts.Store.MarkUploadFailed(cctx, rec, reason, u.opts.Now()); err != nil {
				a.log.Error("could not record the abandoned upload; the builder settles it on its next pass", "error", err)
			}
			return
		}
	}
	if err := u.opts.Store.UnclaimUpload(cctx, *rec, nil); err != nil {
		a.log.Error("could not remove the abandoned upload's record; the builder settles it on its next pass", "error", err)
	}
	a.log.Warn("upload abandoned, its image deleted: the build was not made", "external_id", rec.ExternalID, "reason", why)
}

// IsInterrupted tells whether err is that of an upload the builder stopped.
func IsInterrupted(err error) bool {
	var ie *interruptedError
	return errors.As(err, &ie)
}
