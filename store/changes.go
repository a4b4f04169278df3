package store

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// The named changes of uploads, builds and poll cursors that the uploader and
// the poller make. Each write of a build or an upload is compare-and-set on the
// version the caller read: ErrConflict (wrapped) says the record changed
// meanwhile and nothing was written.

// newUpload is the record of a new upload of b to provider, uploading, at its
// attempt: it carries the build's connection settings for the launcher.
func (s *Store) newUpload(b Build, provider, format string, attempt int) Upload {
	return Upload{BuildID: b.ID, Image: b.Image, Provider: provider, State: Uploading, StateTime: s.now().UTC(),
		Format: format, Attempts: attempt, Username: b.Username, PythonPath: b.PythonPath, ShellType: b.ShellType}
}

// claimUpload writes an upload claimed and its build, as read, in one write:
// the build's version changes, so that a release that read the build before
// the claim fails, and a claim of a build released meanwhile fails.
func (s *Store) claimUpload(ctx context.Context, b *Build, u *Upload) error {
	touched := *b
	if err := s.backend.Write(ctx, PutBuild(&touched), PutUpload(u)); err != nil {
		return fmt.Errorf("record upload of %s to %s: %w", b.Name(), u.Provider, err)
	}
	*b = touched
	return nil
}

// RetryUpload claims a failed upload of a build, as read, for another attempt,
// counted from its start so that one a crash interrupts counts too. A failed
// upload that still holds its half-made cloud image stays, for the lifecycle
// to delete that image: the retry is then a new upload that counts on from its
// attempts. Otherwise the failed record itself goes uploading. As CreateUpload,
// it changes the build's version.
func (s *Store) RetryUpload(ctx context.Context, b *Build, failed Upload, format string) (Upload, error) {
	if failed.ExternalID != "" {
		u := s.newUpload(*b, failed.Provider, format, failed.Attempts+1)
		if err := s.claimUpload(ctx, b, &u); err != nil {
			return Upload{}, err
		}
		return u, nil
	}
	u := failed
	u.SetState(Uploading, s.now())
	u.Attempts++
	u.ExternalID, u.ExternalName, u.Format, u.LastError = "", "", format, ""
	if err := s.claimUpload(ctx, b, &u); err != nil {
		return Upload{}, err
	}
	return u, nil
}

// UnclaimUpload puts an upload claimed (by CreateUpload or RetryUpload) back as
// it was before, for an attempt that was stopped rather than failed: a new
// upload's record goes, and a retried one is failed again as was says, due at
// once.
func (s *Store) UnclaimUpload(ctx context.Context, claimed Upload, was *Upload) error {
	change := DeleteUpload(claimed)
	if was != nil {
		back := *was
		back.Version = claimed.Version
		back.NextAttempt = s.now()
		change = PutUpload(&back)
	}
	if err := s.backend.Write(ctx, change); err != nil {
		return fmt.Errorf("put upload %s back: %w", claimed, err)
	}
	return nil
}

// RecordUploadImage records the cloud image an uploading upload made, before
// any data moves to it, so that a crash leaves an image the record finds.
func (s *Store) RecordUploadImage(ctx context.Context, u *Upload, id, name string) error {
	next := *u
	next.ExternalID, next.ExternalName = id, name
	if err := s.backend.Write(ctx, PutUpload(&next)); err != nil {
		return fmt.Errorf("record image %s of upload %s: %w", id, u, err)
	}
	*u = next
	return nil
}

// MarkUploadReady records an upload ready with its cloud image: it passed every
// check, and the launcher may boot it.
func (s *Store) MarkUploadReady(ctx context.Context, u *Upload, id, name string) error {
	next := *u
	next.SetState(Ready, s.now())
	next.ExternalID, next.ExternalName, next.LastError, next.NextAttempt = id, name, "", time.Time{}
	if err := s.backend.Write(ctx, PutUpload(&next)); err != nil {
		return fmt.Errorf("record upload %s ready: %w", u, err)
	}
	*u = next
	return nil
}

// MarkUploadFailed records an upload failed, why, and the earliest time it is
// retried. What the attempt left (its count, a cloud image that could not be
// deleted) is the caller's to set on u first.
func (s *Store) MarkUploadFailed(ctx context.Context, u *Upload, reason string, retryAt time.Time) error {
	next := *u
	next.SetState(Failed, s.now())
	next.LastError, next.NextAttempt = reason, retryAt
	if err := s.backend.Write(ctx, PutUpload(&next)); err != nil {
		return fmt.Errorf("record upload %s failed: %w", u, err)
	}
	*u = next
	return nil
}

// MarkUploadDeleting releases an upload, as read: the lifecycle then deletes
// its cloud image and its record.
func (s *Store) MarkUploadDeleting(ctx context.Context, u *Upload) error {
	if err := s.markUploadDeleting(ctx, u); err != nil {
		return fmt.Errorf("release upload %s: %w", u, err)
	}
	return nil
}

func (s *Store) markUploadDeleting(ctx context.Context, u *Upload) error {
	next := *u
	next.SetState(Deleting, s.now())
	if err := s.backend.Write(ctx, PutUpload(&next)); err != nil {
		return err
	}
	*u = next
	return nil
}

