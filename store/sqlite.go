package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver

	"github.com/nodepool-builder/nodepool-builder/internal/perm"
)

// SQLite is the embedded Backend: one database file in WAL mode, so admin
// commands read and write while the builder runs. Versions are a column that
// every write of a record increments.
type SQLite struct {
	db    *sql.DB
	path  string
	now   func() time.Time
	locks localLocks
	// log tells of records refused on read (see CheckBuild): a hand edit of
	// the database is input as ZooKeeper's records are.
	log       *slog.Logger
	refusedMu sync.Mutex
	refused   map[string]int64 // the records logged as refused, at the version logged
}

// sqliteIdleConns is how many connections stay open between queries.
const sqliteIdleConns = 16

// openSQLite opens the state database at path. With Create it makes the file
// when missing and brings its schema up to date, keeping a copy of the state
// as it was before an upgrade (see keepCopy). Otherwise it refuses a missing
// file (ErrNotInitialized) and a schema other than this program's: the
// builder upgrades the schema, not a command that may run beside an older
// builder; and with ReadOnly it writes nothing. log tells of the copy and of
// records refused on read; nil is slog's default logger.
func openSQLite(ctx context.Context, path string, access Access, now func() time.Time, log *slog.Logger) (*SQLite, error) {
	if now == nil {
		now = time.Now
	}
	if log == nil {
		log = slog.Default()
	}
	if access != Create {
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("state database %s does not exist: %w", path, ErrNotInitialized)
		}
	}
	if access == Create {
		if err := createPrivate(path); err != nil {
			return nil, fmt.Errorf("create state database %s: %w", path, err)
		}
	}
	q := url.Values{}
	q.Add("_pragma", "foreign_keys(1)")
	q.Add("_pragma", "busy_timeout(10000)")
	if access == ReadOnly {
		q.Set("mode", "ro")
	} else {
		q.Add("_pragma", "journal_mode(WAL)")
		q.Add("_pragma", "synchronous(NORMAL)")
		q.Set("_txlock", "immediate")
	}
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("open state database %s: %w", path, err)
	}
	// Keep connections for the steps that run at once: opening one parses the
	// schema again, which costs more than most queries.
	db.SetMaxIdleConns(sqliteIdleConns)
	s := &SQLite{db: db, path: path, now: now, log: log, refused: map[string]int64{}}
	if access == Create {
		err = s.migrate(ctx)
	} else {
		err = s.checkSchema(ctx)
	}
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("state database %s: %w", path, err)
	}
	return s, nil
}

// Close closes the database.
func (s *SQLite) Close() error { return s.db.Close() }

// TryLock takes a lock of this process: with SQLite one builder process works
// on the state (the images-dir lock sees to that), so its locks need not be
// shared. They are never lost.
func (s *SQLite) TryLock(ctx context.Context, key LockKey) (Held, error) {
	var q string
	var args []any
	switch {
	case key.UploadID != "":
		q, args = `SELECT 1 FROM uploads WHERE build_id = ? AND provider = ? AND id = ?`, []any{key.BuildID, key.Provider, key.UploadID}
	case key.BuildID != "":
		q, args = `SELECT 1 FROM builds WHERE id = ?`, []any{key.BuildID}
	}
	if q != "" {
		var one int
		err := s.db.QueryRowContext(ctx, q, args...).Scan(&one)
		if errors.Is(err, sql.ErrNoRows) {
			return nil, fmt.Errorf("lock %s: %w", key, ErrNotFound)
		}
		if err != nil {
			return nil, fmt.Errorf("lock %s: %w", key, err)
		}
	}
	return s.locks.try(key)
}

// A migration moves the schema one version on, in the transaction of the
// migrations that run together.
type migration func(ctx context.Context, tx *sql.Tx) error

// statements is a migration made of SQL statements alone.
func statements(q string) migration {
	return func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, q)
		return err
	}
}

