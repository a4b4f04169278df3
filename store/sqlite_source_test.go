package store

import (
	"context"
	"path/filepath"
	"testing"
	"time"
)

// TestSQLiteAnySource: a database made before any source's name was allowed
// (version 8, its builds table checking for dib and zuul), with a build, its
// file and an upload in it, is migrated: a build of another source is
// recorded, and the old build keeps its file and upload (the table was not
// dropped and made again, which would have cascaded to them).
func TestSQLiteAnySource(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "builder.db")
	db := oldState(t, path, 8, oldStateRows...)
	if _, err := db.ExecContext(ctx, `INSERT INTO builds (id, image, source, state, state_time, created, builder_id)
			VALUES ('1123456789abcdef0123456789abcdef', 'debian', 'dir', 'ready', 1, 1, 'b')`); err == nil {
		t.Fatal("the version 8 schema took a build of source dir: the test does not start where it says")
	}
	db.Close()

	s, err := openSQLite(ctx, path, Create, time.Now, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.Now().UTC()
	b := Build{ID: "2123456789abcdef0123456789abcdef", Image: "debian", Source: "dir", State: Building,
		StateTime: now, Created: now, BuilderID: "b"}
	if err := s.Write(ctx, PutBuild(&b)); err != nil {
		t.Fatalf("a build of source dir after the migration: %v", err)
	}
	if got, err := s.Build(ctx, b.ID); err != nil || got.Source != "dir" {
		t.Fatalf("build of source dir read back as %+v, %v", got, err)
	}
	old, err := s.Build(ctx, "0123456789abcdef0123456789abcdef")
	if f, ok := old.File("qcow2"); err != nil || !ok || f.SHA256 != "ab" {
		t.Fatalf("old build after the migration: %+v, %v; want its qcow2 file", old, err)
	}
	ups, err := s.Uploads(ctx, UploadFilter{BuildID: old.ID})
	if err != nil || len(ups) != 1 {
		t.Fatalf("old build's uploads after the migration: %+v, %v", ups, err)
	}
	var check string
	if err := s.db.QueryRowContext(ctx, "PRAGMA integrity_check").Scan(&check); err != nil || check != "ok" {
		t.Fatalf("integrity_check after the migration: %q, %v", check, err)
	}
}
