package store

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"
)

// Upload is a build's image in one provider's cloud.
type Upload struct {
	BuildID      string
	Image        string // the build's image (read only; from the build)
	Provider     string
	ID           string // 10-digit sequence per build and provider
	State        State
	StateTime    time.Time
	ExternalID   string
	ExternalName string
	Format       string
	Attempts     int
	LastError    string
	NextAttempt  time.Time // earliest retry after a failure
}

// CreateUpload records a new upload of a build to a provider, in state uploading,
// with the next free id.
func (s *Store) CreateUpload(ctx context.Context, buildID, provider, format string) (Upload, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return Upload{}, fmt.Errorf("record upload of %s to %s: %w", buildID, provider, err)
	}
	defer tx.Rollback()
	var last sql.NullString
	if err := tx.QueryRowContext(ctx, `SELECT MAX(id) FROM uploads WHERE build_id = ? AND provider = ?`, buildID, provider).Scan(&last); err != nil {
		return Upload{}, fmt.Errorf("record upload of %s to %s: %w", buildID, provider, err)
	}
	n := 0
	if last.Valid {
		fmt.Sscanf(last.String, "%d", &n)
	}
	now := s.now().UTC()
	u := Upload{BuildID: buildID, Provider: provider, ID: fmt.Sprintf("%010d", n+1), State: Uploading, StateTime: now, Format: format}
	if _, err := tx.ExecContext(ctx, `INSERT INTO uploads (build_id, provider, id, state, state_time, format)
		VALUES (?, ?, ?, ?, ?, ?)`, u.BuildID, u.Provider, u.ID, string(u.State), unixNano(now), u.Format); err != nil {
		return Upload{}, fmt.Errorf("record upload of %s to %s: %w", buildID, provider, err)
	}
	if err := tx.QueryRowContext(ctx, `SELECT image FROM builds WHERE id = ?`, buildID).Scan(&u.Image); err != nil {
		return Upload{}, fmt.Errorf("record upload of %s to %s: %w", buildID, provider, err)
	}
	return u, tx.Commit()
}

// UpdateUpload stores an upload's mutable fields. A changed State also sets StateTime.
func (s *Store) UpdateUpload(ctx context.Context, u Upload) error {
	res, err := s.db.ExecContext(ctx, `UPDATE uploads SET
		state_time = CASE WHEN state = ? THEN state_time ELSE ? END,
		state = ?, external_id = ?, external_name = ?, attempts = ?, last_error = ?, next_attempt = ?
		WHERE build_id = ? AND provider = ? AND id = ?`,
		string(u.State), unixNano(s.now()), string(u.State), u.ExternalID, u.ExternalName, u.Attempts, u.LastError,
		unixNano(u.NextAttempt), u.BuildID, u.Provider, u.ID)
	if err != nil {
		return fmt.Errorf("update upload %s: %w", u, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("update upload %s: %w", u, ErrNotFound)
	}
	return nil
}

// DeleteUpload removes an upload's record.
func (s *Store) DeleteUpload(ctx context.Context, u Upload) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM uploads WHERE build_id = ? AND provider = ? AND id = ?`,
		u.BuildID, u.Provider, u.ID); err != nil {
		return fmt.Errorf("delete upload record %s: %w", u, err)
	}
	return nil
}

// String names an upload for messages.
func (u Upload) String() string {
	return fmt.Sprintf("%s-%s/%s/%s", u.Image, u.BuildID, u.Provider, u.ID)
}

// UploadFilter selects uploads; zero fields match everything.
type UploadFilter struct {
	BuildID  string
	Image    string
	Provider string
	State    State
}

// Uploads returns the uploads that match f, newest first.
func (s *Store) Uploads(ctx context.Context, f UploadFilter) ([]Upload, error) {
	var where []string
	var args []any
	if f.BuildID != "" {
		where, args = append(where, "u.build_id = ?"), append(args, f.BuildID)
	}
	if f.Image != "" {
		where, args = append(where, "b.image = ?"), append(args, f.Image)
	}
	if f.Provider != "" {
		where, args = append(where, "u.provider = ?"), append(args, f.Provider)
	}
	if f.State != "" {
		where, args = append(where, "u.state = ?"), append(args, string(f.State))
	}
	q := `SELECT u.build_id, b.image, u.provider, u.id, u.state, u.state_time, u.external_id, u.external_name,
		u.format, u.attempts, u.last_error, u.next_attempt
		FROM uploads u JOIN builds b ON b.id = u.build_id`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY b.created DESC, u.build_id, u.provider, u.id DESC"
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list uploads: %w", err)
	}
	defer rows.Close()
	var out []Upload
	for rows.Next() {
		var u Upload
		var st string
		var stateTime, next int64
		if err := rows.Scan(&u.BuildID, &u.Image, &u.Provider, &u.ID, &st, &stateTime, &u.ExternalID, &u.ExternalName,
			&u.Format, &u.Attempts, &u.LastError, &next); err != nil {
			return nil, fmt.Errorf("list uploads: %w", err)
		}
		u.State, u.StateTime, u.NextAttempt = State(st), fromUnixNano(stateTime), fromUnixNano(next)
		out = append(out, u)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list uploads: %w", err)
	}
	return out, nil
}

// LeakMark records the first time a cloud image looked leaked; it returns when
// that was, so a sweep can wait for a second sighting before deleting.
func (s *Store) LeakMark(ctx context.Context, provider, externalID string) (time.Time, error) {
	now := unixNano(s.now())
	if _, err := s.db.ExecContext(ctx, `INSERT INTO leak_marks (provider, external_id, first_seen) VALUES (?, ?, ?)
		ON CONFLICT DO NOTHING`, provider, externalID, now); err != nil {
		return time.Time{}, fmt.Errorf("record leaked image %s in %s: %w", externalID, provider, err)
	}
	var first int64
	err := s.db.QueryRowContext(ctx, `SELECT first_seen FROM leak_marks WHERE provider = ? AND external_id = ?`, provider, externalID).Scan(&first)
	if err != nil {
		return time.Time{}, fmt.Errorf("read leaked image %s in %s: %w", externalID, provider, err)
	}
	return fromUnixNano(first), nil
}

// ClearLeakMarks forgets the marks of a provider except the given ids.
func (s *Store) ClearLeakMarks(ctx context.Context, provider string, keep map[string]bool) error {
	rows, err := s.db.QueryContext(ctx, `SELECT external_id FROM leak_marks WHERE provider = ?`, provider)
	if err != nil {
		return fmt.Errorf("list leak marks of %s: %w", provider, err)
	}
	var drop []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return fmt.Errorf("list leak marks of %s: %w", provider, err)
		}
		if !keep[id] {
			drop = append(drop, id)
		}
	}
	rows.Close()
	for _, id := range drop {
		if _, err := s.db.ExecContext(ctx, `DELETE FROM leak_marks WHERE provider = ? AND external_id = ?`, provider, id); err != nil {
			return fmt.Errorf("clear leak mark %s in %s: %w", id, provider, err)
		}
	}
	return nil
}