var migrations = []migration{
	// 1: the first schema.
	statements(`
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
`),
	// 2: admin requests: manual builds and paused images.
	statements(`
CREATE TABLE build_requests (
	image     TEXT PRIMARY KEY,
	requested INTEGER NOT NULL
);
CREATE TABLE paused_images (
	image  TEXT PRIMARY KEY,
	paused INTEGER NOT NULL
);
`),
	// 3: record versions, for compare-and-set writes; upload ids that are never
	// used twice for a build and provider, as ZooKeeper's sequence nodes.
	statements(`
ALTER TABLE builds ADD COLUMN version INTEGER NOT NULL DEFAULT 1;
ALTER TABLE uploads ADD COLUMN version INTEGER NOT NULL DEFAULT 1;
CREATE TABLE upload_sequences (
	build_id TEXT NOT NULL REFERENCES builds (id) ON DELETE CASCADE,
	provider TEXT NOT NULL,
	last     INTEGER NOT NULL,
	PRIMARY KEY (build_id, provider)
);
INSERT INTO upload_sequences (build_id, provider, last)
	SELECT build_id, provider, MAX(CAST(id AS INTEGER)) FROM uploads GROUP BY build_id, provider;
`),
	// 4: formats refused for good, per build; the builder id the state belongs to.
	statements(`
CREATE TABLE build_refusals (
	build_id TEXT NOT NULL REFERENCES builds (id) ON DELETE CASCADE,
	format   TEXT NOT NULL,
	reason   TEXT NOT NULL,
	PRIMARY KEY (build_id, format)
);
CREATE TABLE meta (
	key   TEXT PRIMARY KEY,
	value TEXT NOT NULL
);
`),
	// 5: what nodepool records of a build and its uploads for the launcher.
	statements(`
ALTER TABLE builds ADD COLUMN hostname TEXT NOT NULL DEFAULT '';
ALTER TABLE builds ADD COLUMN username TEXT NOT NULL DEFAULT '';
ALTER TABLE builds ADD COLUMN python_path TEXT NOT NULL DEFAULT '';
ALTER TABLE builds ADD COLUMN shell_type TEXT NOT NULL DEFAULT '';
ALTER TABLE uploads ADD COLUMN username TEXT NOT NULL DEFAULT '';
ALTER TABLE uploads ADD COLUMN python_path TEXT NOT NULL DEFAULT '';
ALTER TABLE uploads ADD COLUMN shell_type TEXT NOT NULL DEFAULT '';
`),
	// 6: the request that asked for a build (a gearman job).
	statements(`
ALTER TABLE builds ADD COLUMN request TEXT NOT NULL DEFAULT '';
`),
	// 7: a poll cursor's end time of its Zuul build, Zuul's newest id when it
	// is behind the cursor, and the build a ready outcome became.
	statements(`
ALTER TABLE poll_cursors ADD COLUMN zuul_end_time INTEGER NOT NULL DEFAULT 0;
ALTER TABLE poll_cursors ADD COLUMN behind_id INTEGER NOT NULL DEFAULT 0;
ALTER TABLE poll_cursors ADD COLUMN build_id TEXT NOT NULL DEFAULT '';
`),
	// 8: why a poll cursor's Zuul build waits for the operator.
	statements(`
ALTER TABLE poll_cursors ADD COLUMN waiting TEXT NOT NULL DEFAULT '';
`),
	// 9: any source's name: a source is one package, which the schema does
	// not list.
	dropSourceCheck,
}

// sourceCheck is the constraint the first schema put on builds.source.
const sourceCheck = " CHECK (source IN ('dib', 'zuul'))"

// dropSourceCheck removes sourceCheck from the builds table as SQLite
// documents for removing a CHECK constraint: the table's SQL is edited in
// place, which leaves its rows and the foreign keys that name it as they
// are, and the schema's version is bumped so that every connection reads the
// schema again.
func dropSourceCheck(ctx context.Context, tx *sql.Tx) error {
	var version int
	if err := tx.QueryRowContext(ctx, "PRAGMA schema_version").Scan(&version); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, "PRAGMA writable_schema = ON"); err != nil {
		return err
	}
	res, err := tx.ExecContext(ctx, "UPDATE sqlite_schema SET sql = replace(sql, ?, '') WHERE type = 'table' AND name = 'builds'",
		sourceCheck)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return fmt.Errorf("the builds table was not found to edit (%d rows, %v)", n, err)
	}
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA schema_version = %d", version+1)); err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, "PRAGMA writable_schema = OFF")
	return err
}

