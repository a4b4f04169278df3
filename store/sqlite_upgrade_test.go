package store

import (
	"bytes"
	"context"
	"database/sql"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// oldStateRows are a build, its file and its upload, in the columns every
// schema version has.
var oldStateRows = []string{
	`INSERT INTO builds (id, image, source, state, state_time, created, builder_id)
		VALUES ('0123456789abcdef0123456789abcdef', 'debian', 'zuul', 'ready', 1, 1, 'b')`,
	`INSERT INTO build_files (build_id, format, sha256) VALUES ('0123456789abcdef0123456789abcdef', 'qcow2', 'ab')`,
	`INSERT INTO uploads (build_id, provider, id, state, state_time, format)
		VALUES ('0123456789abcdef0123456789abcdef', 'cloud-a', '0000000001', 'ready', 1, 'qcow2')`,
}

// oldState writes a state database at path as a builder of schema version v
// left it, holding what rows insert. It returns the connection that wrote it,
// in WAL mode without checkpoints: until it is closed, what it wrote is in
// the WAL alone.
func oldState(t *testing.T, path string, v int, rows ...string) *sql.DB {
	t.Helper()
	ctx := context.Background()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=foreign_keys(1)&_pragma=journal_mode(WAL)&_pragma=wal_autocheckpoint(0)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	for _, m := range migrations[:v] {
		if err := m(ctx, tx); err != nil {
			t.Fatal(err)
		}
	}
	for _, q := range append([]string{`CREATE TABLE schema_version (version INTEGER NOT NULL)`,
		`INSERT INTO schema_version VALUES (?)`}, rows...) {
		args := []any{}
		if strings.Contains(q, "?") {
			args = append(args, v)
		}
		if _, err := tx.ExecContext(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return db
}

// stateCopies lists the copies of schema versions beside the state at path.
func stateCopies(t *testing.T, path string) []string {
	t.Helper()
	copies, err := filepath.Glob(path + ".schema-*")
	if err != nil {
		t.Fatal(err)
	}
	return copies
}

// TestSQLiteUpgradeKeepsCopy: before the builder upgrades the schema of a
// state, it copies the state, WAL included, beside it under the old version's
// number, with the state's mode and owner, and says so; a copy of that version
// that exists is kept as it is. A new state, and one up to date, get no copy.
func TestSQLiteUpgradeKeepsCopy(t *testing.T) {
	tests := []struct {
		name    string
		version int    // of the state before the open; 0: no state, -1: this program's
		earlier string // a copy of the version already there
		log     string // in the log of the open
	}{
		{name: "new state"},
		{name: "up to date", version: -1},
		{name: "version 8", version: 8, log: "copied the state before upgrading its schema"},
		{name: "version 1", version: 1, log: "copied the state before upgrading its schema"},
		{name: "version 8 with a copy of 8", version: 8, earlier: "the copy made before an earlier upgrade",
			log: "kept the copy of the state made before an earlier upgrade of its schema"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			path := filepath.Join(dir, "builder.db")
			switch tt.version {
			case 0:
			case -1:
				s, err := openSQLite(ctx, path, Create, nil, nil)
				if err != nil {
					t.Fatal(err)
				}
				s.Close()
			default:
				// Left open: the records are in the WAL only when the builder starts.
				oldState(t, path, tt.version, oldStateRows...)
				if fi, err := os.Stat(path + "-wal"); err != nil || fi.Size() == 0 {
					t.Fatalf("no WAL beside the old state (%v): the test does not start where it says", err)
				}
				if err := os.Chmod(path, 0o660); err != nil {
					t.Fatal(err)
				}
				if os.Geteuid() == 0 {
					if err := os.Chown(path, 4242, 4343); err != nil {
						t.Fatal(err)
					}
				}
			}
			want := schemaCopyPath(path, tt.version)
			if tt.earlier != "" {
				if err := os.WriteFile(want, []byte(tt.earlier), 0o600); err != nil {
					t.Fatal(err)
				}
			}

			var log bytes.Buffer
			s, err := openSQLite(ctx, path, Create, nil, slog.New(slog.NewTextHandler(&log, nil)))
			if err != nil {
				t.Fatal(err)
			}
			s.Close()
			if v := SchemaVersionOf(t, path); v != len(migrations) {
				t.Fatalf("schema version %d after the open, want %d", v, len(migrations))
			}
			copies := stateCopies(t, path)
			if tt.version <= 0 {
				if len(copies) != 0 || log.Len() != 0 {
					t.Fatalf("copies %v and log %q of a state that needed no upgrade, want none", copies, log.String())
				}
				return
			}
			if !slices.Equal(copies, []string{want}) {
				t.Fatalf("copies %v, want %s", copies, want)
			}
			for _, s := range []string{tt.log, "copy=" + want, "from_version=" + strconv.Itoa(tt.version), "to_version=" + strconv.Itoa(len(migrations))} {
				if !strings.Contains(log.String(), s) {
					t.Errorf("log %q does not say %q", log.String(), s)
				}
			}
			if tt.earlier != "" {
				if data, err := os.ReadFile(want); err != nil || string(data) != tt.earlier {
					t.Fatalf("the earlier copy holds %q (%v) after the upgrade, want it kept as it was", data, err)
				}
				return
			}
			checkCopy(t, path, want, tt.version)
			before, err := os.ReadFile(want)
			if err != nil {
				t.Fatal(err)
			}

			// The next start has nothing to upgrade, and leaves the copy alone.
			log.Reset()
			s, err = openSQLite(ctx, path, Create, nil, slog.New(slog.NewTextHandler(&log, nil)))
			if err != nil {
				t.Fatal(err)
			}
			s.Close()
			after, err := os.ReadFile(want)
			if copies := stateCopies(t, path); !slices.Equal(copies, []string{want}) || err != nil || !bytes.Equal(before, after) || log.Len() != 0 {
				t.Fatalf("second start: copies %v, the copy changed: %v (%v), log %q; want the one copy as it was, nothing logged",
					copies, !bytes.Equal(before, after), err, log.String())
			}
		})
	}
}

// checkCopy checks that the copy of the state at path holds the state of
// schema version v with oldStateRows, whole, and has the state's mode and owner.
func checkCopy(t *testing.T, path, copyPath string, v int) {
	t.Helper()
	if got := SchemaVersionOf(t, copyPath); got != v {
		t.Errorf("the copy has schema version %d, want %d", got, v)
	}
	db, err := sql.Open("sqlite", "file:"+copyPath+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var check string
	if err := db.QueryRow("PRAGMA integrity_check").Scan(&check); err != nil || check != "ok" {
		t.Errorf("integrity_check of the copy: %q, %v", check, err)
	}
	for _, q := range []string{
		`SELECT id FROM builds`,
		`SELECT build_id || ' ' || format || ' ' || sha256 FROM build_files`,
		`SELECT build_id || ' ' || provider || ' ' || id || ' ' || state FROM uploads`,
	} {
		var got []string
		rows, err := db.Query(q)
		if err != nil {
			t.Fatalf("%s in the copy: %v", q, err)
		}
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			got = append(got, s)
		}
		rows.Close()
		if len(got) != 1 || !strings.HasPrefix(got[0], "0123456789abcdef0123456789abcdef") {
			t.Errorf("%s in the copy: %q, want the one record of the old state", q, got)
		}
	}
	var table string
	if err := db.QueryRow(`SELECT sql FROM sqlite_schema WHERE name = 'builds'`).Scan(&table); err != nil || !strings.Contains(table, sourceCheck) {
		t.Errorf("the copy's builds table is %q (%v), want the old schema's, with %q", table, err, sourceCheck)
	}
	state, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	cp, err := os.Stat(copyPath)
	if err != nil {
		t.Fatal(err)
	}
	if cp.Mode() != state.Mode() {
		t.Errorf("the copy's mode is %v, the state's %v", cp.Mode(), state.Mode())
	}
	st, ct := state.Sys().(*syscall.Stat_t), cp.Sys().(*syscall.Stat_t)
	if st.Uid != ct.Uid || st.Gid != ct.Gid {
		t.Errorf("the copy is owned by %d:%d, the state by %d:%d", ct.Uid, ct.Gid, st.Uid, st.Gid)
	}
}

// TestSQLiteUpgradeWithoutCopyFails: when the copy cannot be written (here a
// file size limit makes the write fail as a full disk does), the schema is not
// upgraded, nothing is left of the copy, and the error says what happened and
// what to do; once the copy can be written, the next start upgrades.
func TestSQLiteUpgradeWithoutCopyFails(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "builder.db")
	// A state larger than the limit; its records reach the file when the
	// connection that wrote them closes.
	big := `INSERT INTO builds (id, image, source, state, state_time, created, builder_id, reason)
		VALUES ('1123456789abcdef0123456789abcdef', 'debian', 'zuul', 'failed', 1, 1, 'b', hex(randomblob(262144)))`
	if err := oldState(t, path, 8, append(oldStateRows, big)...).Close(); err != nil {
		t.Fatal(err)
	}
	const limit = 128 << 10
	if fi, err := os.Stat(path); err != nil || fi.Size() < 2*limit {
		t.Fatalf("state of %d bytes (%v), want more than %d", fi.Size(), err, 2*limit)
	}

	// SIGXFSZ is ignored by Go programs: a write past the limit fails with EFBIG.
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_FSIZE, &old); err != nil {
		t.Fatal(err)
	}
	lowered := old
	lowered.Cur = limit
	if err := unix.Setrlimit(unix.RLIMIT_FSIZE, &lowered); err != nil {
		t.Fatal(err)
	}
	_, err := openSQLite(ctx, path, Create, nil, nil)
	if err := unix.Setrlimit(unix.RLIMIT_FSIZE, &old); err != nil {
		t.Fatal(err)
	}
	want := schemaCopyPath(path, 8)
	if err == nil {
		t.Fatal("the open upgraded the schema without a copy, want an error")
	}
	for _, s := range []string{path, want, "from version 8 to " + strconv.Itoa(len(migrations)), "schema was not upgraded", "start the builder again"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not say %q", err, s)
		}
	}
	if v := SchemaVersionOf(t, path); v != 8 {
		t.Fatalf("schema version %d after the failed copy, want 8", v)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if strings.Contains(e.Name(), ".schema-") {
			t.Errorf("%s left after the failed copy", e.Name())
		}
	}

	s, err := openSQLite(ctx, path, Create, nil, nil)
	if err != nil {
		t.Fatalf("open once the copy can be written: %v", err)
	}
	s.Close()
	if copies := stateCopies(t, path); !slices.Equal(copies, []string{want}) || SchemaVersionOf(t, path) != len(migrations) {
		t.Fatalf("copies %v, schema version %d after the second start; want %s and %d", copies, SchemaVersionOf(t, path),
			want, len(migrations))
	}
}

