package store_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/store"
)

func TestCheckBuild(t *testing.T) {
	good := func() store.Build {
		return store.Build{ID: "0123456789abcdef0123456789abcdef", Image: "debian-12", Source: store.SourceDIB, State: store.Ready,
			BuilderID: "5a1e-our builder", Files: []store.File{{Format: "qcow2"}, {Format: "raw"}}}
	}
	tests := []struct {
		name   string
		change func(*store.Build)
		says   string // "" when the build is good
	}{
		{"nodepool's build", func(*store.Build) {}, ""},
		{"older nodepool's sequence id", func(b *store.Build) { b.ID = "0000000001" }, ""},
		{"format out of the images-dir", func(b *store.Build) { b.Files[0].Format = "x/../../../tmp/victim" }, "is not a format"},
		{"format with a dot", func(b *store.Build) { b.Files[0].Format = "qcow2.sha256" }, "is not a format"},
		{"format twice", func(b *store.Build) { b.Files[1].Format = "qcow2" }, "listed twice"},
		{"refused format out of the dir", func(b *store.Build) { b.Refuse("../x", "bad") }, "refused format"},
		{"id with a tab", func(b *store.Build) { b.ID = "abc\tdef" }, "is not an id"},
		{"id with a newline", func(b *store.Build) { b.ID = "abc\ndef" }, "is not an id"},
		{"id with a dash", func(b *store.Build) { b.ID = "abc-def" }, "is not an id"},
		{"empty id", func(b *store.Build) { b.ID = "" }, "is not an id"},
		{"image with a slash", func(b *store.Build) { b.Image = "../etc" }, "image"},
		{"image dot-dot", func(b *store.Build) { b.Image = ".." }, "relative path"},
		{"image with a space", func(b *store.Build) { b.Image = "a b" }, "image"},
		{"unknown state", func(b *store.Build) { b.State = "uploading" }, `state "uploading" is not one of building, ready, deleting, failed`},
		{"python_path with a control character", func(b *store.Build) { b.PythonPath = "/usr/bin/python3\x1b[2J" }, "python_path"},
		{"source not a name", func(b *store.Build) { b.Source = "zuul\nfake" }, "source"},
		{"zuul uuid out of the dir", func(b *store.Build) { b.Zuul.UUID = "../x" }, "zuul uuid"},
		{"control character in builder", func(b *store.Build) { b.Hostname = "host\x1b[2J" }, "control character"},
		{"negative size", func(b *store.Build) { b.Files[0].Size = -1 }, "negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := good()
			tt.change(&b)
			err := store.CheckBuild(b)
			if tt.says == "" && err != nil || tt.says != "" && (err == nil || !strings.Contains(err.Error(), tt.says)) {
				t.Errorf("CheckBuild = %v; want an error saying %q (none if empty)", err, tt.says)
			}
		})
	}
}

func TestCheckUpload(t *testing.T) {
	good := func() store.Upload {
		return store.Upload{BuildID: "0123456789abcdef0123456789abcdef", Image: "debian", Provider: "cloud-a", ID: "0000000001",
			State: store.Deleting, ExternalID: "11111111-2222-4333-8444-555555555555", Format: "raw"}
	}
	tests := []struct {
		name   string
		change func(*store.Upload)
		says   string
	}{
		{"nodepool's upload", func(*store.Upload) {}, ""},
		{"another driver's external id", func(u *store.Upload) { u.ExternalID = "/subscriptions/x/images/y" }, ""},
		{"no external id yet", func(u *store.Upload) { u.ExternalID = "" }, ""},
		{"id with a tab", func(u *store.Upload) { u.ID = "1\t2" }, "is not an id"},
		{"build id with a newline", func(u *store.Upload) { u.BuildID = "a\nb" }, "build id"},
		{"provider with a slash", func(u *store.Upload) { u.Provider = "a/b" }, "provider"},
		{"format out of the dir", func(u *store.Upload) { u.Format = "../raw" }, "is not a format"},
		{"unknown state", func(u *store.Upload) { u.State = "building" }, `state "building" is not one of uploading, ready, deleting, failed`},
		{"shell_type with a control character", func(u *store.Upload) { u.ShellType = "sh\x1b[2J" }, "shell_type"},
		{"external id with a newline", func(u *store.Upload) { u.ExternalID = "a\nb" }, "control character"},
		{"external id too long", func(u *store.Upload) { u.ExternalID = strings.Repeat("a", 5000) }, "longer"},
		{"negative attempts", func(u *store.Upload) { u.Attempts = -1 }, "negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := good()
			tt.change(&u)
			err := store.CheckUpload(u)
			if tt.says == "" && err != nil || tt.says != "" && (err == nil || !strings.Contains(err.Error(), tt.says)) {
				t.Errorf("CheckUpload = %v; want an error saying %q (none if empty)", err, tt.says)
			}
		})
	}
}

// TestRemoveFormatStaysInImagesDir: a format that leads out of the images-dir
// removes nothing there, and is an error.
func TestRemoveFormatStaysInImagesDir(t *testing.T) {
	dir := t.TempDir()
	images := filepath.Join(dir, "images")
	s, err := store.Open(context.Background(), store.Options{ImagesDir: images})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	victim := filepath.Join(dir, "victim")
	for _, p := range []string{victim, victim + ".sha256", victim + ".md5"} {
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range [][3]string{{"debian", "abc", "x/../../victim"}, {"..", "abc", "raw"}, {"debian", "a/../../..", "raw"}} {
		if err := s.RemoveFormat(tt[0], tt[1], tt[2]); err == nil {
			t.Errorf("RemoveFormat%q: no error; want one", tt)
		}
	}
	for _, p := range []string{victim, victim + ".sha256", victim + ".md5"} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s outside the images-dir: %v; want it left", p, err)
		}
	}
}

// TestSQLiteRefusesBadIDs: a build of the SQLite state whose id holds a tab
// or a newline, as a hand edit of the database may leave, is not listed (its
// id would become a gearman function name) nor read.
func TestSQLiteRefusesBadIDs(t *testing.T) {
	ctx := context.Background()
	s, err := store.Open(ctx, store.Options{ImagesDir: filepath.Join(t.TempDir(), "images")})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, id := range []string{"abc\tdef", "abc\ndef"} {
		if _, err := s.CreateBuild(ctx, store.Build{ID: id, Image: "debian", Source: store.SourceDIB}); err != nil {
			t.Fatal(err)
		}
		if b, err := s.Build(ctx, id); err == nil {
			t.Errorf("build %q read: %+v; want it refused", id, b)
		}
	}
	if builds, _ := s.Builds(ctx, store.BuildFilter{}); len(builds) != 0 {
		t.Errorf("builds listed: %+v; want none", builds)
	}
}
