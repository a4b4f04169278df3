package store_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/store/storetest"
)

// copySource is a SQLite state as a finished run leaves it, and more: builds in
// every state, uploads in every state, a poll cursor, a pause and a build request.
type copySource struct {
	st      *store.Store
	sq      *store.SQLite
	skipped string // the build Copy must skip
}

func newCopySource(t *testing.T) copySource {
	t.Helper()
	ctx := context.Background()
	clock := storetest.NewClock()
	st, raw := storetest.Open(t, store.Options{ImagesDir: t.TempDir(), Now: clock.Now})
	t.Cleanup(func() { st.Close() })
	build := func(image string, state store.State) store.Build {
		t.Helper()
		clock.Add(time.Minute)
		b, err := st.CreateBuild(ctx, store.Build{Image: image, Source: store.SourceZuul,
			Files:   []store.File{{Format: "qcow2", SHA256: "ab", Size: 3, Present: true}},
			Refused: map[string]string{"raw": "checksum"}, Zuul: store.ZuulRef{UUID: "u-" + image, ID: 7}})
		if err != nil {
			t.Fatal(err)
		}
		if state != store.Building {
			if err := raw.SetBuildState(ctx, &b, state, "why"); err != nil {
				t.Fatal(err)
			}
		}
		return b
	}
	upload := func(b *store.Build, provider string, state store.State, ext string) {
		t.Helper()
		clock.Add(time.Second)
		u, err := st.CreateUpload(ctx, b, provider, "qcow2")
		if err != nil {
			t.Fatal(err)
		}
		u.SetState(state, clock.Now())
		u.ExternalID, u.ExternalName, u.Attempts = ext, "name-"+ext, 2
		if state == store.Failed {
			u.LastError = "boom"
		}
		if err := raw.Write(ctx, store.PutUpload(&u)); err != nil {
			t.Fatal(err)
		}
	}
	old := build("debian", store.Failed)
	gone := build("debian", store.Deleting)
	upload(&gone, "cloud-a", store.Deleting, "img-0")
	ready := build("debian", store.Ready)
	upload(&ready, "cloud-a", store.Failed, "")
	upload(&ready, "cloud-a", store.Ready, "img-1")
	upload(&ready, "cloud-b", store.Ready, "img-2")
	newest := build("debian", store.Ready)
	upload(&newest, "cloud-a", store.Ready, "img-3")
	upload(&newest, "cloud-b", store.Uploading, "")
	build("centos", store.Failed) // its image's newest: kept, for its reason and DIB's backoff
	build("fedora", store.Building)
	if err := raw.Write(ctx, store.PutCursor(store.Cursor{Image: "debian", ZuulID: 7, ZuulUUID: "u-debian", Outcome: "ready",
		Time: clock.Now()})); err != nil {
		t.Fatal(err)
	}
	if err := st.SetPaused(ctx, "centos", true); err != nil {
		t.Fatal(err)
	}
	if err := st.RequestBuild(ctx, "fedora"); err != nil {
		t.Fatal(err)
	}
	return copySource{st: st, sq: raw.Backend.(*store.SQLite), skipped: old.ID}
}

func openSQLiteDest(t *testing.T) *store.SQLite {
	t.Helper()
	sq, err := store.OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "dest.db"), store.Create, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sq.Close() })
	return sq
}

