// Package store owns the images-dir: the layout of image files and their checksum
// sidecars, and the SQLite state of builds, uploads and Zuul poll cursors.
package store

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// ErrNotFound is returned (wrapped) when a build or upload does not exist.
var ErrNotFound = errors.New("not found")

// Store is an opened images-dir and its state database.
type Store struct {
	dir       string
	db        *sql.DB
	builderID string
	now       func() time.Time
}

// Options say where the images-dir and its database are.
type Options struct {
	ImagesDir string
	DBPath    string           // default <ImagesDir>/builder.db
	Now       func() time.Time // default time.Now
}

// Open opens (creating if needed) the images-dir and its state database.
// Several processes may open the same store: the database runs in WAL mode.
func Open(ctx context.Context, opts Options) (*Store, error) {
	if opts.ImagesDir == "" {
		return nil, errors.New("open store: images-dir is not set")
	}
	if err := os.MkdirAll(filepath.Join(opts.ImagesDir, partialDirName), 0o755); err != nil {
		return nil, fmt.Errorf("create images-dir: %w", err)
	}
	dbPath := opts.DBPath
	if dbPath == "" {
		dbPath = filepath.Join(opts.ImagesDir, "builder.db")
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	q := url.Values{}
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "foreign_keys(1)")
	q.Add("_pragma", "busy_timeout(10000)")
	q.Add("_pragma", "synchronous(NORMAL)")
	q.Set("_txlock", "immediate")
	db, err := sql.Open("sqlite", "file:"+dbPath+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("open state database %s: %w", dbPath, err)
	}
	s := &Store{dir: opts.ImagesDir, db: db, now: opts.Now}
	if err := s.migrate(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("prepare state database %s: %w", dbPath, err)
	}
	id, err := readOrCreateBuilderID(opts.ImagesDir)
	if err != nil {
		db.Close()
		return nil, err
	}
	s.builderID = id
	return s, nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

// BuilderID is this images-dir's builder id (builder_id.txt, as nodepool writes it).
func (s *Store) BuilderID() string { return s.builderID }

// Dir is the images-dir.
func (s *Store) Dir() string { return s.dir }

func readOrCreateBuilderID(dir string) (string, error) {
	path := filepath.Join(dir, "builder_id.txt")
	data, err := os.ReadFile(path)
	if err == nil && strings.TrimSpace(string(data)) != "" {
		return strings.TrimSpace(string(data)), nil
	}
	if err != nil && !os.IsNotExist(err) {
		return "", fmt.Errorf("read builder id: %w", err)
	}
	id := newUUID4()
	if err := writeFileAtomic(path, []byte(id)); err != nil {
		return "", fmt.Errorf("write builder id: %w", err)
	}
	return id, nil
}

// newUUID4 returns a random (version 4) UUID in its dashed form.
func newUUID4() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// NewBuildID returns a build id: a uuid4 in hex, as nodepool uses.
func NewBuildID() string { return strings.ReplaceAll(newUUID4(), "-", "") }

var migrations = []string{
	// 1: the first schema.
	`
CREATE TABLE builds (
	id            TEXT PRIMARY KEY,
	image         TEXT NOT NULL,
	source        TEXT NOT NULL CHECK (source IN ('dib', 'zuul')),
	state         TEXT NOT NULL CHECK (state IN ('building', 'ready', 'deleting', 'failed')),
	state_time    INTEGER NOT NULL,
	created       INTEGER NOT NULL,
	builder_id    TEXT NOT NULL,
	pid           INTEGER NOT NULL DEFAULT 0,
	reason        TEXT NOT NULL DEFAULT '',
	zuul_uuid     TEXT NOT NULL DEFAULT '',
	zuul_id       INTEGER NOT NULL DEFAULT 0,
	zuul_end_time INTEGER NOT NULL DEFAULT 0,
	zuul_log_url  TEXT NOT NULL DEFAULT ''
);
CREATE INDEX builds_image ON builds (image, created);
CREATE TABLE build_files (
	build_id TEXT NOT NULL REFERENCES builds (id) ON DELETE CASCADE,
	format   TEXT NOT NULL,
	sha256   TEXT NOT NULL DEFAULT '',
	md5      TEXT NOT NULL DEFAULT '',
	size     INTEGER NOT NULL DEFAULT 0,
	url      TEXT NOT NULL DEFAULT '',
	present  INTEGER NOT NULL DEFAULT 1,
	PRIMARY KEY (build_id, format)
);
CREATE TABLE uploads (
	build_id      TEXT NOT NULL REFERENCES builds (id),
	provider      TEXT NOT NULL,
	id            TEXT NOT NULL,
	state         TEXT NOT NULL CHECK (state IN ('uploading', 'ready', 'deleting', 'failed')),
	state_time    INTEGER NOT NULL,
	external_id   TEXT NOT NULL DEFAULT '',
	external_name TEXT NOT NULL DEFAULT '',
	format        TEXT NOT NULL,
	attempts      INTEGER NOT NULL DEFAULT 0,
	last_error    TEXT NOT NULL DEFAULT '',
	next_attempt  INTEGER NOT NULL DEFAULT 0,
	PRIMARY KEY (build_id, provider, id)
);
CREATE TABLE poll_cursors (
	image      TEXT PRIMARY KEY,
	zuul_id    INTEGER NOT NULL,
	zuul_uuid  TEXT NOT NULL,
	outcome    TEXT NOT NULL,
	reason     TEXT NOT NULL DEFAULT '',
	time       INTEGER NOT NULL
);
CREATE TABLE leak_marks (
	provider    TEXT NOT NULL,
	external_id TEXT NOT NULL,
	first_seen  INTEGER NOT NULL,
	PRIMARY KEY (provider, external_id)
);
`,
	// 2: admin requests: manual builds and paused images.
	`
CREATE TABLE build_requests (
	image     TEXT PRIMARY KEY,
	requested INTEGER NOT NULL
);
CREATE TABLE paused_images (
	image  TEXT PRIMARY KEY,
	paused INTEGER NOT NULL
);
`,
}

func (s *Store) migrate(ctx context.Context) error {
	if _, err := s.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)`); err != nil {
		return err
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var v int
	err = tx.QueryRowContext(ctx, `SELECT version FROM schema_version`).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		if _, err := tx.ExecContext(ctx, `INSERT INTO schema_version (version) VALUES (0)`); err != nil {
			return err
		}
	} else if err != nil {
		return err
	}
	if v > len(migrations) {
		return fmt.Errorf("database schema version %d is newer than this program knows (%d); use a newer nodepool-builder", v, len(migrations))
	}
	for i := v; i < len(migrations); i++ {
		if _, err := tx.ExecContext(ctx, migrations[i]); err != nil {
			return fmt.Errorf("migration %d: %w", i+1, err)
		}
	}
	if _, err := tx.ExecContext(ctx, `UPDATE schema_version SET version = ?`, len(migrations)); err != nil {
		return err
	}
	return tx.Commit()
}

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromUnixNano(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}