// migrate brings the schema up to date. Before it changes the schema of a
// state that has one, it keeps a copy of the state as it is.
func (s *SQLite) migrate(ctx context.Context) error {
	if _, err := s.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)`); err != nil {
		return err
	}
	// VACUUM INTO cannot run in a transaction, so the copy is made before the
	// migrations' transaction, which reads the version again: should another
	// process upgrade the state in between, the copy is still of the state
	// before an upgrade.
	var v int
	err := s.db.QueryRowContext(ctx, `SELECT version FROM schema_version`).Scan(&v)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("read schema version: %w", err)
	}
	if v > 0 && v < len(migrations) {
		if err := s.keepCopy(ctx, v); err != nil {
			return err
		}
	}
	return s.inTx(ctx, func(tx *sql.Tx) error {
		var v int
		err := tx.QueryRowContext(ctx, `SELECT version FROM schema_version`).Scan(&v)
		if errors.Is(err, sql.ErrNoRows) {
			if _, err := tx.ExecContext(ctx, `INSERT INTO schema_version (version) VALUES (0)`); err != nil {
				return err
			}
		} else if err != nil {
			return err
		}
		if v > len(migrations) {
			return s.newerSchema(v)
		}
		for i := v; i < len(migrations); i++ {
			if err := migrations[i](ctx, tx); err != nil {
				return fmt.Errorf("migration %d: %w", i+1, err)
			}
		}
		_, err = tx.ExecContext(ctx, `UPDATE schema_version SET version = ?`, len(migrations))
		return err
	})
}

// checkSchema makes sure a database opened without Create has the schema this
// program reads; it does not migrate it.
func (s *SQLite) checkSchema(ctx context.Context) error {
	var v int
	if err := s.db.QueryRowContext(ctx, `SELECT version FROM schema_version`).Scan(&v); err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	switch {
	case v > len(migrations):
		return s.newerSchema(v)
	case v < len(migrations):
		return fmt.Errorf("schema version %d is older than this program's (%d); run the builder (daemon or --once) once to upgrade it", v, len(migrations))
	}
	return nil
}

// inTx runs fn in one transaction; read-write connections open IMMEDIATE
// transactions, so the checks in fn and the writes after them see one state.
func (s *SQLite) inTx(ctx context.Context, fn func(*sql.Tx) error) error {
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

// BindBuilder records the builder id the state belongs to, or checks it.
func (s *SQLite) BindBuilder(ctx context.Context, id string) (string, error) {
	var held string
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		err := tx.QueryRowContext(ctx, `SELECT value FROM meta WHERE key = 'builder_id'`).Scan(&held)
		if errors.Is(err, sql.ErrNoRows) {
			held = id
			_, err = tx.ExecContext(ctx, `INSERT INTO meta (key, value) VALUES ('builder_id', ?)`, id)
		}
		return err
	})
	if err != nil {
		return "", fmt.Errorf("record builder id: %w", err)
	}
	if held != id {
		return held, fmt.Errorf("%w: it holds builder id %s, not %s", ErrOtherBuilder, held, id)
	}
	return held, nil
}

// Write applies changes in one transaction.
func (s *SQLite) Write(ctx context.Context, changes ...Change) error {
	// Versions and ids reach the caller's records only once the write commits.
	var after []func()
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		after = after[:0]
		for _, c := range changes {
			var err error
			var done func()
			switch c.op {
			case opPutBuild:
				done, err = putBuild(ctx, tx, c.build)
			case opDeleteBuild:
				err = deleteBuild(ctx, tx, c.build)
			case opPutUpload:
				done, err = putUpload(ctx, tx, c.upload)
			case opDeleteUpload:
				err = deleteUpload(ctx, tx, c.upload)
			case opPutCursor:
				err = putCursor(ctx, tx, c.cursor)
			default:
				err = errors.New("unknown change")
			}
			if err != nil {
				return err
			}
			if done != nil {
				after = append(after, done)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, f := range after {
		f()
	}
	return nil
}

func putBuild(ctx context.Context, tx *sql.Tx, b *Build) (func(), error) {
	if b.ID == "" || b.Image == "" {
		return nil, errors.New("write build: id and image are required")
	}
	args := []any{b.Image, string(b.Source), string(b.State), unixNano(b.StateTime), unixNano(b.Created), b.BuilderID,
		b.PID, b.Reason, b.Zuul.UUID, b.Zuul.ID, unixNano(b.Zuul.EndTime), b.Zuul.LogURL,
		b.Hostname, b.Username, b.PythonPath, b.ShellType, b.Request}
	if b.Version == 0 {
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM builds WHERE id = ?`, b.ID).Scan(&n); err != nil {
			return nil, fmt.Errorf("write build %s: %w", b.Name(), err)
		}
		if n > 0 {
			return nil, fmt.Errorf("create build %s: %w: it exists already", b.Name(), ErrConflict)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO builds
			(image, source, state, state_time, created, builder_id, pid, reason, zuul_uuid, zuul_id, zuul_end_time, zuul_log_url,
			hostname, username, python_path, shell_type, request, id, version)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1)`, append(args, b.ID)...); err != nil {
			return nil, fmt.Errorf("create build %s: %w", b.Name(), err)
		}
	} else {
		res, err := tx.ExecContext(ctx, `UPDATE builds SET image = ?, source = ?, state = ?, state_time = ?, created = ?,
			builder_id = ?, pid = ?, reason = ?, zuul_uuid = ?, zuul_id = ?, zuul_end_time = ?, zuul_log_url = ?,
			hostname = ?, username = ?, python_path = ?, shell_type = ?, request = ?, version = version + 1
			WHERE id = ? AND version = ?`, append(args, b.ID, b.Version)...)
		if err != nil {
			return nil, fmt.Errorf("write build %s: %w", b.Name(), err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return nil, fmt.Errorf("write build %s (version %d): %w", b.Name(), b.Version, ErrConflict)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM build_files WHERE build_id = ?`, b.ID); err != nil {
			return nil, fmt.Errorf("write build %s: %w", b.Name(), err)
		}
	}
	for _, f := range b.Files {
		if _, err := tx.ExecContext(ctx, `INSERT INTO build_files (build_id, format, sha256, md5, size, url, present)
			VALUES (?, ?, ?, ?, ?, ?, ?)`, b.ID, f.Format, f.SHA256, f.MD5, f.Size, f.URL, f.Present); err != nil {
			return nil, fmt.Errorf("write %s file of build %s: %w", f.Format, b.Name(), err)
		}
	}
	if b.Version != 0 {
		if _, err := tx.ExecContext(ctx, `DELETE FROM build_refusals WHERE build_id = ?`, b.ID); err != nil {
			return nil, fmt.Errorf("write build %s: %w", b.Name(), err)
		}
	}
	for format, reason := range b.Refused {
		if _, err := tx.ExecContext(ctx, `INSERT INTO build_refusals (build_id, format, reason) VALUES (?, ?, ?)`,
			b.ID, format, reason); err != nil {
			return nil, fmt.Errorf("write refusal of %s of build %s: %w", format, b.Name(), err)
		}
	}
	next := b.Version + 1
	return func() { b.Version = next }, nil
}

