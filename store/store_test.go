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

// TestBuildsRecordTheHostname: a build records the host the store was opened
// with, or this host's name when it was given none.
func TestBuildsRecordTheHostname(t *testing.T) {
	ctx := context.Background()
	host, err := os.Hostname()
	if err != nil {
		t.Skipf("this host has no name: %v", err)
	}
	for _, tt := range []struct{ given, want string }{{"builder-7.example.org", "builder-7.example.org"}, {"", host}} {
		s, err := Open(ctx, Options{ImagesDir: t.TempDir(), Access: Create, Hostname: tt.given})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		b, err := s.CreateBuild(ctx, Build{Image: "debian", Source: SourceDIB})
		if err != nil {
			t.Fatal(err)
		}
		if got, err := s.Build(ctx, b.ID); err != nil || got.Hostname != tt.want {
			t.Errorf("hostname %q given: the build records %q, %v; want %q", tt.given, got.Hostname, err, tt.want)
		}
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
	p := mustPath(s.FilePath("fedora", "abc", "qcow2"))
	if p != filepath.Join(dir, "fedora-abc.qcow2") {
		t.Fatalf("path = %s", p)
	}
	os.WriteFile(p, []byte("data"), 0o644)
	if err := writeSidecars(p, "5ha", "md"); err != nil {
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
	other := mustPath(s.FilePath("fedora-40", "abc", "qcow2"))
	os.WriteFile(other, []byte("x"), 0o644)
	os.MkdirAll(mustPath(s.BuildPath("fedora", "abc"))+".d", 0o755)
	if err := s.removeBuildFiles("fedora", "abc"); err != nil {
		t.Fatal(err)
	}
	for _, gone := range []string{p, p + ".sha256", p + ".md5", mustPath(s.BuildPath("fedora", "abc")) + ".d"} {
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
		zuulPartialName("fedora", "aa11", "raw") + ".download",
		zuulPartialName("fedora", "bb22", "qcow2"),
		zuulPartialName("fedora-40", "cc33", "raw") + ".download",
		"fedora-zuul-notes.txt",
	}
	for _, n := range names {
		os.WriteFile(filepath.Join(s.partialDir(), n), []byte("x"), 0o644)
	}
	if err := s.RemovePartials("fedora", "bb22"); err != nil {
		t.Fatal(err)
	}
	exists := func(n string) bool { _, err := os.Stat(filepath.Join(s.partialDir(), n)); return err == nil }
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

func TestRemoveLeftovers(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := openTest(t, dir)
	known, err := s.CreateBuild(ctx, Build{Image: "debian", Source: SourceZuul, Zuul: ZuulRef{UUID: "aa11"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := setBuildState(ctx, s, &known, Ready, ""); err != nil {
		t.Fatal(err)
	}
	busy, err := s.CreateBuild(ctx, Build{Image: "debian", Source: SourceZuul})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.backend.Write(ctx, PutCursor(Cursor{Image: "debian", ZuulUUID: "bb22", Outcome: "failed"})); err != nil {
		t.Fatal(err)
	}
	unknown := NewBuildID()
	// Another builder's build, recorded in a shared state, with files here.
	theirs := Build{ID: NewBuildID(), Image: "centos", Source: SourceDIB, State: Failed, BuilderID: "python-builder"}
	if err := s.backend.Write(ctx, PutBuild(&theirs)); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	files := map[string]bool{ // name -> removed
		"debian-" + known.ID + ".qcow2":        false,
		"debian-" + known.ID + ".qcow2.sha256": false,
		// Files of builds this builder has no record of are not its own.
		"debian-" + unknown + ".raw":                                           false,
		"debian-" + unknown + ".raw.md5":                                       false,
		"debian-" + unknown + ".d":                                             false, // a directory
		"backup-" + unknown + ".tar":                                           false, // an operator's
		"notes-" + unknown + ".d":                                              false,
		"centos-" + theirs.ID + ".qcow2":                                       false,
		"." + "centos-" + theirs.ID + ".qcow2.md5.tmp7":                        false,
		"." + "debian-" + unknown + ".raw.converting-97":                       false,
		"." + "debian-" + known.ID + ".qcow2.sha256.tmp123":                    true,
		"." + "debian-" + known.ID + ".raw.converting-99":                      true,
		"." + "debian-" + busy.ID + ".raw.converting-98":                       false, // busy
		".builder_id.txt.tmp42":                                                true,
		".gearman-status.json.tmp5":                                            true,
		".notes.txt.tmp3":                                                      false,
		"notes.txt":                                                            false, // not ours
		"debian-notahexid.qcow2":                                               false,
		".partial/" + zuulPartialName("debian", "aa11", "raw"):                 true,  // fetched
		".partial/" + zuulPartialName("debian", "bb22", "raw") + ".download":   true,  // refused
		".partial/" + zuulPartialName("debian", "bb22", "raw") + ".ranges":     true,  // its ranges' state
		".partial/" + zuulPartialName("debian", "bb22", "raw") + ".ranges.tmp": true,  // that state half-saved
		".partial/" + zuulPartialName("debian", "cc33", "raw") + ".download":   false, // to resume
		".partial/" + zuulPartialName("debian", "cc33", "raw") + ".ranges":     false,
		".partial/" + zuulPartialName("debian", "cc33", "raw") + ".ranges.tmp": false,
		".partial/" + zuulPartialName("gone", "dd44", "raw"):                   true,  // image not configured
		".partial/" + zuulPartialName("fedora", "ee55", "raw"):                 false, // fedora is fetching
		".partial/notes.txt":                                                   false,
	}
	for name := range files {
		p := filepath.Join(dir, name)
		if strings.HasSuffix(name, ".d") {
			if err := os.MkdirAll(filepath.Join(p, "sub"), 0o755); err != nil {
				t.Fatal(err)
			}
		} else if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, old, old); err != nil {
			t.Fatal(err)
		}
	}
	fresh := filepath.Join(dir, "debian-"+NewBuildID()+".qcow2") // being written now
	os.WriteFile(fresh, []byte("x"), 0o644)
	// A partial download of a Zuul build that is ready goes however new it is:
	// another builder fetched it, and nothing here writes it any more.
	freshPartials := map[string]bool{
		".partial/" + zuulPartialName("debian", "aa11", "qcow2") + ".download": true,
		".partial/" + zuulPartialName("debian", "aa11", "qcow2") + ".ranges":   true,
		".partial/" + zuulPartialName("debian", "ff66", "qcow2") + ".download": false, // may be resumed
		".partial/" + zuulPartialName("fedora", "aa11", "qcow2") + ".download": false, // fedora is fetching
	}
	for name, gone := range freshPartials {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		files[name] = gone
	}

	removed, err := s.RemoveLeftovers(ctx, Leftovers{
		Before:     time.Now().Add(-5 * time.Minute),
		ZuulImages: map[string]bool{"debian": true, "fedora": true},
		Busy: func(image, id string) bool {
			return (image == "debian" && id == busy.ID) || (image == "fedora" && id == "")
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, p := range removed {
		rel, _ := filepath.Rel(dir, p)
		got[rel] = true
	}
	for name, want := range files {
		_, statErr := os.Stat(filepath.Join(dir, name))
		if want != got[name] || want != errors.Is(statErr, os.ErrNotExist) {
			t.Errorf("%s: removed %v (reported %v), want %v", name, errors.Is(statErr, os.ErrNotExist), got[name], want)
		}
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Errorf("a file being written was removed: %v", err)
	}
}

// TestRecordsStoredWithoutUserinfo: failure reasons and URLs of builds,
// uploads and poll cursors are stored, and read back, without the userinfo of
// any URL in them, whichever record holds them; the writer's record holds what
// was stored, and a copy of it that shares its files and refusals is left as it
// was. Records stored with userinfo (by an older builder) read without it.
func TestRecordsStoredWithoutUserinfo(t *testing.T) {
	const password = "pw-5d0e"
	ctx := context.Background()
	dir := t.TempDir()
	s := openTest(t, dir)
	withPW := func(what string) string {
		return what + " at https://ci:" + password + "@zuul.example.org/api/tenant/t/builds?job_name=j: refused"
	}
	clean := func(what string) string {
		return what + " at https://zuul.example.org/api/tenant/t/builds?job_name=j: refused"
	}
	files := []File{{Format: "qcow2", URL: "https://ci:" + password + "@logs.example.org/1/d.qcow2"}, {Format: "raw"}}
	b, err := s.CreateBuild(ctx, Build{Image: "debian", Source: SourceZuul,
		Zuul: ZuulRef{UUID: "u1", LogURL: "https://ci:" + password + "@logs.example.org/1/"}, Files: files})
	if err != nil {
		t.Fatal(err)
	}
	b.Refuse("vhd", withPW("vhd"))
	shared := b // shares Refused
	b.SetState(Failed, time.Now())
	b.Reason = withPW("fetch")
	if err := s.backend.Write(ctx, PutBuild(&b)); err != nil {
		t.Fatal(err)
	}
	up := Upload{BuildID: b.ID, Image: b.Image, Provider: "p", State: Failed, Format: "qcow2", LastError: withPW("upload")}
	if err := s.backend.Write(ctx, PutUpload(&up), PutCursor(Cursor{Image: "debian", ZuulID: 1, Outcome: "failed", Reason: withPW("poll")})); err != nil {
		t.Fatal(err)
	}

	got, err := s.Build(ctx, b.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Reason != clean("fetch") || got.Refused["vhd"] != clean("vhd") || got.Zuul.LogURL != "https://logs.example.org/1/" ||
		got.Files[0].URL != "https://logs.example.org/1/d.qcow2" {
		t.Errorf("stored build = %+v", got)
	}
	if b.Reason != got.Reason || b.Files[0].URL != got.Files[0].URL || b.Refused["vhd"] != got.Refused["vhd"] {
		t.Errorf("the writer's build holds what was not stored: %+v", b)
	}
	if !strings.Contains(files[0].URL, password) || !strings.Contains(shared.Refused["vhd"], password) {
		t.Errorf("the files or refusals of a copy of the build were changed: %+v, %+v", files, shared.Refused)
	}
	ups, err := s.Uploads(ctx, UploadFilter{BuildID: b.ID})
	if err != nil || len(ups) != 1 || ups[0].LastError != clean("upload") {
		t.Errorf("stored uploads = %+v, %v", ups, err)
	}
	if c, err := s.Cursor(ctx, "debian"); err != nil || c.Reason != clean("poll") {
		t.Errorf("stored cursor = %+v, %v", c, err)
	}
	s.Close()
	for _, f := range []string{"builder.db", "builder.db-wal"} {
		data, _ := os.ReadFile(filepath.Join(dir, f))
		if strings.Contains(string(data), password) {
			t.Errorf("%s holds the password", f)
		}
	}

	// Records an older builder stored with the userinfo in them read without it.
	s = openTest(t, dir)
	db := s.backend.(*SQLite).db
	for _, q := range []string{`UPDATE builds SET reason = ?`, `UPDATE uploads SET last_error = ?`, `UPDATE poll_cursors SET reason = ?`} {
		if _, err := db.ExecContext(ctx, q, withPW("old")); err != nil {
			t.Fatal(err)
		}
	}
	got, err = s.Build(ctx, b.ID)
	builds, berr := s.Builds(ctx, BuildFilter{})
	ups, uerr := s.Uploads(ctx, UploadFilter{})
	c, cerr := s.Cursor(ctx, "debian")
	if err != nil || berr != nil || uerr != nil || cerr != nil || got.Reason != clean("old") || len(builds) != 1 ||
		builds[0].Reason != clean("old") || len(ups) != 1 || ups[0].LastError != clean("old") || c.Reason != clean("old") {
		t.Errorf("records stored with userinfo read as %q, %+v, %+v, %q (%v, %v, %v, %v)", got.Reason, builds, ups, c.Reason, err, berr, uerr, cerr)
	}
}

// TestOpenKeepsOthersOut: a new images-dir and its state are for the builder's
// user and group; one an older builder left open to everyone is closed on open.
func TestOpenKeepsOthersOut(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "images")
	s := openTest(t, dir)
	if err := writeSidecars(filepath.Join(dir, "img-1.raw"), strings.Repeat("a", 64), strings.Repeat("b", 32)); err != nil {
		t.Fatal(err)
	}
	s.Close()
	check := func(when string) {
		t.Helper()
		err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			if fi.Mode().Perm()&0o007 != 0 {
				t.Errorf("%s: %s has mode %v", when, path, fi.Mode().Perm())
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	check("a new images-dir")
	for _, p := range []string{dir, filepath.Join(dir, "builder.db")} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, fi.Mode().Perm()|0o005); err != nil {
			t.Fatal(err)
		}
	}
	openTest(t, dir)
	check("an images-dir open to everyone, opened again")
}

// setBuildState moves a build, as read, to a state, as a step of the builder
// would: compare-and-set on its version.
func setBuildState(ctx context.Context, s *Store, b *Build, st State, reason string) error {
	next := *b
	next.SetState(st, s.now())
	next.Reason = reason
	if err := s.backend.Write(ctx, PutBuild(&next)); err != nil {
		return err
	}
	*b = next
	return nil
}