// SchemaVersionOf reads the schema version of the state database at path.
func SchemaVersionOf(t testing.TB, path string) int {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var v int
	if err := db.QueryRow(`SELECT version FROM schema_version`).Scan(&v); err != nil {
		t.Fatalf("read the schema version of %s: %v", path, err)
	}
	return v
}

// TestSQLiteNewerSchemaNamesCopy: a state that a newer builder upgraded is
// refused by this one, by the builder and the listings alike, with the copy it
// can go back to: the copy of its own version, else of the newest older one;
// never one that a newer builder made of a version this one does not know.
func TestSQLiteNewerSchemaNamesCopy(t *testing.T) {
	current := len(migrations)
	tests := []struct {
		name   string
		copies []int // versions of the copies beside the state
		want   int   // the version of the copy named; 0: none
	}{
		{name: "no copy"},
		{name: "a copy of this version", copies: []int{1, current}, want: current},
		{name: "a copy of an older version", copies: []int{1}, want: 1},
		{name: "a copy of a newer version only", copies: []int{current + 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			path := filepath.Join(t.TempDir(), "builder.db")
			s, err := openSQLite(ctx, path, Create, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.db.ExecContext(ctx, `UPDATE schema_version SET version = ?`, current+2); err != nil {
				t.Fatal(err)
			}
			s.Close()
			for _, v := range tt.copies {
				if err := os.WriteFile(schemaCopyPath(path, v), nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			for _, access := range []Access{Create, ReadOnly} {
				_, err := openSQLite(ctx, path, access, nil, nil)
				if err == nil {
					t.Fatalf("access %d: opened a state of a newer schema", access)
				}
				msg := err.Error()
				if !strings.Contains(msg, "schema version "+strconv.Itoa(current+2)+" is newer than this program knows") {
					t.Errorf("access %d: error %q does not say the schema is newer", access, msg)
				}
				named := strings.Contains(msg, ".schema-")
				if tt.want == 0 {
					if named {
						t.Errorf("access %d: error %q names a copy, want none", access, msg)
					}
					continue
				}
				if c := schemaCopyPath(path, tt.want); !strings.Contains(msg, "move "+c) || !strings.Contains(msg, "to "+path) {
					t.Errorf("access %d: error %q does not say to move %s to %s", access, msg, c, path)
				}
			}
		})
	}
}