func deleteBuild(ctx context.Context, tx *sql.Tx, b *Build) error {
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM uploads WHERE build_id = ?`, b.ID).Scan(&n); err != nil {
		return fmt.Errorf("delete build %s: %w", b.Name(), err)
	}
	if n > 0 {
		return fmt.Errorf("delete build %s: %w: it still has %d upload(s)", b.Name(), ErrConflict, n)
	}
	res, err := tx.ExecContext(ctx, `DELETE FROM builds WHERE id = ? AND version = ?`, b.ID, b.Version)
	if err != nil {
		return fmt.Errorf("delete build %s: %w", b.Name(), err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("delete build %s (version %d): %w", b.Name(), b.Version, ErrConflict)
	}
	return nil
}

func putUpload(ctx context.Context, tx *sql.Tx, u *Upload) (func(), error) {
	if u.BuildID == "" || u.Provider == "" {
		return nil, errors.New("write upload: build id and provider are required")
	}
	args := []any{string(u.State), unixNano(u.StateTime), u.ExternalID, u.ExternalName, u.Format, u.Attempts,
		u.LastError, unixNano(u.NextAttempt), u.Username, u.PythonPath, u.ShellType}
	if u.Version == 0 {
		if u.ID != "" {
			return nil, fmt.Errorf("create upload %s: the store assigns upload ids", u)
		}
		var image string
		err := tx.QueryRowContext(ctx, `SELECT image FROM builds WHERE id = ?`, u.BuildID).Scan(&image)
		if errors.Is(err, sql.ErrNoRows) {
			return nil, fmt.Errorf("create upload of build %s to %s: %w: the build is gone", u.BuildID, u.Provider, ErrConflict)
		}
		if err != nil {
			return nil, fmt.Errorf("create upload of build %s to %s: %w", u.BuildID, u.Provider, err)
		}
		var n int64
		if err := tx.QueryRowContext(ctx, `INSERT INTO upload_sequences (build_id, provider, last) VALUES (?, ?, 1)
			ON CONFLICT (build_id, provider) DO UPDATE SET last = last + 1 RETURNING last`,
			u.BuildID, u.Provider).Scan(&n); err != nil {
			return nil, fmt.Errorf("create upload of build %s to %s: %w", u.BuildID, u.Provider, err)
		}
		id := fmt.Sprintf("%010d", n)
		if _, err := tx.ExecContext(ctx, `INSERT INTO uploads (state, state_time, external_id, external_name, format,
			attempts, last_error, next_attempt, username, python_path, shell_type, build_id, provider, id, version)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1)`, append(args, u.BuildID, u.Provider, id)...); err != nil {
			return nil, fmt.Errorf("create upload of build %s to %s: %w", u.BuildID, u.Provider, err)
		}
		return func() { u.ID, u.Image, u.Version = id, image, 1 }, nil
	}
	res, err := tx.ExecContext(ctx, `UPDATE uploads SET state = ?, state_time = ?, external_id = ?, external_name = ?,
		format = ?, attempts = ?, last_error = ?, next_attempt = ?, username = ?, python_path = ?, shell_type = ?,
		version = version + 1
		WHERE build_id = ? AND provider = ? AND id = ? AND version = ?`, append(args, u.BuildID, u.Provider, u.ID, u.Version)...)
	if err != nil {
		return nil, fmt.Errorf("write upload %s: %w", u, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return nil, fmt.Errorf("write upload %s (version %d): %w", u, u.Version, ErrConflict)
	}
	next := u.Version + 1
	return func() { u.Version = next }, nil
}

func deleteUpload(ctx context.Context, tx *sql.Tx, u *Upload) error {
	res, err := tx.ExecContext(ctx, `DELETE FROM uploads WHERE build_id = ? AND provider = ? AND id = ? AND version = ?`,
		u.BuildID, u.Provider, u.ID, u.Version)
	if err != nil {
		return fmt.Errorf("delete upload %s: %w", u, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("delete upload %s (version %d): %w", u, u.Version, ErrConflict)
	}
	return nil
}

func putCursor(ctx context.Context, tx *sql.Tx, c *Cursor) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO poll_cursors (image, zuul_id, zuul_uuid, outcome, reason, time, zuul_end_time, behind_id, build_id, waiting)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (image) DO UPDATE SET zuul_id = excluded.zuul_id, zuul_uuid = excluded.zuul_uuid,
			outcome = excluded.outcome, reason = excluded.reason, time = excluded.time,
			zuul_end_time = excluded.zuul_end_time, behind_id = excluded.behind_id, build_id = excluded.build_id,
			waiting = excluded.waiting`,
		c.Image, c.ZuulID, c.ZuulUUID, c.Outcome, c.Reason, unixNano(c.Time), unixNano(c.ZuulEndTime), c.BehindID, c.Build, c.Waiting)
	if err != nil {
		return fmt.Errorf("record poll cursor of %s: %w", c.Image, err)
	}
	return nil
}