// RemoveUpload deletes an upload's record, as read: its cloud image is gone,
// or it never had one.
func (s *Store) RemoveUpload(ctx context.Context, u Upload) error {
	if err := s.backend.Write(ctx, DeleteUpload(u)); err != nil {
		return fmt.Errorf("delete upload record %s: %w", u, err)
	}
	return nil
}

// ReleaseBuildWith marks a build, as read, deleting with uploads of it, as
// read, in one write: an upload claimed meanwhile makes it fail, and the
// release looks again later. Uploads already deleting are left as they are; so
// is a build already deleting, whose state time says how long its delete has
// taken. It returns the build as written.
func (s *Store) ReleaseBuildWith(ctx context.Context, b Build, uploads []Upload, reason string) (Build, error) {
	b, err := s.releaseBuild(ctx, b, uploads, reason)
	if err != nil {
		return Build{}, fmt.Errorf("release build %s: %w", b.Name(), err)
	}
	return b, nil
}

func (s *Store) releaseBuild(ctx context.Context, b Build, uploads []Upload, reason string) (Build, error) {
	now := s.now()
	var changes []Change
	for _, u := range uploads {
		if u.State == Deleting {
			continue
		}
		u.SetState(Deleting, now)
		changes = append(changes, PutUpload(&u))
	}
	if b.State != Deleting {
		b.SetState(Deleting, now)
		b.Reason = reason
	}
	// The build is written even when its state stays, so that an upload
	// created meanwhile makes this write fail.
	err := s.backend.Write(ctx, append(changes, PutBuild(&b))...)
	return b, err
}

// RemoveBuild deletes a deleting build's record, as read, once its files and
// uploads are gone.
func (s *Store) RemoveBuild(ctx context.Context, b Build) error {
	if err := s.backend.Write(ctx, DeleteBuild(b)); err != nil {
		return fmt.Errorf("delete build record %s: %w", b.Name(), err)
	}
	return nil
}

// DropFiles removes files of a build, as read, from disk, and records them not
// present: the record first, since a file recorded as gone is never uploaded
// from. The build still counts as having those formats. b is the build as
// written once the record is.
func (s *Store) DropFiles(ctx context.Context, b *Build, formats []string) error {
	next := own(*b)
	for _, format := range formats {
		if f, ok := next.File(format); ok {
			f.Present = false
			next.SetFile(f)
		}
	}
	if err := s.backend.Write(ctx, PutBuild(&next)); err != nil {
		return fmt.Errorf("record files of %s removed: %w", b.Name(), err)
	}
	*b = next
	var errs []error
	for _, format := range formats {
		errs = append(errs, s.removeFormat(b.Image, b.ID, format))
	}
	return errors.Join(errs...)
}

// Poll cursors carry no version: every change of one is made under its
// image's build lock (a poll, a fetch's commit or abort, the tidy-up of a lost
// build, zuul-cursor-reset), so the last writer wins and no other is running.

// ResetCursor forgets how far the poller got with a zuul-image, as an operator
// asks: its next poll fetches Zuul's newest build. It takes the image's build
// lock, the lock a poll takes to fetch, without waiting (an error wrapping
// ErrHeld while a builder holds it), and returns the cursor it replaced, read
// under the lock. A cursor the store refuses is what a reset is for: it is
// replaced, and refused says why it was refused.
func (s *Store) ResetCursor(ctx context.Context, image, reason string) (was Cursor, refused, err error) {
	ctx, unlock, err := s.Hold(ctx, LockKey{Image: image})
	if err != nil {
		return Cursor{}, nil, err
	}
	defer unlock()
	was, err = s.Cursor(ctx, image)
	if errors.Is(err, ErrRefusedRecord) {
		was, refused = Cursor{}, err
	} else if err != nil {
		return Cursor{}, nil, err
	}
	if err := s.backend.Write(ctx, PutCursor(Cursor{Image: image, Outcome: OutcomeReset, Reason: reason, Time: s.now()})); err != nil {
		return was, refused, fmt.Errorf("reset poll cursor of %s: %w", image, err)
	}
	return was, refused, nil
}

// MarkZuulBehind records on a cursor, as read, the id of Zuul's newest build
// when it is behind the cursor, or 0 when it no longer is. The caller holds
// the image's build lock.
func (s *Store) MarkZuulBehind(ctx context.Context, cur Cursor, newestID int64) error {
	cur.BehindID = newestID
	if err := s.backend.Write(ctx, PutCursor(cur)); err != nil {
		return fmt.Errorf("record on the poll cursor of %s whether Zuul is behind it: %w", cur.Image, err)
	}
	return nil
}

// SetCursorWaiting records on a cursor, as read, why Zuul's newest build waits
// for the operator ("" once it no longer does). The caller holds the image's
// build lock.
func (s *Store) SetCursorWaiting(ctx context.Context, cur Cursor, why string) error {
	cur.Waiting = why
	if err := s.backend.Write(ctx, PutCursor(cur)); err != nil {
		return fmt.Errorf("record on the poll cursor of %s what its build waits for: %w", cur.Image, err)
	}
	return nil
}
