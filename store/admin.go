package store

import (
	"context"
	"errors"
	"fmt"
)

// ErrInProgress is returned (wrapped) when a build or upload cannot be released
// because work on it is under way: deleting it then would race the worker.
var ErrInProgress = errors.New("work in progress")

// casAttempts bounds the re-reads of an admin change that keeps meeting changes
// made meanwhile; each conflict means another step made progress.
const casAttempts = 10

// retryConflicts runs fn until it does not fail with ErrConflict, at most
// casAttempts times; fn reads what it changes afresh each time.
func retryConflicts(ctx context.Context, fn func() error) error {
	var err error
	for range casAttempts {
		if err = fn(); !errors.Is(err, ErrConflict) || ctx.Err() != nil {
			return err
		}
	}
	return err
}

// ReleaseBuild marks a build and all its uploads deleting, as an operator's
// dib-image-delete asks; the uploader then deletes the cloud images, the files and
// the records. It is refused (ErrInProgress) while the build is being built or one
// of its uploads is uploading, and is a no-op for a build already deleting.
func (s *Store) ReleaseBuild(ctx context.Context, id, reason string) (Build, error) {
	var out Build
	err := retryConflicts(ctx, func() error {
		b, err := s.Build(ctx, id)
		if err != nil {
			return err
		}
		if b.State == Building {
			return fmt.Errorf("build %s is being built: %w", b.Name(), ErrInProgress)
		}
		ups, err := s.Uploads(ctx, UploadFilter{BuildID: id})
		if err != nil {
			return err
		}
		for _, u := range ups {
			if u.State == Uploading {
				return fmt.Errorf("build %s is being uploaded to %s (upload %s): %w", b.Name(), u.Provider, u.ID, ErrInProgress)
			}
		}
		out, err = s.releaseBuild(ctx, b, ups, reason)
		return err
	})
	if err != nil {
		return Build{}, fmt.Errorf("release build %s: %w", id, err)
	}
	return out, nil
}

// ReleaseUpload marks one upload deleting, as an operator's image-delete asks; the
// uploader then deletes its cloud image and its record. It is refused
// (ErrInProgress) while the upload is uploading, and is a no-op for an upload
// already deleting.
func (s *Store) ReleaseUpload(ctx context.Context, buildID, provider, id string) (Upload, error) {
	key := fmt.Sprintf("%s/%s/%s", buildID, provider, id)
	var out Upload
	err := retryConflicts(ctx, func() error {
		ups, err := s.Uploads(ctx, UploadFilter{BuildID: buildID, Provider: provider})
		if err != nil {
			return err
		}
		for _, u := range ups {
			if u.ID != id {
				continue
			}
			switch u.State {
			case Uploading:
				return fmt.Errorf("upload %s is uploading: %w", key, ErrInProgress)
			case Deleting:
				out = u
				return nil
			}
			if err := s.markUploadDeleting(ctx, &u); err != nil {
				return err
			}
			out = u
			return nil
		}
		return fmt.Errorf("upload %s: %w", key, ErrNotFound)
	})
	if err != nil {
		return Upload{}, fmt.Errorf("release upload %s: %w", key, err)
	}
	return out, nil
}