const buildColumns = `id, image, source, state, state_time, created, builder_id, pid, reason,
	zuul_uuid, zuul_id, zuul_end_time, zuul_log_url, version, hostname, username, python_path, shell_type, request`

// Builds returns the builds that match f, newest first.
func (s *SQLite) Builds(ctx context.Context, f BuildFilter) ([]Build, error) {
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
	builds, err := s.queryBuilds(ctx, q, args...)
	return slices.DeleteFunc(builds, func(b Build) bool {
		return s.refuse("build "+b.Name(), b.Version, CheckBuild(b)) != nil
	}), err
}

// Build returns one build.
func (s *SQLite) Build(ctx context.Context, id string) (Build, error) {
	bs, err := s.queryBuilds(ctx, `SELECT `+buildColumns+` FROM builds WHERE id = ?`, id)
	if err != nil {
		return Build{}, err
	}
	if len(bs) == 0 {
		return Build{}, fmt.Errorf("build %s: %w", id, ErrNotFound)
	}
	if err := s.refuse("build "+bs[0].Name(), bs[0].Version, CheckBuild(bs[0])); err != nil {
		return Build{}, err
	}
	return bs[0], nil
}

func (s *SQLite) queryBuilds(ctx context.Context, q string, args ...any) ([]Build, error) {
	// Builds and their files are read in one transaction, so a build is never
	// seen with another version's files.
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("list builds: %w", err)
	}
	defer tx.Rollback()
	rows, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list builds: %w", err)
	}
	var out []Build
	index := map[string]int{}
	for rows.Next() {
		var b Build
		var src, st string
		var stateTime, created, zuulEnd int64
		if err := rows.Scan(&b.ID, &b.Image, &src, &st, &stateTime, &created, &b.BuilderID, &b.PID, &b.Reason,
			&b.Zuul.UUID, &b.Zuul.ID, &zuulEnd, &b.Zuul.LogURL, &b.Version, &b.Hostname, &b.Username, &b.PythonPath,
			&b.ShellType, &b.Request); err != nil {
			rows.Close()
			return nil, fmt.Errorf("list builds: %w", err)
		}
		b.Source, b.State = SourceName(src), State(st)
		b.StateTime, b.Created, b.Zuul.EndTime = fromUnixNano(stateTime), fromUnixNano(created), fromUnixNano(zuulEnd)
		index[b.ID] = len(out)
		out = append(out, b)
	}
	err = rows.Err()
	rows.Close()
	if err != nil {
		return nil, fmt.Errorf("list builds: %w", err)
	}
	if len(out) == 0 {
		return out, nil
	}
	if err := loadFiles(ctx, tx, out, index); err != nil {
		return nil, err
	}
	return out, nil
}

