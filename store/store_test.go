package store

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

func openTest(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := Open(context.Background(), Options{ImagesDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestBuilderIDPersists(t *testing.T) {
	dir := t.TempDir()
	a := openTest(t, dir)
	if !regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`).MatchString(a.BuilderID()) {
		t.Fatalf("builder id %q is not a uuid4", a.BuilderID())
	}
	b := openTest(t, dir)
	if a.BuilderID() != b.BuilderID() {
		t.Fatalf("builder id changed across opens: %s then %s", a.BuilderID(), b.BuilderID())
	}
	data, _ := os.ReadFile(filepath.Join(dir, "builder_id.txt"))
	if strings.TrimSpace(string(data)) != a.BuilderID() {
		t.Fatalf("builder_id.txt holds %q, want %q", data, a.BuilderID())
	}
}

func TestBuildsNewestFirstWithFiles(t *testing.T) {
	ctx := context.Background()
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s, err := Open(ctx, Options{ImagesDir: t.TempDir(), Now: func() time.Time { clock = clock.Add(time.Second); return clock }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var ids []string
	for i := 0; i < 3; i++ {
		b, err := s.CreateBuild(ctx, Build{Image: "debian", Source: SourceZuul, Zuul: ZuulRef{UUID: "u", ID: int64(i)}})
		if err != nil {
			t.Fatal(err)
		}
		if len(b.ID) != 32 {
			t.Fatalf("build id %q is not a 32-digit hex uuid", b.ID)
		}
		ids = append(ids, b.ID)
	}
	if _, err := s.CreateBuild(ctx, Build{Image: "other", Source: SourceDIB}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddFile(ctx, ids[1], File{Format: "raw", SHA256: "aa", MD5: "bb", Size: 10}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddFile(ctx, ids[1], File{Format: "qcow2", SHA256: "cc", Size: 5}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetBuildState(ctx, ids[1], Ready, ""); err != nil {
		t.Fatal(err)
	}
	got, err := s.Builds(ctx, BuildFilter{Image: "debian"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0].ID != ids[2] || got[2].ID != ids[0] {
		t.Fatalf("builds not newest first: %+v", got)
	}
	ready, err := s.Builds(ctx, BuildFilter{Image: "debian", State: Ready})
	if err != nil {
		t.Fatal(err)
	}
	if len(ready) != 1 || ready[0].ID != ids[1] {
		t.Fatalf("ready builds = %+v", ready)
	}
	if f := ready[0].Formats(); len(f) != 2 || f[0] != "qcow2" || f[1] != "raw" {
		t.Fatalf("formats = %v", f)
	}
	if err := s.MarkFileRemoved(ctx, ids[1], "raw"); err != nil {
		t.Fatal(err)
	}
	b, err := s.Build(ctx, ids[1])
	if err != nil {
		t.Fatal(err)
	}
	if f := b.Formats(); len(f) != 1 || f[0] != "qcow2" {
		t.Fatalf("formats after removal = %v", f)
	}
	if _, err := s.Build(ctx, "nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing build: %v", err)
	}
	if err := s.SetBuildState(ctx, "nope", Failed, "x"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("state of missing build: %v", err)
	}
}

func TestUploadIDsAndStates(t *testing.T) {
	ctx := context.Background()
	s := openTest(t, t.TempDir())
	b, err := s.CreateBuild(ctx, Build{Image: "debian", Source: SourceZuul})
	if err != nil {
		t.Fatal(err)
	}
	u1, err := s.CreateUpload(ctx, b.ID, "cloud-a", "qcow2")
	if err != nil {
		t.Fatal(err)
	}
	u2, err := s.CreateUpload(ctx, b.ID, "cloud-a", "qcow2")
	if err != nil {
		t.Fatal(err)
	}
	u3, err := s.CreateUpload(ctx, b.ID, "cloud-b", "raw")
	if err != nil {
		t.Fatal(err)
	}
	if u1.ID != "0000000001" || u2.ID != "0000000002" || u3.ID != "0000000001" {
		t.Fatalf("upload ids = %s %s %s", u1.ID, u2.ID, u3.ID)
	}
	if u1.Image != "debian" {
		t.Fatalf("upload image = %q", u1.Image)
	}
	u1.State, u1.ExternalID, u1.Attempts, u1.LastError = Ready, "ext-1", 2, "boom"
	if err := s.UpdateUpload(ctx, u1); err != nil {
		t.Fatal(err)
	}
	got, err := s.Uploads(ctx, UploadFilter{Provider: "cloud-a", State: Ready})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].ExternalID != "ext-1" || got[0].Attempts != 2 || got[0].LastError != "boom" {
		t.Fatalf("ready uploads = %+v", got)
	}
	if err := s.DeleteBuild(ctx, b.ID); err == nil {
		t.Fatal("deleting a build that still has uploads succeeded")
	}
	for _, u := range []Upload{u1, u2, u3} {
		if err := s.DeleteUpload(ctx, u); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.DeleteBuild(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
}

func TestCursor(t *testing.T) {
	ctx := context.Background()
	s := openTest(t, t.TempDir())
	c, err := s.Cursor(ctx, "debian")
	if err != nil || c.ZuulID != 0 {
		t.Fatalf("empty cursor = %+v, %v", c, err)
	}
	if err := s.SetCursor(ctx, Cursor{Image: "debian", ZuulID: 7, ZuulUUID: "abc", Outcome: "failed", Reason: "checksum"}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetCursor(ctx, Cursor{Image: "debian", ZuulID: 9, ZuulUUID: "def", Outcome: "ready"}); err != nil {
		t.Fatal(err)
	}
	c, err = s.Cursor(ctx, "debian")
	if err != nil || c.ZuulID != 9 || c.ZuulUUID != "def" || c.Outcome != "ready" || c.Reason != "" {
		t.Fatalf("cursor = %+v, %v", c, err)
	}
}

func TestLockExcludesSecondHolder(t *testing.T) {
	dir := t.TempDir()
	l, err := LockDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	_, err = LockDir(dir)
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("second lock: %v, want ErrLocked", err)
	}
	if !strings.Contains(err.Error(), "pid") || !strings.Contains(err.Error(), "builder.lock") {
		t.Fatalf("lock error does not name the holder and file: %v", err)
	}
	if err := l.Unlock(); err != nil {
		t.Fatal(err)
	}
	l2, err := LockDir(dir)
	if err != nil {
		t.Fatalf("lock after unlock: %v", err)
	}
	l2.Unlock()
}

func TestTwoOpenersShareState(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a := openTest(t, dir)
	b := openTest(t, dir)
	built, err := a.CreateBuild(ctx, Build{Image: "x", Source: SourceDIB})
	if err != nil {
		t.Fatal(err)
	}
	got, err := b.Build(ctx, built.ID)
	if err != nil || got.Image != "x" || got.State != Building {
		t.Fatalf("second opener sees %+v, %v", got, err)
	}
}

func TestFilesAndSidecars(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir)
	p := s.FilePath("fedora", "abc", "qcow2")
	if p != filepath.Join(dir, "fedora-abc.qcow2") {
		t.Fatalf("path = %s", p)
	}
	os.WriteFile(p, []byte("data"), 0o644)
	if err := WriteSidecars(p, "5ha", "md"); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(p + ".sha256")
	if string(data) != "5ha  fedora-abc.qcow2\n" {
		t.Fatalf("sidecar = %q", data)
	}
	if got, err := ReadSidecar(p + ".md5"); err != nil || got != "md" {
		t.Fatalf("read sidecar = %q, %v", got, err)
	}
	// Another image whose name extends this one must survive.
	other := s.FilePath("fedora-40", "abc", "qcow2")
	os.WriteFile(other, []byte("x"), 0o644)
	os.MkdirAll(s.BuildPath("fedora", "abc")+".d", 0o755)
	if err := s.RemoveBuildFiles("fedora", "abc"); err != nil {
		t.Fatal(err)
	}
	for _, gone := range []string{p, p + ".sha256", p + ".md5", s.BuildPath("fedora", "abc") + ".d"} {
		if _, err := os.Stat(gone); !os.IsNotExist(err) {
			t.Errorf("%s still exists", gone)
		}
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("removing fedora's build removed fedora-40's file: %v", err)
	}
}

func TestRemovePartials(t *testing.T) {
	s := openTest(t, t.TempDir())
	names := []string{
		PartialKey("fedora", "aa11", "raw") + ".download",
		PartialKey("fedora", "bb22", "qcow2"),
		PartialKey("fedora-40", "cc33", "raw") + ".download",
		"fedora-zuul-notes.txt",
	}
	for _, n := range names {
		os.WriteFile(filepath.Join(s.PartialDir(), n), []byte("x"), 0o644)
	}
	if err := s.RemovePartials("fedora", "bb22"); err != nil {
		t.Fatal(err)
	}
	exists := func(n string) bool { _, err := os.Stat(filepath.Join(s.PartialDir(), n)); return err == nil }
	if exists(names[0]) {
		t.Error("partial of another Zuul build of the image kept")
	}
	if !exists(names[1]) {
		t.Error("partial of the kept Zuul build removed")
	}
	if !exists(names[2]) {
		t.Error("partial of image fedora-40 removed when pruning fedora")
	}
	if !exists(names[3]) {
		t.Error("a file that is no partial download was removed")
	}
}

func TestBuildRequestsAndPauses(t *testing.T) {
	ctx := context.Background()
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s, err := Open(ctx, Options{ImagesDir: t.TempDir(), Now: func() time.Time { return clock }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.RequestBuild(ctx, "fedora"); err != nil {
		t.Fatal(err)
	}
	start := clock
	clock = clock.Add(time.Minute)
	s.RequestBuild(ctx, "fedora") // a repeat keeps the first time
	reqs, err := s.BuildRequests(ctx)
	if err != nil || !reqs["fedora"].Equal(start) || len(reqs) != 1 {
		t.Fatalf("requests = %v, %v", reqs, err)
	}
	if err := s.ClearBuildRequest(ctx, "fedora", start.Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	if reqs, _ := s.BuildRequests(ctx); len(reqs) != 1 {
		t.Fatal("a request newer than the build was cleared")
	}
	s.ClearBuildRequest(ctx, "fedora", start)
	if reqs, _ := s.BuildRequests(ctx); len(reqs) != 0 {
		t.Fatal("request not cleared")
	}
	for i := 0; i < 2; i++ {
		if err := s.SetPaused(ctx, "fedora", true); err != nil {
			t.Fatal(err)
		}
	}
	if p, _ := s.Paused(ctx); len(p) != 1 {
		t.Fatalf("paused = %v", p)
	}
	for i := 0; i < 2; i++ {
		if err := s.SetPaused(ctx, "fedora", false); err != nil {
			t.Fatal(err)
		}
	}
	if p, _ := s.Paused(ctx); len(p) != 0 {
		t.Fatalf("paused after unpause = %v", p)
	}
}

func TestMigratesFromFirstSchema(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := openTest(t, dir)
	// Pretend the database was made by a version that knew only the first schema.
	s.db.ExecContext(ctx, `DROP TABLE build_requests`)
	s.db.ExecContext(ctx, `DROP TABLE paused_images`)
	s.db.ExecContext(ctx, `UPDATE schema_version SET version = 1`)
	s.Close()
	s2 := openTest(t, dir)
	if err := s2.RequestBuild(ctx, "x"); err != nil {
		t.Fatalf("second migration not applied: %v", err)
	}
}

func TestParseBuildName(t *testing.T) {
	for _, c := range []struct {
		name, image, id string
		ok              bool
	}{
		{"fedora-40-0123abcd", "fedora-40", "0123abcd", true},
		{"debian-x", "debian", "x", true},
		{"nodash", "", "", false},
		{"-x", "", "", false},
		{"debian-", "", "", false},
	} {
		image, id, ok := ParseBuildName(c.name)
		if image != c.image || id != c.id || ok != c.ok {
			t.Errorf("ParseBuildName(%q) = %q %q %v", c.name, image, id, ok)
		}
	}
}
