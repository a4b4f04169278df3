package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// ErrInProgress is returned (wrapped) when a build or upload cannot be released
// because work on it is under way: deleting it then would race the worker.
var ErrInProgress = errors.New("work in progress")

// ReleaseBuild marks a build and all its uploads deleting, as an operator's
// dib-image-delete asks; the uploader then deletes the cloud images, the files and
// the records. It is refused (ErrInProgress) while the build is being built or one
// of its uploads is uploading, and is a no-op for a build already deleting.
func (s *Store) ReleaseBuild(ctx context.Context, id, reason string) (Build, error) {
	var image string
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		var state string
		err := tx.QueryRowContext(ctx, `SELECT image, state FROM builds WHERE id = ?`, id).Scan(&image, &state)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("build %s: %w", id, ErrNotFound)
		}
		if err != nil {
			return err
		}
		name := image + "-" + id
		if State(state) == Building {
			return fmt.Errorf("build %s is being built: %w", name, ErrInProgress)
		}
		var provider, upload string
		err = tx.QueryRowContext(ctx, `SELECT provider, id FROM uploads WHERE build_id = ? AND state = ? ORDER BY provider, id LIMIT 1`,
			id, string(Uploading)).Scan(&provider, &upload)
		if err == nil {
			return fmt.Errorf("build %s is being uploaded to %s (upload %s): %w", name, provider, upload, ErrInProgress)
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		now := unixNano(s.now())
		// A build already deleting keeps its state_time: it says how long the delete has taken.
		if _, err := tx.ExecContext(ctx, `UPDATE builds SET state = ?, state_time = ?, reason = ? WHERE id = ? AND state <> ?`,
			string(Deleting), now, reason, id, string(Deleting)); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `UPDATE uploads SET state = ?, state_time = ? WHERE build_id = ? AND state <> ?`,
			string(Deleting), now, id, string(Deleting))
		return err
	})
	if err != nil {
		return Build{}, fmt.Errorf("release build %s: %w", id, err)
	}
	b, err := s.Build(ctx, id)
	if errors.Is(err, ErrNotFound) {
		// The uploader finished the delete already.
		return Build{ID: id, Image: image, State: Deleting, StateTime: s.now().UTC(), Reason: reason}, nil
	}
	return b, err
}

// ReleaseUpload marks one upload deleting, as an operator's image-delete asks; the
// uploader then deletes its cloud image and its record. It is refused
// (ErrInProgress) while the upload is uploading, and is a no-op for an upload
// already deleting.
func (s *Store) ReleaseUpload(ctx context.Context, buildID, provider, id string) (Upload, error) {
	key := fmt.Sprintf("%s/%s/%s", buildID, provider, id)
	var u Upload
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		var state string
		var stateTime int64
		u = Upload{BuildID: buildID, Provider: provider, ID: id}
		err := tx.QueryRowContext(ctx, `SELECT b.image, u.state, u.state_time, u.external_id, u.external_name, u.format,
			u.attempts, u.last_error
			FROM uploads u JOIN builds b ON b.id = u.build_id
			WHERE u.build_id = ? AND u.provider = ? AND u.id = ?`, buildID, provider, id).
			Scan(&u.Image, &state, &stateTime, &u.ExternalID, &u.ExternalName, &u.Format, &u.Attempts, &u.LastError)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("upload %s: %w", key, ErrNotFound)
		}
		if err != nil {
			return err
		}
		u.State, u.StateTime = State(state), fromUnixNano(stateTime)
		switch u.State {
		case Uploading:
			return fmt.Errorf("upload %s is uploading: %w", key, ErrInProgress)
		case Deleting:
			return nil
		}
		now := s.now()
		u.State, u.StateTime = Deleting, now.UTC()
		_, err = tx.ExecContext(ctx, `UPDATE uploads SET state = ?, state_time = ? WHERE build_id = ? AND provider = ? AND id = ?`,
			string(Deleting), unixNano(now), buildID, provider, id)
		return err
	})
	if err != nil {
		return Upload{}, fmt.Errorf("release upload %s: %w", key, err)
	}
	return u, nil
}

// inTx runs fn in one transaction; the store opens its transactions IMMEDIATE, so
// the checks in fn and the writes after them see the same state.
func (s *Store) inTx(ctx context.Context, fn func(*sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}