func loadFiles(ctx context.Context, tx *sql.Tx, builds []Build, index map[string]int) error {
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
		rows, err := tx.QueryContext(ctx, q, chunk...)
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
	for start := 0; start < len(ids); start += 500 {
		chunk := ids[start:min(start+500, len(ids))]
		rows, err := tx.QueryContext(ctx, `SELECT build_id, format, reason FROM build_refusals WHERE build_id IN (?`+
			strings.Repeat(",?", len(chunk)-1)+`)`, chunk...)
		if err != nil {
			return fmt.Errorf("list refused formats: %w", err)
		}
		for rows.Next() {
			var id, format, reason string
			if err := rows.Scan(&id, &format, &reason); err != nil {
				rows.Close()
				return fmt.Errorf("list refused formats: %w", err)
			}
			builds[index[id]].Refuse(format, reason)
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return fmt.Errorf("list refused formats: %w", err)
		}
	}
	return nil
}

// Uploads returns the uploads that match f.
func (s *SQLite) Uploads(ctx context.Context, f UploadFilter) ([]Upload, error) {
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
		u.format, u.attempts, u.last_error, u.next_attempt, u.version, u.username, u.python_path, u.shell_type
		FROM uploads u JOIN builds b ON b.id = u.build_id`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY b.created DESC, b.rowid DESC, u.provider, u.id DESC"
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
			&u.Format, &u.Attempts, &u.LastError, &next, &u.Version, &u.Username, &u.PythonPath, &u.ShellType); err != nil {
			return nil, fmt.Errorf("list uploads: %w", err)
		}
		u.State, u.StateTime, u.NextAttempt = State(st), fromUnixNano(stateTime), fromUnixNano(next)
		if s.refuse("upload "+u.String(), u.Version, CheckUpload(u)) != nil {
			continue
		}
		out = append(out, u)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list uploads: %w", err)
	}
	return out, nil
}

// refuse logs a record refused on read, once for each version of it, and
// returns an error naming it; nil when err is nil.
func (s *SQLite) refuse(record string, version int64, err error) error {
	if err == nil {
		return nil
	}
	s.refusedMu.Lock()
	logged := s.refused[record] == version
	s.refused[record] = version
	s.refusedMu.Unlock()
	if !logged {
		s.log.Warn("refusing a record of the state database: it is not acted on, and left as it is", "record", record, "error", err)
	}
	return fmt.Errorf("%s in the state database is refused: %w", record, err)
}

// Cursor returns an image's poll cursor; a zero Cursor when it has none.
func (s *SQLite) Cursor(ctx context.Context, image string) (Cursor, error) {
	c := Cursor{Image: image}
	var t, end int64
	err := s.db.QueryRowContext(ctx, `SELECT zuul_id, zuul_uuid, outcome, reason, time, zuul_end_time, behind_id, build_id, waiting
		FROM poll_cursors WHERE image = ?`, image).
		Scan(&c.ZuulID, &c.ZuulUUID, &c.Outcome, &c.Reason, &t, &end, &c.BehindID, &c.Build, &c.Waiting)
	if errors.Is(err, sql.ErrNoRows) {
		return c, nil
	}
	if err != nil {
		return c, fmt.Errorf("read poll cursor of %s: %w", image, err)
	}
	c.Time, c.ZuulEndTime = fromUnixNano(t), fromUnixNano(end)
	return c, RefuseCursor(c)
}

// Cursors returns every image's poll cursor, by image.
func (s *SQLite) Cursors(ctx context.Context) ([]Cursor, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT image, zuul_id, zuul_uuid, outcome, reason, time, zuul_end_time, behind_id, build_id, waiting
		FROM poll_cursors ORDER BY image`)
	if err != nil {
		return nil, fmt.Errorf("list poll cursors: %w", err)
	}
	defer rows.Close()
	var out []Cursor
	for rows.Next() {
		var c Cursor
		var t, end int64
		if err := rows.Scan(&c.Image, &c.ZuulID, &c.ZuulUUID, &c.Outcome, &c.Reason, &t, &end, &c.BehindID, &c.Build, &c.Waiting); err != nil {
			return nil, fmt.Errorf("list poll cursors: %w", err)
		}
		c.Time, c.ZuulEndTime = fromUnixNano(t), fromUnixNano(end)
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list poll cursors: %w", err)
	}
	return out, nil
}

