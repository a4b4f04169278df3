package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"
)

// Source says where a build came from.
type Source string

// Build sources.
const (
	SourceDIB  Source = "dib"
	SourceZuul Source = "zuul"
)

// State is the state of a build or an upload.
type State string

// States of builds and uploads.
const (
	Building  State = "building"
	Uploading State = "uploading"
	Ready     State = "ready"
	Deleting  State = "deleting"
	Failed    State = "failed"
)

// Build is an image build: files in the images-dir and their record.
type Build struct {
	ID        string
	Image     string
	Source    Source
	State     State
	StateTime time.Time
	Created   time.Time
	BuilderID string
	PID       int    // the building process, for crash recovery
	Reason    string // why it failed
	Files     []File // sorted by format
	Zuul      ZuulRef
}

// ZuulRef identifies the Zuul build a build was fetched from.
type ZuulRef struct {
	UUID    string
	ID      int64
	EndTime time.Time
	LogURL  string
}

// File is one format of a build.
type File struct {
	Format  string
	SHA256  string
	MD5     string
	Size    int64
	URL     string // the artifact it came from, for Zuul builds
	Present bool   // still on disk (false once removed after upload)
}

// Name is the build's nodepool-style name, <image>-<build_id>.
func (b Build) Name() string { return b.Image + "-" + b.ID }

// File returns the build's file of a format.
func (b Build) File(format string) (File, bool) {
	for _, f := range b.Files {
		if f.Format == format {
			return f, true
		}
	}
	return File{}, false
}

// Formats lists the formats the build has on disk.
func (b Build) Formats() []string {
	var out []string
	for _, f := range b.Files {
		if f.Present {
			out = append(out, f.Format)
		}
	}
	return out
}

// CreateBuild records a new build in state building and returns it with its id.
func (s *Store) CreateBuild(ctx context.Context, b Build) (Build, error) {
	if b.ID == "" {
		b.ID = NewBuildID()
	}
	now := s.now().UTC()
	b.State, b.StateTime, b.Created, b.BuilderID = Building, now, now, s.builderID
	_, err := s.db.ExecContext(ctx, `INSERT INTO builds
		(id, image, source, state, state_time, created, builder_id, pid, zuul_uuid, zuul_id, zuul_end_time, zuul_log_url)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		b.ID, b.Image, string(b.Source), string(b.State), unixNano(now), unixNano(now), b.BuilderID, b.PID,
		b.Zuul.UUID, b.Zuul.ID, unixNano(b.Zuul.EndTime), b.Zuul.LogURL)
	if err != nil {
		return Build{}, fmt.Errorf("record build %s: %w", b.Name(), err)
	}
	return b, nil
}

// AddFile records (or replaces) a verified file of a build.
func (s *Store) AddFile(ctx context.Context, buildID string, f File) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO build_files (build_id, format, sha256, md5, size, url, present)
		VALUES (?, ?, ?, ?, ?, ?, 1)
		ON CONFLICT (build_id, format) DO UPDATE SET sha256 = excluded.sha256, md5 = excluded.md5,
			size = excluded.size, url = excluded.url, present = 1`,
		buildID, f.Format, f.SHA256, f.MD5, f.Size, f.URL)
	if err != nil {
		return fmt.Errorf("record %s file of build %s: %w", f.Format, buildID, err)
	}
	return nil
}

// MarkFileRemoved records that a build's file of a format is no longer on disk.
func (s *Store) MarkFileRemoved(ctx context.Context, buildID, format string) error {
	_, err := s.db.ExecContext(ctx, `UPDATE build_files SET present = 0 WHERE build_id = ? AND format = ?`, buildID, format)
	if err != nil {
		return fmt.Errorf("record removal of %s file of build %s: %w", format, buildID, err)
	}
	return nil
}