// summary lists what a state holds, in a form two states can be compared by.
func summary(t *testing.T, b store.Backend) string {
	t.Helper()
	ctx := context.Background()
	builds, err := b.Builds(ctx, store.BuildFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, bd := range builds {
		lines = append(lines, fmt.Sprintf("build %s %s %s %s %s %v %v %s %+v", bd.Name(), bd.State, bd.Reason,
			bd.StateTime.Format(time.RFC3339Nano), bd.Created.Format(time.RFC3339Nano), bd.Files, bd.Refused, bd.BuilderID, bd.Zuul))
	}
	ups, err := b.Uploads(ctx, store.UploadFilter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range ups {
		lines = append(lines, fmt.Sprintf("upload %s %s %s %s %s %d %s", u, u.State, u.ExternalID, u.ExternalName,
			u.StateTime.Format(time.RFC3339Nano), u.Attempts, u.LastError))
	}
	for _, image := range []string{"debian", "centos", "fedora"} {
		c, err := b.Cursor(ctx, image)
		if err != nil {
			t.Fatal(err)
		}
		if c.ZuulUUID != "" {
			lines = append(lines, fmt.Sprintf("cursor %+v", c))
		}
	}
	paused, _ := b.Paused(ctx)
	requests, _ := b.BuildRequests(ctx)
	for image := range paused {
		lines = append(lines, "paused "+image)
	}
	for image := range requests {
		lines = append(lines, "requested "+image)
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

func TestCopyIsCompleteAndIdempotent(t *testing.T) {
	ctx := context.Background()
	src := newCopySource(t)
	dst := openSQLiteDest(t)

	r, err := store.Copy(ctx, src.sq, dst)
	if err != nil {
		t.Fatal(err)
	}
	want := store.CopyReport{Builds: store.CopyCount{Copied: 5}, Uploads: store.CopyCount{Copied: 6},
		Cursors: store.CopyCount{Copied: 1}, Pauses: store.CopyCount{Copied: 1}, Requests: store.CopyCount{Copied: 1},
		Interrupted: 2}
	if len(r.Skipped) != 1 || !strings.Contains(r.Skipped[0], src.skipped) || !strings.Contains(r.Skipped[0], "failed") {
		t.Errorf("skipped = %q, want the old failed build %s", r.Skipped, src.skipped)
	}
	r.Skipped = nil
	if fmt.Sprint(r) != fmt.Sprint(want) {
		t.Errorf("report = %+v, want %+v", r, want)
	}
	// Everything but the skipped build is there as it was, upload ids included:
	// a SQLite destination numbers them in the order they are made.
	wantSummary := summary(t, src.sq)
	var kept []string
	for _, l := range strings.Split(wantSummary, "\n") {
		if !strings.Contains(l, src.skipped) {
			kept = append(kept, l)
		}
	}
	if got := summary(t, dst); got != strings.Join(kept, "\n") {
		t.Errorf("copied state:\n%s\nwant:\n%s", got, strings.Join(kept, "\n"))
	}

	again, err := store.Copy(ctx, src.sq, dst)
	if err != nil {
		t.Fatal(err)
	}
	want = store.CopyReport{Builds: store.CopyCount{Present: 5}, Uploads: store.CopyCount{Present: 6},
		Cursors: store.CopyCount{Present: 1}, Pauses: store.CopyCount{Present: 1}, Requests: store.CopyCount{Present: 1}}
	again.Skipped = nil
	if fmt.Sprint(again) != fmt.Sprint(want) {
		t.Errorf("second copy = %+v, want %+v", again, want)
	}
	if got := summary(t, dst); got != strings.Join(kept, "\n") {
		t.Errorf("second copy changed the state:\n%s", got)
	}
}

// TestCopyResumes runs Copy on a destination that a copy stopped half way
// left: a build there with some of its uploads.
func TestCopyResumes(t *testing.T) {
	ctx := context.Background()
	src := newCopySource(t)
	dst := openSQLiteDest(t)
	ready, err := src.st.Builds(ctx, store.BuildFilter{Image: "debian", State: store.Ready})
	if err != nil {
		t.Fatal(err)
	}
	b := ready[len(ready)-1] // the older ready build: a failed upload and two ready ones
	ups, err := src.st.Uploads(ctx, store.UploadFilter{BuildID: b.ID})
	if err != nil || len(ups) != 3 {
		t.Fatalf("uploads = %v, %v", ups, err)
	}
	b.Version = 0
	if err := dst.Write(ctx, store.PutBuild(&b)); err != nil {
		t.Fatal(err)
	}
	copied := 0
	for i := len(ups) - 1; i >= 0; i-- {
		if u := ups[i]; u.State == store.Failed || u.ExternalID == "img-1" {
			u.ID, u.Version = "", 0
			if err := dst.Write(ctx, store.PutUpload(&u)); err != nil {
				t.Fatal(err)
			}
			copied++
		}
	}
	r, err := store.Copy(ctx, src.sq, dst)
	if err != nil {
		t.Fatal(err)
	}
	if r.Builds != (store.CopyCount{Copied: 4, Present: 1}) || r.Uploads != (store.CopyCount{Copied: 4, Present: copied}) {
		t.Errorf("builds %+v, uploads %+v: want 4 builds copied, 1 there; 4 uploads copied, %d there", r.Builds, r.Uploads, copied)
	}
	all, err := dst.Uploads(ctx, store.UploadFilter{})
	if err != nil || len(all) != 6 {
		t.Errorf("destination holds %d uploads (%v), want 6", len(all), err)
	}
}

func TestSQLiteContentsAndMoved(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	c, err := store.ReadSQLiteContents(ctx, filepath.Join(dir, "absent.db"))
	if err != nil || !c.Empty() || c.MovedTo != "" {
		t.Fatalf("absent state: %+v, %v", c, err)
	}
	empty, err := store.Open(ctx, store.Options{ImagesDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	empty.Close()
	if c, err := store.ReadSQLiteContents(ctx, filepath.Join(dir, "builder.db")); err != nil || !c.Empty() || c.String() != "no records" {
		t.Fatalf("empty state: %+v %q, %v", c, c, err)
	}

	src := newCopySource(t)
	path := filepath.Join(src.st.Dir(), "builder.db")
	c, err = store.ReadSQLiteContents(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if c.Empty() || c.MovedTo != "" || c.String() != "6 builds, 6 uploads, 1 poll cursor, 1 paused image and 1 build request" {
		t.Errorf("contents = %+v: %s", c, c)
	}
	if to, _, err := src.sq.Moved(ctx); err != nil || to != "" {
		t.Fatalf("moved before the mark: %q, %v", to, err)
	}
	if err := src.sq.MarkMoved(ctx, "zk.example.com:2181/nodepool"); err != nil {
		t.Fatal(err)
	}
	to, at, err := src.sq.Moved(ctx)
	if err != nil || to != "zk.example.com:2181/nodepool" || !at.Equal(src.st.Now()) {
		t.Errorf("moved = %q at %s, %v; want zk.example.com:2181/nodepool at %s", to, at, err, src.st.Now())
	}
	if c, err := store.ReadSQLiteContents(ctx, path); err != nil || c.MovedTo != to {
		t.Errorf("contents after the mark: %+v, %v", c, err)
	}
}