// MarkMoved records that the state was copied to another store, named by to:
// from then on it is stale, and builders refuse to open it.
func (s *SQLite) MarkMoved(ctx context.Context, to string) error {
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		for k, v := range map[string]string{metaMovedTo: to, metaMovedAt: s.now().UTC().Format(time.RFC3339)} {
			if _, err := tx.ExecContext(ctx, `INSERT INTO meta (key, value) VALUES (?, ?)
				ON CONFLICT (key) DO UPDATE SET value = excluded.value`, k, v); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("mark the state moved: %w", err)
	}
	return nil
}

// Moved returns where MarkMoved said the state went, and when; "" when it
// was not moved.
func (s *SQLite) Moved(ctx context.Context) (to string, at time.Time, err error) {
	rows, err := s.db.QueryContext(ctx, `SELECT key, value FROM meta WHERE key IN (?, ?)`, metaMovedTo, metaMovedAt)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("read whether the state was moved: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return "", time.Time{}, fmt.Errorf("read whether the state was moved: %w", err)
		}
		if k == metaMovedTo {
			to = v
		} else {
			at, _ = time.Parse(time.RFC3339, v)
		}
	}
	if err := rows.Err(); err != nil {
		return "", time.Time{}, fmt.Errorf("read whether the state was moved: %w", err)
	}
	return to, at, nil
}

