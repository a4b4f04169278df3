package store

import (
	"context"
	"fmt"
	"time"
)

// RequestBuild records a manual build request for an image; the builder honours it
// on its next step. Requesting twice is the same as once.
func (s *Store) RequestBuild(ctx context.Context, image string) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO build_requests (image, requested) VALUES (?, ?) ON CONFLICT DO NOTHING`,
		image, unixNano(s.now()))
	if err != nil {
		return fmt.Errorf("record build request for %s: %w", image, err)
	}
	return nil
}

// BuildRequests returns the pending manual build requests, by image.
func (s *Store) BuildRequests(ctx context.Context) (map[string]time.Time, error) {
	return s.imageTimes(ctx, `SELECT image, requested FROM build_requests`)
}

// ClearBuildRequest removes an image's build request, if it was made at or before
// asOf (a request made during the build it started is kept).
func (s *Store) ClearBuildRequest(ctx context.Context, image string, asOf time.Time) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM build_requests WHERE image = ? AND requested <= ?`, image, unixNano(asOf)); err != nil {
		return fmt.Errorf("clear build request for %s: %w", image, err)
	}
	return nil
}

// SetPaused pauses or unpauses an image at run time, on top of the config's pause.
// It is idempotent.
func (s *Store) SetPaused(ctx context.Context, image string, paused bool) error {
	var err error
	if paused {
		_, err = s.db.ExecContext(ctx, `INSERT INTO paused_images (image, paused) VALUES (?, ?) ON CONFLICT DO NOTHING`,
			image, unixNano(s.now()))
	} else {
		_, err = s.db.ExecContext(ctx, `DELETE FROM paused_images WHERE image = ?`, image)
	}
	if err != nil {
		return fmt.Errorf("set pause of %s: %w", image, err)
	}
	return nil
}

// Paused returns the images paused at run time, with when they were paused.
func (s *Store) Paused(ctx context.Context) (map[string]time.Time, error) {
	return s.imageTimes(ctx, `SELECT image, paused FROM paused_images`)
}

func (s *Store) imageTimes(ctx context.Context, q string) (map[string]time.Time, error) {
	rows, err := s.db.QueryContext(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("read image states: %w", err)
	}
	defer rows.Close()
	out := map[string]time.Time{}
	for rows.Next() {
		var image string
		var t int64
		if err := rows.Scan(&image, &t); err != nil {
			return nil, fmt.Errorf("read image states: %w", err)
		}
		out[image] = fromUnixNano(t)
	}
	return out, rows.Err()
}