// SetBuildState moves a build to a state; reason says why it failed.
func (s *Store) SetBuildState(ctx context.Context, id string, st State, reason string) error {
	res, err := s.db.ExecContext(ctx, `UPDATE builds SET state = ?, state_time = ?, reason = ? WHERE id = ?`,
		string(st), unixNano(s.now()), reason, id)
	if err != nil {
		return fmt.Errorf("set build %s %s: %w", id, st, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("set build %s %s: %w", id, st, ErrNotFound)
	}
	return nil
}

// DeleteBuild removes a build's record and its file records. Its uploads must be gone.
func (s *Store) DeleteBuild(ctx context.Context, id string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM builds WHERE id = ?`, id); err != nil {
		return fmt.Errorf("delete build record %s: %w", id, err)
	}
	return nil
}

// BuildFilter selects builds; zero fields match everything.
type BuildFilter struct {
	Image  string
	State  State
	Source Source
}

const buildColumns = `id, image, source, state, state_time, created, builder_id, pid, reason,
	zuul_uuid, zuul_id, zuul_end_time, zuul_log_url`

// Builds returns the builds that match f, newest first.
func (s *Store) Builds(ctx context.Context, f BuildFilter) ([]Build, error) {
	var where []string
	var args []any
	if f.Image != "" {
		where, args = append(where, "image = ?"), append(args, f.Image)
	}
	if f.State != "" {
		where, args = append(where, "state = ?"), append(args, string(f.State))
	}
	if f.Source != "" {
		where, args = append(where, "source = ?"), append(args, string(f.Source))
	}
	q := `SELECT ` + buildColumns + ` FROM builds`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY created DESC, rowid DESC"
	return s.queryBuilds(ctx, q, args...)
}

// Build returns one build.
func (s *Store) Build(ctx context.Context, id string) (Build, error) {
	bs, err := s.queryBuilds(ctx, `SELECT `+buildColumns+` FROM builds WHERE id = ?`, id)
	if err != nil {
		return Build{}, err
	}
	if len(bs) == 0 {
		return Build{}, fmt.Errorf("build %s: %w", id, ErrNotFound)
	}
	return bs[0], nil
}

func (s *Store) queryBuilds(ctx context.Context, q string, args ...any) ([]Build, error) {
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list builds: %w", err)
	}
	defer rows.Close()
	var out []Build
	index := map[string]int{}
	for rows.Next() {
		var b Build
		var src, st string
		var stateTime, created, zuulEnd int64
		if err := rows.Scan(&b.ID, &b.Image, &src, &st, &stateTime, &created, &b.BuilderID, &b.PID, &b.Reason,
			&b.Zuul.UUID, &b.Zuul.ID, &zuulEnd, &b.Zuul.LogURL); err != nil {
			return nil, fmt.Errorf("list builds: %w", err)
		}
		b.Source, b.State = Source(src), State(st)
		b.StateTime, b.Created, b.Zuul.EndTime = fromUnixNano(stateTime), fromUnixNano(created), fromUnixNano(zuulEnd)
		index[b.ID] = len(out)
		out = append(out, b)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list builds: %w", err)
	}
	if len(out) == 0 {
		return out, nil
	}
	if err := s.loadFiles(ctx, out, index); err != nil {
		return nil, err
	}
	return out, nil
}

func (s *Store) loadFiles(ctx context.Context, builds []Build, index map[string]int) error {
	ids := make([]any, 0, len(builds))
	for _, b := range builds {
		ids = append(ids, b.ID)
	}
	// SQLite caps bound parameters; page the lookups.
	for start := 0; start < len(ids); start += 500 {
		end := min(start+500, len(ids))
		chunk := ids[start:end]
		q := `SELECT build_id, format, sha256, md5, size, url, present FROM build_files WHERE build_id IN (?` +
			strings.Repeat(",?", len(chunk)-1) + `)`
		rows, err := s.db.QueryContext(ctx, q, chunk...)
		if err != nil {
			return fmt.Errorf("list build files: %w", err)
		}
		for rows.Next() {
			var id string
			var f File
			if err := rows.Scan(&id, &f.Format, &f.SHA256, &f.MD5, &f.Size, &f.URL, &f.Present); err != nil {
				rows.Close()
				return fmt.Errorf("list build files: %w", err)
			}
			i := index[id]
			builds[i].Files = append(builds[i].Files, f)
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return fmt.Errorf("list build files: %w", err)
		}
	}
	for i := range builds {
		sort.Slice(builds[i].Files, func(a, b int) bool { return builds[i].Files[a].Format < builds[i].Files[b].Format })
	}
	return nil
}

// Cursor is how far the poller has got with one zuul-image.
type Cursor struct {
	Image    string
	ZuulID   int64  // the newest Zuul build settled (ingested or refused)
	ZuulUUID string // its uuid
	Outcome  string // "ready" or "failed"
	Reason   string
	Time     time.Time
}

// Cursor returns an image's poll cursor; a zero Cursor when it has none.
func (s *Store) Cursor(ctx context.Context, image string) (Cursor, error) {
	c := Cursor{Image: image}
	var t int64
	err := s.db.QueryRowContext(ctx, `SELECT zuul_id, zuul_uuid, outcome, reason, time FROM poll_cursors WHERE image = ?`, image).
		Scan(&c.ZuulID, &c.ZuulUUID, &c.Outcome, &c.Reason, &t)
	if errors.Is(err, sql.ErrNoRows) {
		return c, nil
	}
	if err != nil {
		return c, fmt.Errorf("read poll cursor of %s: %w", image, err)
	}
	c.Time = fromUnixNano(t)
	return c, nil
}

// SetCursor records an image's poll cursor.
func (s *Store) SetCursor(ctx context.Context, c Cursor) error {
	if c.Time.IsZero() {
		c.Time = s.now()
	}
	_, err := s.db.ExecContext(ctx, `INSERT INTO poll_cursors (image, zuul_id, zuul_uuid, outcome, reason, time)
		VALUES (?, ?, ?, ?, ?, ?)
		ON CONFLICT (image) DO UPDATE SET zuul_id = excluded.zuul_id, zuul_uuid = excluded.zuul_uuid,
			outcome = excluded.outcome, reason = excluded.reason, time = excluded.time`,
		c.Image, c.ZuulID, c.ZuulUUID, c.Outcome, c.Reason, unixNano(c.Time))
	if err != nil {
		return fmt.Errorf("record poll cursor of %s: %w", c.Image, err)
	}
	return nil
}

// ParseBuildName splits a build's name, <image>-<build_id>, into its parts.
func ParseBuildName(name string) (image, id string, ok bool) {
	i := strings.LastIndex(name, "-")
	if i <= 0 || i == len(name)-1 {
		return "", "", false
	}
	return name[:i], name[i+1:], true
}