// Keys of the meta table that mark a state moved.
const (
	metaMovedTo = "moved_to"
	metaMovedAt = "moved_at"
)

// RequestBuild records a manual build request for an image.
func (s *SQLite) RequestBuild(ctx context.Context, image string) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO build_requests (image, requested) VALUES (?, ?) ON CONFLICT DO NOTHING`,
		image, unixNano(s.now()))
	if err != nil {
		return fmt.Errorf("record build request for %s: %w", image, err)
	}
	return nil
}

// BuildRequests returns the pending manual build requests, by image.
func (s *SQLite) BuildRequests(ctx context.Context) (map[string]time.Time, error) {
	return s.imageTimes(ctx, `SELECT image, requested FROM build_requests`)
}

// ClearBuildRequest removes an image's build request made at or before asOf.
func (s *SQLite) ClearBuildRequest(ctx context.Context, image string, asOf time.Time) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM build_requests WHERE image = ? AND requested <= ?`, image, unixNano(asOf)); err != nil {
		return fmt.Errorf("clear build request for %s: %w", image, err)
	}
	return nil
}

// SetPaused pauses or unpauses an image at run time.
func (s *SQLite) SetPaused(ctx context.Context, image string, paused bool) error {
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
func (s *SQLite) Paused(ctx context.Context) (map[string]time.Time, error) {
	return s.imageTimes(ctx, `SELECT image, paused FROM paused_images`)
}

// ImageNames lists the images with builds, a build request or a pause.
func (s *SQLite) ImageNames(ctx context.Context) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT image FROM builds UNION SELECT image FROM build_requests
		UNION SELECT image FROM paused_images ORDER BY image`)
	if err != nil {
		return nil, fmt.Errorf("list images: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var image string
		if err := rows.Scan(&image); err != nil {
			return nil, fmt.Errorf("list images: %w", err)
		}
		out = append(out, image)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list images: %w", err)
	}
	return out, nil
}

func (s *SQLite) imageTimes(ctx context.Context, q string) (map[string]time.Time, error) {
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

// LeakMark records the first time a cloud image looked leaked and returns it.
func (s *SQLite) LeakMark(ctx context.Context, provider, externalID string) (time.Time, error) {
	if _, err := s.db.ExecContext(ctx, `INSERT INTO leak_marks (provider, external_id, first_seen) VALUES (?, ?, ?)
		ON CONFLICT DO NOTHING`, provider, externalID, unixNano(s.now())); err != nil {
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
func (s *SQLite) ClearLeakMarks(ctx context.Context, provider string, keep map[string]bool) error {
	return s.inTx(ctx, func(tx *sql.Tx) error {
		rows, err := tx.QueryContext(ctx, `SELECT external_id FROM leak_marks WHERE provider = ?`, provider)
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
			if _, err := tx.ExecContext(ctx, `DELETE FROM leak_marks WHERE provider = ? AND external_id = ?`, provider, id); err != nil {
				return fmt.Errorf("clear leak mark %s in %s: %w", id, provider, err)
			}
		}
		return nil
	})
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

// createPrivate makes the database file with perm.File before SQLite opens
// it: SQLite would make it readable by everyone, and gives its -wal and -shm
// files the database file's mode. A file an older builder made is tightened.
func createPrivate(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, perm.File)
	if err == nil {
		return f.Close()
	}
	if !errors.Is(err, os.ErrExist) {
		return err
	}
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		if err := perm.Tighten(p); err != nil {
			return err
		}
	}
	return nil
}
