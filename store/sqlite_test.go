package store_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/store/storetest"
)

func TestSQLiteConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, now func() time.Time) (*store.Store, storetest.Raw) {
		return storetest.Open(t, store.Options{ImagesDir: t.TempDir(), Now: now})
	}, storetest.Options{})
}

// TestSQLiteMigratesOlderSchemas opens a database made by the first schema, with
// a build and an upload in it, and finds them readable and writable by version.
func TestSQLiteMigratesOlderSchemas(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "builder.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	first := `
CREATE TABLE schema_version (version INTEGER NOT NULL);
INSERT INTO schema_version VALUES (1);
CREATE TABLE builds (id TEXT PRIMARY KEY, image TEXT NOT NULL, source TEXT NOT NULL, state TEXT NOT NULL,
	state_time INTEGER NOT NULL, created INTEGER NOT NULL, builder_id TEXT NOT NULL, pid INTEGER NOT NULL DEFAULT 0,
	reason TEXT NOT NULL DEFAULT '', zuul_uuid TEXT NOT NULL DEFAULT '', zuul_id INTEGER NOT NULL DEFAULT 0,
	zuul_end_time INTEGER NOT NULL DEFAULT 0, zuul_log_url TEXT NOT NULL DEFAULT '');
CREATE TABLE build_files (build_id TEXT NOT NULL, format TEXT NOT NULL, sha256 TEXT NOT NULL DEFAULT '',
	md5 TEXT NOT NULL DEFAULT '', size INTEGER NOT NULL DEFAULT 0, url TEXT NOT NULL DEFAULT '',
	present INTEGER NOT NULL DEFAULT 1, PRIMARY KEY (build_id, format));
CREATE TABLE uploads (build_id TEXT NOT NULL, provider TEXT NOT NULL, id TEXT NOT NULL, state TEXT NOT NULL,
	state_time INTEGER NOT NULL, external_id TEXT NOT NULL DEFAULT '', external_name TEXT NOT NULL DEFAULT '',
	format TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, last_error TEXT NOT NULL DEFAULT '',
	next_attempt INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (build_id, provider, id));
CREATE TABLE poll_cursors (image TEXT PRIMARY KEY, zuul_id INTEGER NOT NULL, zuul_uuid TEXT NOT NULL,
	outcome TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '', time INTEGER NOT NULL);
CREATE TABLE leak_marks (provider TEXT NOT NULL, external_id TEXT NOT NULL, first_seen INTEGER NOT NULL,
	PRIMARY KEY (provider, external_id));
INSERT INTO builds (id, image, source, state, state_time, created, builder_id)
	VALUES ('0123456789abcdef0123456789abcdef', 'debian', 'zuul', 'ready', 1, 1, 'b');
INSERT INTO uploads (build_id, provider, id, state, state_time, format) VALUES
	('0123456789abcdef0123456789abcdef', 'cloud-a', '0000000001', 'ready', 1, 'qcow2');
`
	if _, err := db.Exec(first); err != nil {
		t.Fatal(err)
	}
	db.Close()

	// A listing or an admin command neither reads nor upgrades the old
	// schema (an older builder may be running on it), and says what to do.
	for _, access := range []store.Access{store.ReadOnly, store.Existing} {
		_, err = store.Open(ctx, store.Options{ImagesDir: dir, Access: access})
		if err == nil || !strings.Contains(err.Error(), "run the builder") {
			t.Fatalf("open of an old schema with access %d: %v, want advice to run the builder", access, err)
		}
	}
	if v := store.SchemaVersionOf(t, path); v != 1 {
		t.Fatalf("schema version %d after a listing and an admin command, want 1 still", v)
	}
	s, raw := storetest.Open(t, store.Options{ImagesDir: dir})
	defer s.Close()
	if err := s.RequestBuild(ctx, "x"); err != nil {
		t.Fatalf("second migration not applied: %v", err)
	}
	b, err := s.Build(ctx, "0123456789abcdef0123456789abcdef")
	if err != nil || b.Version == 0 {
		t.Fatalf("old build = %+v, %v", b, err)
	}
	u, err := s.CreateUpload(ctx, &b, "cloud-a", "qcow2")
	if err != nil || u.ID != "0000000002" {
		t.Fatalf("upload after the migration = %+v, %v; want id 0000000002", u, err)
	}
	u.SetState(store.Ready, s.Now())
	if err := raw.Write(ctx, store.PutUpload(&u)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ReleaseBuild(ctx, b.ID, "x"); err != nil {
		t.Fatalf("release of an old build: %v", err)
	}
}

// TestOpenWithoutCreate: listings and admin commands open existing state only.
func TestOpenWithoutCreate(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	missing := filepath.Join(root, "typo")
	for _, access := range []store.Access{store.ReadOnly, store.Existing} {
		_, err := store.Open(ctx, store.Options{ImagesDir: missing, Access: access})
		if !errors.Is(err, store.ErrNotInitialized) || !strings.Contains(err.Error(), missing) {
			t.Fatalf("access %d, missing images-dir: %v, want ErrNotInitialized naming the path", access, err)
		}
		if _, err := os.Stat(missing); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("access %d created the images-dir", access)
		}
		// A directory without state is refused too, and stays empty.
		_, err = store.Open(ctx, store.Options{ImagesDir: root, Access: access})
		if !errors.Is(err, store.ErrNotInitialized) || !strings.Contains(err.Error(), "builder.db") {
			t.Fatalf("access %d, no state: %v, want ErrNotInitialized naming builder.db", access, err)
		}
		if ents, _ := os.ReadDir(root); len(ents) != 0 {
			t.Fatalf("access %d left %d entries in an images-dir without state", access, len(ents))
		}
	}

	dir := filepath.Join(root, "images")
	s, err := store.Open(ctx, store.Options{ImagesDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.CreateBuild(ctx, store.Build{Image: "debian", Source: store.SourceDIB})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()

	ro, err := store.Open(ctx, store.Options{ImagesDir: dir, Access: store.ReadOnly})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if ro.BuilderID() != s.BuilderID() {
		t.Fatalf("read-only builder id %q, want %q", ro.BuilderID(), s.BuilderID())
	}
	if got, err := ro.Build(ctx, b.ID); err != nil || got.Image != "debian" {
		t.Fatalf("read-only read = %+v, %v", got, err)
	}
	if err := ro.RequestBuild(ctx, "debian"); err == nil {
		t.Fatal("a read-only store wrote")
	}
}

// TestBuilderIDOfTheState: the state records its builder id; a state of another
// builder stops the builder with both ids named, and a lost builder_id.txt is
// written back from the state.
func TestBuilderIDOfTheState(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	open := func(dir string) (*store.Store, error) {
		return store.Open(ctx, store.Options{ImagesDir: dir})
	}
	a, err := open(filepath.Join(root, "a"))
	if err != nil {
		t.Fatal(err)
	}
	idA := a.BuilderID()
	a.Close()
	b, err := open(filepath.Join(root, "b"))
	if err != nil {
		t.Fatal(err)
	}
	idB := b.BuilderID()
	b.Close()

	// b's state database put into a's images-dir.
	data, err := os.ReadFile(filepath.Join(root, "b", "builder.db"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "a", "builder.db"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = open(filepath.Join(root, "a"))
	if !errors.Is(err, store.ErrOtherBuilder) || !strings.Contains(err.Error(), idA) || !strings.Contains(err.Error(), idB) {
		t.Fatalf("open with another builder's state: %v; want ErrOtherBuilder naming %s and %s", err, idA, idB)
	}
	if got, _ := os.ReadFile(filepath.Join(root, "a", "builder_id.txt")); strings.TrimSpace(string(got)) != idA {
		t.Fatalf("a refused open changed builder_id.txt to %q", got)
	}

	// b's builder_id.txt lost: the state's id comes back.
	if err := os.Remove(filepath.Join(root, "b", "builder_id.txt")); err != nil {
		t.Fatal(err)
	}
	b, err = open(filepath.Join(root, "b"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	got, _ := os.ReadFile(filepath.Join(root, "b", "builder_id.txt"))
	if b.BuilderID() != idB || strings.TrimSpace(string(got)) != idB {
		t.Fatalf("after losing builder_id.txt: store id %s, file %q; want %s", b.BuilderID(), got, idB)
	}
}
