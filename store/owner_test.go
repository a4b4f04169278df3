package store

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestOpenRefusesAnotherBuildersImagesDir: a first start in an images-dir that
// a Python nodepool-builder used (its builder_id.txt, build files, checksums,
// manifest) stops and says so, naming what it found, unless told to take it
// over; taken over, it keeps the builder id and removes nothing.
func TestOpenRefusesAnotherBuildersImagesDir(t *testing.T) {
	const pythonID = "0c7f2a64-5b1e-4a57-9a3e-6d3f0e2b9c11"
	build := "centos-" + NewBuildID()
	type setup struct {
		builderID string   // builder_id.txt, when not empty
		owner     string   // builder.owner, when not empty
		partial   bool     // .partial exists (a start of an earlier version)
		db        bool     // the SQLite state exists
		files     []string // other names in the images-dir
	}
	for _, c := range []struct {
		name  string
		setup setup
		want  []string // in the refusal; nil: opens
	}{
		{name: "empty", setup: setup{}},
		{name: "a Python builder's", setup: setup{builderID: pythonID,
			files: []string{build + ".qcow2", build + ".qcow2.md5", build + ".qcow2.sha256", build + ".d"}},
			want: []string{"builder_id.txt (builder " + pythonID + ")", build + ".qcow2", build + ".d", "take-over-images-dir"}},
		{name: "a builder_id.txt alone", setup: setup{builderID: pythonID}, want: []string{"builder_id.txt"}},
		{name: "build files alone", setup: setup{files: []string{build + ".raw"}}, want: []string{build + ".raw"}},
		{name: "an operator's files only", setup: setup{files: []string{"notes.txt", "README"}}},
		{name: "an earlier version's", setup: setup{builderID: pythonID, partial: true, db: true, files: []string{build + ".qcow2"}}},
		{name: "ours", setup: setup{builderID: pythonID, owner: pythonID, db: true, files: []string{build + ".qcow2"}}},
		{name: "ours, state lost", setup: setup{builderID: pythonID, owner: pythonID, files: []string{build + ".qcow2"}},
			want: []string{"no record of: " + build + ".qcow2"}},
		{name: "ours, state started over", setup: setup{builderID: pythonID, owner: pythonID}},
		{name: "builder_id.txt replaced", setup: setup{builderID: pythonID, owner: "another-id", db: true},
			want: []string{"says builder " + pythonID + ", where this builder ran as another-id"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, takeOver := range []bool{false, true} {
				dir := t.TempDir()
				write := func(name, text string) {
					if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
						t.Fatal(err)
					}
				}
				if c.setup.builderID != "" {
					write("builder_id.txt", c.setup.builderID)
				}
				if c.setup.owner != "" {
					write(ownerFileName, c.setup.owner+"\n")
				}
				if c.setup.partial {
					os.Mkdir(filepath.Join(dir, partialDirName), 0o755)
				}
				if c.setup.db {
					s, err := openSQLite(context.Background(), filepath.Join(dir, "builder.db"), Create, nil, nil)
					if err != nil {
						t.Fatal(err)
					}
					id := c.setup.owner
					if id == "" {
						id = c.setup.builderID
					}
					if _, err := s.BindBuilder(context.Background(), id); err != nil {
						t.Fatal(err)
					}
					s.Close()
				}
				for _, f := range c.setup.files {
					if strings.HasSuffix(f, ".d") {
						os.MkdirAll(filepath.Join(dir, f, "manifests"), 0o755)
					} else {
						write(f, "data")
					}
				}
				s, err := Open(context.Background(), Options{ImagesDir: dir, TakeOver: takeOver})
				refused := c.want != nil && !takeOver
				if refused {
					if !errors.Is(err, ErrForeignImagesDir) {
						t.Fatalf("Open = %v; want it refused as another builder's", err)
					}
					for _, w := range c.want {
						if !strings.Contains(err.Error(), w) {
							t.Errorf("the refusal does not say %q:\n%v", w, err)
						}
					}
					if _, err := os.Stat(filepath.Join(dir, partialDirName)); !c.setup.partial && err == nil {
						t.Error("a refused images-dir was written to (.partial)")
					}
				} else if err != nil {
					if c.name == "builder_id.txt replaced" && errors.Is(err, ErrOtherBuilder) {
						continue // the state says which builder it is: that refusal stands
					}
					t.Fatalf("Open (take over %v) = %v", takeOver, err)
				} else {
					if c.setup.builderID != "" && s.BuilderID() != c.setup.builderID {
						t.Errorf("builder id = %s, want %s from builder_id.txt", s.BuilderID(), c.setup.builderID)
					}
					if owner, _ := readOwner(dir); owner != s.BuilderID() {
						t.Errorf("builder.owner = %q, want %s", owner, s.BuilderID())
					}
					s.Close()
				}
				for _, f := range c.setup.files {
					if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
						t.Errorf("%s is gone: %v", f, err)
					}
				}
			}
		})
	}
}

// TestClaimWithASharedState: with the state in ZooKeeper, nothing local but
// builder.owner (or an earlier version's .partial) tells that this program
// used the images-dir.
func TestClaimWithASharedState(t *testing.T) {
	const id = "0c7f2a64-5b1e-4a57-9a3e-6d3f0e2b9c11"
	build := "centos-" + NewBuildID() + ".qcow2"
	for _, c := range []struct {
		name   string
		owner  bool
		legacy bool
		ok     bool
	}{
		{name: "a Python builder's"},
		{name: "ours", owner: true, ok: true},
		{name: "an earlier version's", legacy: true, ok: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			os.WriteFile(filepath.Join(dir, "builder_id.txt"), []byte(id), 0o644)
			os.WriteFile(filepath.Join(dir, build), []byte("x"), 0o644)
			if c.owner {
				os.WriteFile(filepath.Join(dir, ownerFileName), []byte(id), 0o644)
			}
			if c.legacy {
				os.Mkdir(filepath.Join(dir, partialDirName), 0o755)
			}
			err := claim(dir, id, nil, false)
			if c.ok != (err == nil) {
				t.Fatalf("claim = %v, want ok %v", err, c.ok)
			}
			if err != nil && !strings.Contains(err.Error(), build) {
				t.Errorf("the refusal does not name %s: %v", build, err)
			}
			if err := claim(dir, id, nil, true); err != nil {
				t.Errorf("take-over: %v", err)
			}
		})
	}
}
