package main

import (
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/listing"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

// cloudIDs returns the ids of the Glance images of each provider, sorted.
func (e *env) cloudIDs() map[string][]string {
	e.t.Helper()
	out := map[string][]string{}
	for _, p := range []string{"cloud-q", "cloud-r"} {
		for _, img := range e.images(p) {
			out[p] = append(out[p], img.ID)
		}
		sort.Strings(out[p])
	}
	return out
}

// uploadKeys lists the uploads of image-list as build, provider, cloud image and
// state: what an import keeps (upload ids it may not).
func uploadKeys(rows []listing.Upload) []string {
	var out []string
	for _, r := range rows {
		out = append(out, strings.Join([]string{r.BuildID, r.Provider, r.ExternalID, r.State}, " "))
	}
	sort.Strings(out)
	return out
}

func TestZooKeeperImportKeepsUploads(t *testing.T) {
	e := newEnv(t, zuultest.ServerOptions{Tenant: "example"})
	z := testenv.NewZooKeeper(t, testenv.ZooKeeperOptions{})

	// A SQLite state as runs leave it: three builds rotated to keep-builds and
	// keep-uploads 2, one upload an operator deleted that no run carried out
	// yet, and the image paused.
	for i := int64(1); i <= 3; i++ {
		e.addBuild(e.makeImage(i), zuultest.BuildSpec{})
		e.once(0)
	}
	builds := e.buildsJSON()
	if len(builds) != 2 {
		t.Fatalf("SQLite runs left %d builds, want 2", len(builds))
	}
	newest, older := builds[0].BuildID, builds[1].BuildID
	var released listing.Upload
	for _, u := range e.uploadsJSON() {
		if u.BuildID == older && u.Provider == "cloud-q" {
			released = u
		}
	}
	if released.ExternalID == "" {
		t.Fatalf("no upload of the older build %s to cloud-q: %+v", older, e.uploadsJSON())
	}
	e.must(0, []string{"image-delete", "--provider", "cloud-q", "--image", "debian", "--build-id", older, "--upload-id", released.UploadID})
	e.must(0, []string{"image-pause", "debian"})
	sqliteUploads := uploadKeys(e.uploadsJSON())
	before := e.cloudIDs()
	if len(before["cloud-q"]) != 2 || len(before["cloud-r"]) != 2 {
		t.Fatalf("Glance before the import: %v", before)
	}

	e.must(exitUsage, []string{"zookeeper-import"}, "no zookeeper-servers")

	// With zookeeper-servers added, the builder and the listings refuse to lose
	// track of the SQLite state, and say what to do.
	e.appendConfig(zkKeys(z, zkChroot))
	db := filepath.Join(e.dir, "images", "builder.db")
	e.must(exitUsage, []string{"--once"}, "zookeeper-import", db, "2 builds, 4 uploads, 1 poll cursor and 1 paused image")
	e.must(exitUsage, []string{"image-list"}, "zookeeper-import")
	if got := e.cloudIDs(); fmt.Sprint(got) != fmt.Sprint(before) {
		t.Fatalf("a refused run changed Glance: %v, was %v", got, before)
	}

	// Not while a builder holds the images-dir.
	lock, err := store.LockDir(filepath.Join(e.dir, "images"))
	if err != nil {
		t.Fatal(err)
	}
	e.must(exitLocked, []string{"zookeeper-import"}, "locked by another builder")
	lock.Unlock()

	out := e.must(0, []string{"zookeeper-import"}).stdout
	t.Logf("zookeeper-import:\n%s", out)
	for _, want := range []string{"builds:         2 copied, 0 there already", "uploads:        4 copied, 0 there already",
		"poll cursors:   1 copied", "paused images:  1 copied", "marked moved"} {
		if !strings.Contains(out, want) {
			t.Errorf("zookeeper-import output lacks %q:\n%s", want, out)
		}
	}

	// ZooKeeper holds what SQLite held: the same builds, cloud images and states.
	if got := uploadKeys(e.uploadsJSON()); !slices.Equal(got, sqliteUploads) {
		t.Errorf("image-list in ZooKeeper:\n%s\nwant, as in SQLite:\n%s", strings.Join(got, "\n"), strings.Join(sqliteUploads, "\n"))
	}
	if got := e.buildsJSON(); len(got) != 2 || got[0].BuildID != newest || got[1].BuildID != older {
		t.Errorf("dib-image-list in ZooKeeper = %+v, want %s then %s", got, newest, older)
	}
	if st, _ := e.status(); !st["debian"].Paused {
		t.Errorf("the pause was not copied: %+v", st["debian"])
	}
	// nodepool-launcher boots the newest build's uploads, as before.
	for p, pick := range launcher(t, z).Launch {
		var want string
		for _, u := range e.uploadsJSON() {
			if u.BuildID == newest && "debian/"+u.Provider == p {
				want = u.ExternalID
			}
		}
		if pick.ExternalID != want || want == "" {
			t.Errorf("nodepool-launcher would boot %s in %s, want %s", pick.ExternalID, p, want)
		}
	}

	// Runs in ZooKeeper mode upload nothing, carry out the delete that was
	// asked for and nothing else: the second run is the leak sweep's second
	// sighting, which would delete any upload it took for a leak.
	e.once(0)
	e.once(0)
	want := map[string][]string{"cloud-q": slices.DeleteFunc(slices.Clone(before["cloud-q"]), func(id string) bool {
		return id == released.ExternalID
	}), "cloud-r": before["cloud-r"]}
	if got := e.cloudIDs(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("Glance after ZooKeeper runs: %v, want %v (before: %v, released %s)", got, want, before, released.ExternalID)
	}
	if rows := e.uploadsJSON(); len(rows) != 3 {
		t.Errorf("image-list after ZooKeeper runs: %+v", rows)
	}

	// A second import copies nothing.
	if out := e.must(0, []string{"zookeeper-import"}).stdout; !strings.Contains(out, "nothing copied") {
		t.Errorf("second zookeeper-import:\n%s", out)
	}
	if rows := e.uploadsJSON(); len(rows) != 3 {
		t.Errorf("image-list after a second import: %+v", rows)
	}

	// A new Zuul build is uploaded and rotated as usual, in ZooKeeper.
	e.must(0, []string{"image-unpause", "debian"})
	e.addBuild(e.makeImage(4), zuultest.BuildSpec{})
	e.once(0)
	builds = e.buildsJSON()
	if len(builds) != 2 || builds[1].BuildID != newest || builds[0].BuildID == newest {
		t.Fatalf("builds after a new Zuul build: %+v, want a new one and %s", builds, newest)
	}
	latest := builds[0].BuildID
	got := map[string][]string{}
	for _, u := range e.uploadsJSON() {
		if u.State != "ready" {
			t.Errorf("upload not ready after the run: %+v", u)
		}
		got[u.Provider] = append(got[u.Provider], u.BuildID)
	}
	for _, p := range []string{"cloud-q", "cloud-r"} {
		if !slices.Equal(got[p], []string{latest, newest}) {
			t.Errorf("%s uploads are of builds %v, want %s and %s", p, got[p], latest, newest)
		}
		if n := len(e.images(p)); n != 2 {
			t.Errorf("%s holds %d images, want 2", p, n)
		}
	}
	for _, id := range before["cloud-r"] {
		if !slices.Contains(e.cloudIDs()["cloud-r"], id) {
			continue
		}
		// What stays of SQLite's uploads is the newest build's.
		for _, u := range e.uploadsJSON() {
			if u.ExternalID == id && u.BuildID != newest {
				t.Errorf("cloud-r image %s of build %s kept; only %s's should be", id, u.BuildID, newest)
			}
		}
	}
}
