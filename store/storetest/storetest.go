// Package storetest is the conformance suite of store backends: every backend
// runs it, so that the lifecycle behaves the same whichever holds the state.
// It also gives the tests of other packages a store with its backend at hand
// (Open, Raw), to set up records no step of the builder writes so.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// Opener opens a store whose backend is the one under test, with the given
// clock, on a fresh, empty state of the test's own (for a shared backend, the
// same state on every call in one test; see Options). The suite closes it.
type Opener func(t *testing.T, now func() time.Time) (*store.Store, Raw)

// opened is a store under test with its backend, through which a test writes
// the records it sets up.
type opened struct {
	*store.Store
	raw Raw
}

// Clock is a settable time source, safe for concurrent use.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a clock at a fixed start.
func NewClock() *Clock { return NewClockAt(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)) }

// NewClockAt returns a clock at t.
func NewClockAt(t time.Time) *Clock { return &Clock{t: t} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Add moves the clock on.
func (c *Clock) Add(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
	return c.t
}

// Options say what kind of state a backend keeps.
type Options struct {
	// Shared: builders share the state (ZooKeeper). open, called twice in one
	// test, returns two stores of different builders on the same state; the
	// state binds to no builder id.
	Shared bool
}

// Run runs every conformance test against the backend open makes.
func Run(t *testing.T, open Opener, opts Options) {
	tests := []struct {
		name string
		fn   func(*testing.T, Opener)
	}{
		{"BuildsNewestFirstWithFiles", testBuildsNewestFirstWithFiles},
		{"StaleBuildWriteConflicts", testStaleBuildWriteConflicts},
		{"UploadIDsAndStates", testUploadIDsAndStates},
		{"StaleUploadWriteConflicts", testStaleUploadWriteConflicts},
		{"WriteIsAllOrNothing", testWriteIsAllOrNothing},
		{"ConcurrentWritersLoseNoChange", testConcurrentWritersLoseNoChange},
		{"CreateUploadChangesItsBuild", testCreateUploadChangesItsBuild},
		{"Cursor", testCursor},
		{"ResetCursor", testResetCursor},
		{"BuildRequestsAndPauses", testBuildRequestsAndPauses},
		{"LeakMarks", testLeakMarks},
		{"ReleaseBuild", testReleaseBuild},
		{"ReleaseUpload", testReleaseUpload},
		{"RefusedFormats", testRefusedFormats},
		{"Locks", testLocks},
		{"NodepoolFields", testNodepoolFields},
		{"BuildRequest", testBuildRequest},
		{"ImageNames", func(t *testing.T, open Opener) { testImageNames(t, open, opts.Shared) }},
		{"BuildWriterCommit", testBuildWriterCommit},
		{"BuildWriterAbort", testBuildWriterAbort},
		{"BuildWriterRecordsAsItGoes", testBuildWriterRecordsAsItGoes},
	}
	if opts.Shared {
		tests = append(tests, []struct {
			name string
			fn   func(*testing.T, Opener)
		}{
			{"SharedBindsNoBuilder", testSharedBindsNoBuilder},
			{"SharedRecords", testSharedRecords},
			{"SharedLocks", testSharedLocks},
		}...)
	} else {
		tests = append(tests, struct {
			name string
			fn   func(*testing.T, Opener)
		}{"BindBuilder", testBindBuilder})
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, open) })
	}
}

func openStore(t *testing.T, open Opener, clock *Clock) opened {
	t.Helper()
	s, raw := open(t, clock.Now)
	t.Cleanup(func() { s.Close() })
	return opened{s, raw}
}

// build creates a build of image and moves it to state.
func build(t *testing.T, s opened, image string, state store.State) store.Build {
	t.Helper()
	ctx := context.Background()
	b, err := s.CreateBuild(ctx, store.Build{Image: image, Source: store.SourceZuul})
	if err != nil {
		t.Fatal(err)
	}
	if state != store.Building {
		if err := s.raw.SetBuildState(ctx, &b, state, ""); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// upload creates an upload of b to provider and moves it to state.
func upload(t *testing.T, s opened, b *store.Build, provider string, state store.State) store.Upload {
	t.Helper()
	ctx := context.Background()
	u, err := s.CreateUpload(ctx, b, provider, "qcow2")
	if err != nil {
		t.Fatal(err)
	}
	if state != store.Uploading {
		u.SetState(state, s.Now())
		if err := s.raw.Write(ctx, store.PutUpload(&u)); err != nil {
			t.Fatal(err)
		}
	}
	return u
}

func testBuildsNewestFirstWithFiles(t *testing.T, open Opener) {
	ctx := context.Background()
	clock := NewClock()
	s := openStore(t, open, clock)
	var ids []string
	for i := range 3 {
		clock.Add(time.Second)
		b, err := s.CreateBuild(ctx, store.Build{Image: "debian", Source: store.SourceZuul,
			Zuul: store.ZuulRef{UUID: fmt.Sprintf("u%d", i), ID: int64(i), LogURL: "https://logs/x"}})
		if err != nil {
			t.Fatal(err)
		}
		if len(b.ID) != 32 || b.Version == 0 || b.State != store.Building || b.BuilderID != s.BuilderID() {
			t.Fatalf("created build = %+v", b)
		}
		ids = append(ids, b.ID)
	}
	if _, err := s.CreateBuild(ctx, store.Build{Image: "other", Source: store.SourceDIB}); err != nil {
		t.Fatal(err)
	}
	b, err := s.Build(ctx, ids[1])
	if err != nil {
		t.Fatal(err)
	}
	b.SetFile(store.File{Format: "raw", SHA256: "aa", MD5: "bb", Size: 10, Present: true, URL: "https://a/raw.zst"})
	b.SetFile(store.File{Format: "qcow2", SHA256: "cc", Size: 5, Present: true})
	b.PID = 4242
	clock.Add(time.Second)
	if err := s.raw.SetBuildState(ctx, &b, store.Ready, ""); err != nil {
		t.Fatal(err)
	}
	got, err := s.Builds(ctx, store.BuildFilter{Image: "debian"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0].ID != ids[2] || got[2].ID != ids[0] {
		t.Fatalf("builds not newest first: %+v", got)
	}
	ready, err := s.Builds(ctx, store.BuildFilter{Image: "debian", State: store.Ready})
	if err != nil {
		t.Fatal(err)
	}
	if len(ready) != 1 || ready[0].ID != ids[1] || ready[0].Version != b.Version || ready[0].PID != 4242 {
		t.Fatalf("ready builds = %+v, want %s at version %d", ready, ids[1], b.Version)
	}
	r := ready[0]
	if f := r.Formats(); len(f) != 2 || f[0] != "qcow2" || f[1] != "raw" {
		t.Fatalf("formats = %v", f)
	}
	if f, _ := r.File("raw"); f != (store.File{Format: "raw", SHA256: "aa", MD5: "bb", Size: 10, Present: true, URL: "https://a/raw.zst"}) {
		t.Fatalf("raw file = %+v", f)
	}
	if r.Zuul.UUID != "u1" || r.Zuul.ID != 1 || r.Zuul.LogURL != "https://logs/x" || !r.StateTime.Equal(clock.Now()) {
		t.Fatalf("build read back = %+v", r)
	}
	if dib, _ := s.Builds(ctx, store.BuildFilter{Source: store.SourceDIB}); len(dib) != 1 || dib[0].Image != "other" {
		t.Fatalf("dib builds = %+v", dib)
	}
	// A file removed after upload stays recorded, not present.
	f, _ := r.File("raw")
	f.Present = false
	r.SetFile(f)
	if err := s.raw.Write(ctx, store.PutBuild(&r)); err != nil {
		t.Fatal(err)
	}
	r, err = s.Build(ctx, ids[1])
	if err != nil {
		t.Fatal(err)
	}
	if f := r.Formats(); len(f) != 1 || f[0] != "qcow2" || len(r.Files) != 2 {
		t.Fatalf("formats after removal = %v of %+v", f, r.Files)
	}
	if _, err := s.Build(ctx, "0123456789abcdef0123456789abcdef"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("missing build: %v, want ErrNotFound", err)
	}
}

func testStaleBuildWriteConflicts(t *testing.T, open Opener) {
	ctx := context.Background()
	s := openStore(t, open, NewClock())
	b := build(t, s, "debian", store.Ready)
	stale := b
	if err := s.raw.SetBuildState(ctx, &b, store.Deleting, "released"); err != nil {
		t.Fatal(err)
	}
	if err := s.raw.SetBuildState(ctx, &stale, store.Failed, "late"); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("write of a stale build: %v, want ErrConflict", err)
	}
	if stale.State != store.Ready {
		t.Fatalf("a failed write changed the caller's copy to %s", stale.State)
	}
	if err := s.raw.Write(ctx, store.DeleteBuild(stale)); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("delete of a stale build: %v, want ErrConflict", err)
	}
	got, err := s.Build(ctx, b.ID)
	if err != nil || got.State != store.Deleting || got.Reason != "released" {
		t.Fatalf("build after conflicts = %+v, %v", got, err)
	}
	// Creating a build whose id exists is a conflict too.
	dup := store.Build{ID: b.ID, Image: "debian", Source: store.SourceDIB, State: store.Building}
	if err := s.raw.Write(ctx, store.PutBuild(&dup)); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("create of an existing build: %v, want ErrConflict", err)
	}
	if err := s.raw.Write(ctx, store.DeleteBuild(got)); err != nil {
		t.Fatal(err)
	}
	if err := s.raw.SetBuildState(ctx, &got, store.Ready, ""); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("write of a deleted build: %v, want ErrConflict", err)
	}
	if _, err := s.Build(ctx, b.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("deleted build: %v", err)
	}
}

func testUploadIDsAndStates(t *testing.T, open Opener) {
	ctx := context.Background()
	clock := NewClock()
	s := openStore(t, open, clock)
	b := build(t, s, "debian", store.Ready)
	u1 := upload(t, s, &b, "cloud-a", store.Uploading)
	u2 := upload(t, s, &b, "cloud-a", store.Uploading)
	u3 := upload(t, s, &b, "cloud-b", store.Uploading)
	// Ids are ten digits (a ZooKeeper sequence in nodepool's schema) and grow
	// within a build and provider; where they start, and their steps, are the
	// backend's.
	for _, u := range []store.Upload{u1, u2, u3} {
		if len(u.ID) != 10 || strings.Trim(u.ID, "0123456789") != "" {
			t.Fatalf("upload id %q is not ten digits", u.ID)
		}
	}
	if u2.ID <= u1.ID {
		t.Fatalf("upload ids %s then %s do not grow", u1.ID, u2.ID)
	}
	if u1.Image != "debian" || u1.Version == 0 || u1.State != store.Uploading || u1.Format != "qcow2" || u1.Attempts != 1 {
		t.Fatalf("created upload = %+v", u1)
	}
	next := clock.Add(time.Minute)
	u1.SetState(store.Ready, next)
	u1.ExternalID, u1.ExternalName, u1.Attempts, u1.LastError, u1.NextAttempt = "ext-1", "debian-1", 2, "boom", next
	if err := s.raw.Write(ctx, store.PutUpload(&u1)); err != nil {
		t.Fatal(err)
	}
	got, err := s.Uploads(ctx, store.UploadFilter{Provider: "cloud-a", State: store.Ready})
	if err != nil {
		t.Fatal(err)
	}
	want := u1
	if len(got) != 1 || got[0] != want {
		t.Fatalf("ready uploads = %+v, want %+v", got, want)
	}
	if all, _ := s.Uploads(ctx, store.UploadFilter{BuildID: b.ID}); len(all) != 3 {
		t.Fatalf("uploads of the build = %+v", all)
	}
	if byImage, _ := s.Uploads(ctx, store.UploadFilter{Image: "debian", Provider: "cloud-b"}); len(byImage) != 1 || byImage[0].ID != u3.ID {
		t.Fatalf("uploads by image and provider = %+v", byImage)
	}
	if err := s.raw.Write(ctx, store.DeleteBuild(b)); err == nil {
		t.Fatal("deleting a build that still has uploads succeeded")
	}
	for _, u := range []store.Upload{u1, u2, u3} {
		if err := s.raw.Write(ctx, store.DeleteUpload(u)); err != nil {
			t.Fatal(err)
		}
	}
	// An id is never used twice, deleted or not: it names cloud images that
	// may still be on their way out.
	if u4 := upload(t, s, &b, "cloud-a", store.Ready); u4.ID <= u2.ID {
		t.Fatalf("upload after deletes got id %s, not above %s", u4.ID, u2.ID)
	} else if err := s.raw.Write(ctx, store.DeleteUpload(u4)); err != nil {
		t.Fatal(err)
	}
	b, err = s.Build(ctx, b.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.raw.Write(ctx, store.DeleteBuild(b)); err != nil {
		t.Fatal(err)
	}
	// An upload of a build that is gone cannot be made.
	if _, err := s.CreateUpload(ctx, &b, "cloud-a", "raw"); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("upload of a deleted build: %v, want ErrConflict", err)
	}
}

func testStaleUploadWriteConflicts(t *testing.T, open Opener) {
	ctx := context.Background()
	s := openStore(t, open, NewClock())
	b := build(t, s, "debian", store.Ready)
	u := upload(t, s, &b, "cloud-a", store.Failed)
	// A worker read the failed upload to retry it; an operator releases it meanwhile.
	snapshot := u
	if _, err := s.ReleaseUpload(ctx, b.ID, "cloud-a", u.ID); err != nil {
		t.Fatal(err)
	}
	snapshot.SetState(store.Uploading, s.Now())
	snapshot.Attempts++
	if err := s.raw.Write(ctx, store.PutUpload(&snapshot)); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("retry from a stale read: %v, want ErrConflict", err)
	}
	if err := s.raw.Write(ctx, store.DeleteUpload(u)); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("delete from a stale read: %v, want ErrConflict", err)
	}
	ups, err := s.Uploads(ctx, store.UploadFilter{BuildID: b.ID})
	if err != nil || len(ups) != 1 || ups[0].State != store.Deleting || ups[0].Attempts != u.Attempts {
		t.Fatalf("uploads = %+v, %v; want the release to stand", ups, err)
	}
}

func testWriteIsAllOrNothing(t *testing.T, open Opener) {
	ctx := context.Background()
	s := openStore(t, open, NewClock())
	b := build(t, s, "debian", store.Building)
	other := build(t, s, "debian", store.Ready)
	stale := other
	if err := s.raw.SetBuildState(ctx, &other, store.Deleting, ""); err != nil {
		t.Fatal(err)
	}
	// An ingest: the build ready and the cursor moved, in one write; the stale
	// part makes the whole write fail.
	ready := b
	ready.SetState(store.Ready, s.Now())
	cur := store.Cursor{Image: "debian", ZuulID: 7, ZuulUUID: "abc", Outcome: "ready", Time: s.Now()}
	if err := s.raw.Write(ctx, store.PutBuild(&ready), store.PutCursor(cur), store.PutBuild(&stale)); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("write with a stale part: %v, want ErrConflict", err)
	}
	if ready.Version != b.Version {
		t.Fatalf("a failed write changed the caller's version from %d to %d", b.Version, ready.Version)
	}
	got, err := s.Build(ctx, b.ID)
	if err != nil || got.State != store.Building || got.Version != b.Version {
		t.Fatalf("build after a failed write = %+v, %v", got, err)
	}
	if c, err := s.Cursor(ctx, "debian"); err != nil || c.ZuulID != 0 {
		t.Fatalf("cursor after a failed write = %+v, %v", c, err)
	}
	if err := s.raw.Write(ctx, store.PutBuild(&ready), store.PutCursor(cur)); err != nil {
		t.Fatal(err)
	}
	got, _ = s.Build(ctx, b.ID)
	c, _ := s.Cursor(ctx, "debian")
	if got.State != store.Ready || got.Version != ready.Version || c.ZuulID != 7 {
		t.Fatalf("after the write: build %+v (caller has version %d), cursor %+v", got, ready.Version, c)
	}
}

func testConcurrentWritersLoseNoChange(t *testing.T, open Opener) {
	ctx := context.Background()
	s := openStore(t, open, NewClock())
	b := build(t, s, "debian", store.Ready)
	u := upload(t, s, &b, "cloud-a", store.Failed)
	const writers, each = 4, 10
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for range writers {
		wg.Go(func() {
			for range each {
				for {
					ups, err := s.Uploads(ctx, store.UploadFilter{BuildID: b.ID})
					if err != nil {
						errs <- err
						return
					}
					cur := ups[0]
					cur.Attempts++
					err = s.raw.Write(ctx, store.PutUpload(&cur))
					if err == nil {
						break
					}
					if !errors.Is(err, store.ErrConflict) {
						errs <- err
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	ups, err := s.Uploads(ctx, store.UploadFilter{BuildID: b.ID})
	if err != nil {
		t.Fatal(err)
	}
	if ups[0].Attempts != u.Attempts+writers*each || ups[0].Version != u.Version+writers*each {
		t.Fatalf("after %d read-modify-writes: attempts %d (from %d), version %d (from %d)", writers*each, ups[0].Attempts, u.Attempts, ups[0].Version, u.Version)
	}
}

func testCreateUploadChangesItsBuild(t *testing.T, open Opener) {
	ctx := context.Background()
	s := openStore(t, open, NewClock())
	b := build(t, s, "debian", store.Ready)
	// A release that read the build before an upload of it began must not succeed
	// on what it read.
	seenByRelease := b
	worker := b
	if _, err := s.CreateUpload(ctx, &worker, "cloud-a", "qcow2"); err != nil {
		t.Fatal(err)
	}
	seenByRelease.SetState(store.Deleting, s.Now())
	if err := s.raw.Write(ctx, store.PutBuild(&seenByRelease)); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("release from a read older than an upload: %v, want ErrConflict", err)
	}
	// And an upload from a read older than a release is refused.
	stale := worker
	if _, err := s.ReleaseBuild(ctx, b.ID, "x"); !errors.Is(err, store.ErrInProgress) {
		t.Fatalf("release during an upload: %v, want ErrInProgress", err)
	}
	ups, _ := s.Uploads(ctx, store.UploadFilter{BuildID: b.ID})
	ups[0].SetState(store.Ready, s.Now())
	if err := s.raw.Write(ctx, store.PutUpload(&ups[0])); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ReleaseBuild(ctx, b.ID, "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateUpload(ctx, &stale, "cloud-b", "raw"); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("upload from a read older than a release: %v, want ErrConflict", err)
	}
	if ups, _ := s.Uploads(ctx, store.UploadFilter{BuildID: b.ID, Provider: "cloud-b"}); len(ups) != 0 {
		t.Fatalf("a refused upload left a record: %+v", ups)
	}
}

func testCursor(t *testing.T, open Opener) {
	ctx := context.Background()
	s := openStore(t, open, NewClock())
	c, err := s.Cursor(ctx, "debian")
	if err != nil || c.ZuulID != 0 || c.Image != "debian" {
		t.Fatalf("empty cursor = %+v, %v", c, err)
	}
	at := s.Now()
	if err := s.raw.Write(ctx, store.PutCursor(store.Cursor{Image: "debian", ZuulID: 7, ZuulUUID: "abc", Outcome: "failed", Reason: "checksum", Time: at})); err != nil {
		t.Fatal(err)
	}
	if err := s.raw.Write(ctx, store.PutCursor(store.Cursor{Image: "debian", ZuulID: 9, ZuulUUID: "def", Outcome: "ready", Time: at})); err != nil {
		t.Fatal(err)
	}
	c, err = s.Cursor(ctx, "debian")
	if err != nil || c.ZuulID != 9 || c.ZuulUUID != "def" || c.Outcome != "ready" || c.Reason != "" || !c.Time.Equal(at) ||
		!c.ZuulEndTime.IsZero() || c.BehindID != 0 || c.Build != "" || c.Waiting != "" {
		t.Fatalf("cursor = %+v, %v", c, err)
	}
	// The end time of its Zuul build, Zuul's newest id behind it, the build
	// it became and what waits for the operator are kept.
	end := at.Add(-time.Hour).Truncate(time.Second)
	if err := s.raw.Write(ctx, store.PutCursor(store.Cursor{Image: "debian", ZuulID: 9, ZuulUUID: "def", ZuulEndTime: end,
		Outcome: "ready", Time: at, BehindID: 3, Build: "0123456789abcdef0123456789abcdef", Waiting: "host h"})); err != nil {
		t.Fatal(err)
	}
	c, err = s.Cursor(ctx, "debian")
	if err != nil || !c.ZuulEndTime.Equal(end) || c.BehindID != 3 || c.ZuulID != 9 || c.Build != "0123456789abcdef0123456789abcdef" ||
		c.Waiting != "host h" {
		t.Fatalf("cursor with an end time, an id behind it and a wait = %+v, %v", c, err)
	}
	if other, _ := s.Cursor(ctx, "fedora"); other.ZuulID != 0 {
		t.Fatalf("another image's cursor = %+v", other)
	}
}

// testResetCursor: a reset takes the image's build lock itself and waits for
// nobody (ErrHeld while it is held, the cursor left as it was); it says what
// it replaced, a cursor the store refuses too, and lets the lock go.
func testResetCursor(t *testing.T, open Opener) {
	ctx := context.Background()
	s := openStore(t, open, NewClock())
	at := s.Now()
	set := store.Cursor{Image: "debian", ZuulID: 9, ZuulUUID: "def", Outcome: "ready", Time: at, BehindID: 3}
	if err := s.raw.Write(ctx, store.PutCursor(set)); err != nil {
		t.Fatal(err)
	}
	key := store.LockKey{Image: "debian"}
	held, err := s.TryLock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.ResetCursor(ctx, "debian", "by hand"); !errors.Is(err, store.ErrHeld) {
		t.Fatalf("reset while the image's lock is held: %v, want ErrHeld", err)
	}
	if c, err := s.Cursor(ctx, "debian"); err != nil || c.ZuulID != 9 || c.BehindID != 3 {
		t.Fatalf("the cursor after a reset refused for the lock: %+v, %v; want it as it was", c, err)
	}
	held.Release()

	was, refused, err := s.ResetCursor(ctx, "debian", "by hand")
	if err != nil || refused != nil || was.ZuulID != 9 || was.ZuulUUID != "def" || was.BehindID != 3 {
		t.Fatalf("reset = %+v, %v, %v; want the cursor it replaced", was, refused, err)
	}
	c, err := s.Cursor(ctx, "debian")
	if err != nil || c.ZuulID != 0 || c.ZuulUUID != "" || c.BehindID != 0 || c.Outcome != store.OutcomeReset || c.Reason != "by hand" {
		t.Fatalf("cursor after a reset = %+v, %v", c, err)
	}
	if h, err := s.TryLock(ctx, key); err != nil {
		t.Fatalf("the image's lock after a reset: %v; want it let go", err)
	} else {
		h.Release()
	}

	// One the store refuses is replaced all the same.
	if err := s.raw.Write(ctx, store.PutCursor(store.Cursor{Image: "debian", ZuulID: 3, ZuulUUID: "x", Outcome: "ready",
		Time: at, Build: "../../elsewhere"})); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Cursor(ctx, "debian"); !errors.Is(err, store.ErrRefusedRecord) {
		t.Fatalf("a cursor with a path for its build read as %v; want it refused", err)
	}
	was, refused, err = s.ResetCursor(ctx, "debian", "by hand")
	if err != nil || !errors.Is(refused, store.ErrRefusedRecord) || was.ZuulID != 0 {
		t.Fatalf("reset of a refused cursor = %+v, %v, %v; want it replaced, saying why it was refused", was, refused, err)
	}
	if c, err := s.Cursor(ctx, "debian"); err != nil || c.Outcome != store.OutcomeReset {
		t.Fatalf("cursor after resetting a refused one = %+v, %v", c, err)
	}
}

func testBuildRequestsAndPauses(t *testing.T, open Opener) {
	ctx := context.Background()
	clock := NewClock()
	s := openStore(t, open, clock)
	if err := s.RequestBuild(ctx, "fedora"); err != nil {
		t.Fatal(err)
	}
	start := clock.Now()
	clock.Add(time.Minute)
	if err := s.RequestBuild(ctx, "fedora"); err != nil { // a repeat keeps the first time
		t.Fatal(err)
	}
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
	if err := s.ClearBuildRequest(ctx, "fedora", start); err != nil {
		t.Fatal(err)
	}
	if reqs, _ := s.BuildRequests(ctx); len(reqs) != 0 {
		t.Fatal("request not cleared")
	}
	for range 2 {
		if err := s.SetPaused(ctx, "fedora", true); err != nil {
			t.Fatal(err)
		}
	}
	if p, _ := s.Paused(ctx); len(p) != 1 || !p["fedora"].Equal(clock.Now()) {
		t.Fatalf("paused = %v", p)
	}
	for range 2 {
		if err := s.SetPaused(ctx, "fedora", false); err != nil {
			t.Fatal(err)
		}
	}
	if p, _ := s.Paused(ctx); len(p) != 0 {
		t.Fatalf("paused after unpause = %v", p)
	}
}

func testLeakMarks(t *testing.T, open Opener) {
	ctx := context.Background()
	clock := NewClock()
	s := openStore(t, open, clock)
	first := clock.Now()
	if got, err := s.LeakMark(ctx, "cloud-a", "img-1"); err != nil || !got.Equal(first) {
		t.Fatalf("first mark = %v, %v", got, err)
	}
	clock.Add(time.Minute)
	if got, _ := s.LeakMark(ctx, "cloud-a", "img-1"); !got.Equal(first) {
		t.Fatalf("second sighting moved the first to %v", got)
	}
	s.LeakMark(ctx, "cloud-a", "img-2")
	markedB, _ := s.LeakMark(ctx, "cloud-b", "img-1")
	if err := s.ClearLeakMarks(ctx, "cloud-a", map[string]bool{"img-2": true}); err != nil {
		t.Fatal(err)
	}
	later := clock.Add(time.Minute)
	if got, _ := s.LeakMark(ctx, "cloud-a", "img-1"); !got.Equal(later) {
		t.Fatalf("a cleared mark was kept: first seen %v", got)
	}
	if got, _ := s.LeakMark(ctx, "cloud-b", "img-1"); !got.Equal(markedB) {
		t.Fatalf("clearing cloud-a touched cloud-b: %v", got)
	}
}

func testReleaseBuild(t *testing.T, open Opener) {
	ctx := context.Background()
	cases := []struct {
		name        string
		build       store.State   // the build's state before the release
		uploads     []store.State // its uploads' states, to cloud-a
		wantErr     error
		wantUploads store.State // every upload's state afterwards
	}{
		{name: "ready build and its uploads", build: store.Ready, uploads: []store.State{store.Ready, store.Failed, store.Deleting}, wantUploads: store.Deleting},
		{name: "failed build", build: store.Failed, wantUploads: store.Deleting},
		{name: "already deleting", build: store.Deleting, uploads: []store.State{store.Deleting}, wantUploads: store.Deleting},
		{name: "refused while building", build: store.Building, wantErr: store.ErrInProgress},
		{name: "refused while an upload runs", build: store.Ready, uploads: []store.State{store.Ready, store.Uploading}, wantErr: store.ErrInProgress},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := openStore(t, open, NewClock())
			b := build(t, s, "debian", store.Ready)
			before := map[string]store.State{}
			for _, st := range c.uploads {
				u := upload(t, s, &b, "cloud-a", st)
				before[u.ID] = st
			}
			if c.build != store.Ready {
				if err := s.raw.SetBuildState(ctx, &b, c.build, ""); err != nil {
					t.Fatal(err)
				}
			}
			got, err := s.ReleaseBuild(ctx, b.ID, "operator asked")
			if !errors.Is(err, c.wantErr) {
				t.Fatalf("ReleaseBuild error = %v, want %v", err, c.wantErr)
			}
			after, lerr := s.Build(ctx, b.ID)
			if lerr != nil {
				t.Fatal(lerr)
			}
			ups, lerr := s.Uploads(ctx, store.UploadFilter{BuildID: b.ID})
			if lerr != nil {
				t.Fatal(lerr)
			}
			if c.wantErr != nil {
				if after.State != c.build {
					t.Errorf("a refused release changed the build to %s", after.State)
				}
				for _, u := range ups {
					if u.State != before[u.ID] {
						t.Errorf("a refused release changed upload %s from %s to %s", u.ID, before[u.ID], u.State)
					}
				}
				return
			}
			if got.State != store.Deleting || after.State != store.Deleting || got.Name() != b.Name() || got.Version != after.Version {
				t.Errorf("release returned %s %s v%d, store holds %s v%d; want deleting", got.Name(), got.State, got.Version, after.State, after.Version)
			}
			for _, u := range ups {
				if u.State != c.wantUploads {
					t.Errorf("upload %s is %s, want %s", u.ID, u.State, c.wantUploads)
				}
			}
		})
	}
	t.Run("unknown build", func(t *testing.T) {
		s := openStore(t, open, NewClock())
		if _, err := s.ReleaseBuild(ctx, "0123456789abcdef0123456789abcdef", ""); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("error = %v, want ErrNotFound", err)
		}
	})
}

func testReleaseUpload(t *testing.T, open Opener) {
	ctx := context.Background()
	cases := []struct {
		name    string
		state   store.State
		wantErr error
	}{
		{name: "ready", state: store.Ready},
		{name: "failed", state: store.Failed},
		{name: "already deleting", state: store.Deleting},
		{name: "refused while uploading", state: store.Uploading, wantErr: store.ErrInProgress},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := openStore(t, open, NewClock())
			b := build(t, s, "debian", store.Ready)
			target := upload(t, s, &b, "cloud-a", store.Uploading)
			target.SetState(c.state, s.Now())
			target.ExternalID = "ext-1"
			if err := s.raw.Write(ctx, store.PutUpload(&target)); err != nil {
				t.Fatal(err)
			}
			// A sibling upload in the same build and provider must be left alone.
			sibling := upload(t, s, &b, "cloud-a", store.Ready)
			got, err := s.ReleaseUpload(ctx, b.ID, "cloud-a", target.ID)
			if !errors.Is(err, c.wantErr) {
				t.Fatalf("ReleaseUpload error = %v, want %v", err, c.wantErr)
			}
			ups, err := s.Uploads(ctx, store.UploadFilter{BuildID: b.ID})
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]store.State{target.ID: store.Deleting, sibling.ID: store.Ready}
			if c.wantErr != nil {
				want[target.ID] = c.state
			} else if got.State != store.Deleting || got.Image != "debian" || got.ExternalID != "ext-1" {
				t.Errorf("release returned %+v", got)
			}
			for _, u := range ups {
				if u.State != want[u.ID] {
					t.Errorf("upload %s is %s, want %s", u.ID, u.State, want[u.ID])
				}
			}
		})
	}
	t.Run("unknown upload", func(t *testing.T) {
		s := openStore(t, open, NewClock())
		if _, err := s.ReleaseUpload(ctx, "nope", "cloud-a", "0000000001"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("error = %v, want ErrNotFound", err)
		}
	})
}

func testRefusedFormats(t *testing.T, open Opener) {
	ctx := context.Background()
	s := openStore(t, open, NewClock())
	b := build(t, s, "debian", store.Ready)
	b.Refuse("raw", "sha256 does not match")
	if err := s.raw.Write(ctx, store.PutBuild(&b)); err != nil {
		t.Fatal(err)
	}
	got, err := s.Build(ctx, b.ID)
	if err != nil || got.Refused["raw"] != "sha256 does not match" || len(got.Refused) != 1 {
		t.Fatalf("refusals read back = %v, %v", got.Refused, err)
	}
	got.Refuse("vhd", "backing file")
	delete(got.Refused, "raw")
	if err := s.raw.Write(ctx, store.PutBuild(&got)); err != nil {
		t.Fatal(err)
	}
	listed, _ := s.Builds(ctx, store.BuildFilter{Image: "debian"})
	if len(listed) != 1 || len(listed[0].Refused) != 1 || listed[0].Refused["vhd"] != "backing file" {
		t.Fatalf("refusals listed = %+v", listed)
	}
}

func testBindBuilder(t *testing.T, open Opener) {
	ctx := context.Background()
	s := openStore(t, open, NewClock())
	// The store was opened with its builder id: the state holds it.
	if held, err := s.raw.BindBuilder(ctx, s.BuilderID()); err != nil || held != s.BuilderID() {
		t.Fatalf("bind to the store's own id = %q, %v", held, err)
	}
	held, err := s.raw.BindBuilder(ctx, "another-builder")
	if !errors.Is(err, store.ErrOtherBuilder) || held != s.BuilderID() {
		t.Fatalf("bind to another id = %q, %v; want ErrOtherBuilder and %s", held, err, s.BuilderID())
	}
	if held, err := s.raw.BindBuilder(ctx, s.BuilderID()); err != nil || held != s.BuilderID() {
		t.Fatalf("a refused bind changed the state: %q, %v", held, err)
	}
}

func testLocks(t *testing.T, open Opener) {
	ctx := context.Background()
	s := openStore(t, open, NewClock())
	b := build(t, s, "debian", store.Ready)
	u := upload(t, s, &b, "cloud-a", store.Uploading)
	keys := []store.LockKey{
		{Image: "debian"},
		{Image: "debian", BuildID: b.ID},
		{Image: "debian", BuildID: b.ID, Provider: "cloud-a"},
		{Image: "debian", BuildID: b.ID, Provider: "cloud-a", UploadID: u.ID},
	}
	var held []store.Held
	for _, k := range keys {
		h, err := s.TryLock(ctx, k)
		if err != nil {
			t.Fatalf("lock %s: %v", k, err)
		}
		held = append(held, h)
		if _, err := s.TryLock(ctx, k); !errors.Is(err, store.ErrHeld) {
			t.Fatalf("second lock of %s: %v, want ErrHeld", k, err)
		}
	}
	// Different keys do not exclude each other, and a released lock can be taken again.
	other, err := s.TryLock(ctx, store.LockKey{Image: "fedora"})
	if err != nil {
		t.Fatalf("lock of another image: %v", err)
	}
	other.Release()
	for i, h := range held {
		h.Release()
		h.Release() // twice is fine
		again, err := s.TryLock(ctx, keys[i])
		if err != nil {
			t.Fatalf("lock %s after release: %v", keys[i], err)
		}
		again.Release()
	}
	// The lock of a build or upload that does not exist is not taken, nor is
	// the record made by taking it.
	missing := []store.LockKey{
		{Image: "debian", BuildID: "0123456789abcdef0123456789abcdef"},
		{Image: "debian", BuildID: "0123456789abcdef0123456789abcdef", Provider: "cloud-a"},
		{Image: "debian", BuildID: b.ID, Provider: "cloud-a", UploadID: "9999999999"},
	}
	for _, k := range missing {
		if h, err := s.TryLock(ctx, k); !errors.Is(err, store.ErrNotFound) {
			if h != nil {
				h.Release()
			}
			t.Fatalf("lock of missing %s: %v, want ErrNotFound", k, err)
		}
	}
	if _, err := s.Build(ctx, "0123456789abcdef0123456789abcdef"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a lock brought a build record: %v", err)
	}
	if ups, _ := s.Uploads(ctx, store.UploadFilter{BuildID: b.ID}); len(ups) != 1 {
		t.Fatalf("a lock brought an upload record: %+v", ups)
	}
}

func testSharedBindsNoBuilder(t *testing.T, open Opener) {
	ctx := context.Background()
	s := openStore(t, open, NewClock())
	for _, id := range []string{s.BuilderID(), "another-builder"} {
		if held, err := s.raw.BindBuilder(ctx, id); err != nil || held != id {
			t.Fatalf("bind to %s = %q, %v; a shared state binds to none", id, held, err)
		}
	}
}

func testSharedRecords(t *testing.T, open Opener) {
	ctx := context.Background()
	clock := NewClock()
	a, b := openStore(t, open, clock), openStore(t, open, clock)
	if a.BuilderID() == b.BuilderID() {
		t.Fatalf("two stores share builder id %s", a.BuilderID())
	}
	bd := build(t, a, "debian", store.Ready)
	// A build read by id is read fresh: no waiting.
	got, err := b.Build(ctx, bd.ID)
	if err != nil || got.BuilderID != a.BuilderID() || got.State != store.Ready || got.Version != bd.Version {
		t.Fatalf("build of a, read by b = %+v, %v", got, err)
	}
	testenv.WaitFor(t, 30*time.Second, "a's build in b's listing", func() bool {
		bs, err := b.Builds(ctx, store.BuildFilter{Image: "debian"})
		return err == nil && len(bs) == 1 && bs[0].Version == bd.Version
	})
	u := upload(t, b, &got, "cloud-a", store.Uploading)
	testenv.WaitFor(t, 30*time.Second, "b's upload in a's listing", func() bool {
		ups, err := a.Uploads(ctx, store.UploadFilter{BuildID: bd.ID})
		return err == nil && len(ups) == 1 && ups[0].ID == u.ID && ups[0].Version == u.Version
	})
	// A change from a stale read conflicts, whichever store made the record.
	stale := bd
	bd, _ = a.Build(ctx, bd.ID) // creating the upload changed the build
	u.SetState(store.Ready, clock.Now())
	if err := b.raw.Write(ctx, store.PutUpload(&u)); err != nil {
		t.Fatal(err)
	}
	if err := a.raw.SetBuildState(ctx, &stale, store.Deleting, ""); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("stale build write: %v, want ErrConflict", err)
	}
	if err := a.raw.SetBuildState(ctx, &bd, store.Deleting, ""); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "a's change in b's listing", func() bool {
		bs, err := b.Builds(ctx, store.BuildFilter{State: store.Deleting})
		return err == nil && len(bs) == 1 && bs[0].ID == bd.ID
	})
	if err := b.RequestBuild(ctx, "fedora"); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "b's build request at a", func() bool {
		reqs, err := a.BuildRequests(ctx)
		return err == nil && !reqs["fedora"].IsZero()
	})
	if err := a.SetPaused(ctx, "fedora", true); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "a's pause at b", func() bool {
		p, err := b.Paused(ctx)
		return err == nil && !p["fedora"].IsZero()
	})
}

func testSharedLocks(t *testing.T, open Opener) {
	ctx := context.Background()
	a, b := openStore(t, open, NewClock()), openStore(t, open, NewClock())
	bd := build(t, a, "debian", store.Ready)
	for _, k := range []store.LockKey{{Image: "debian"}, {Image: "debian", BuildID: bd.ID}} {
		h, err := a.TryLock(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.TryLock(ctx, k); !errors.Is(err, store.ErrHeld) {
			t.Fatalf("lock %s held by a, taken by b: %v, want ErrHeld", k, err)
		}
		h.Release()
		hb, err := b.TryLock(ctx, k)
		if err != nil {
			t.Fatalf("lock %s released by a, taken by b: %v", k, err)
		}
		hb.Release()
	}
	// A store that closes drops its locks with it.
	if _, err := a.TryLock(ctx, store.LockKey{Image: "fedora"}); err != nil {
		t.Fatal(err)
	}
	a.Close()
	hb, err := b.TryLock(ctx, store.LockKey{Image: "fedora"})
	if err != nil {
		t.Fatalf("lock of a closed store, taken by b: %v", err)
	}
	hb.Release()
}

func testNodepoolFields(t *testing.T, open Opener) {
	ctx := context.Background()
	s := openStore(t, open, NewClock())
	b, err := s.CreateBuild(ctx, store.Build{Image: "debian", Source: store.SourceDIB, Username: "ubuntu", PythonPath: "/usr/bin/python3", ShellType: "sh"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.raw.SetBuildState(ctx, &b, store.Ready, ""); err != nil {
		t.Fatal(err)
	}
	got, err := s.Build(ctx, b.ID)
	if err != nil || got.Hostname == "" || got.Hostname != b.Hostname || got.Username != "ubuntu" || got.PythonPath != "/usr/bin/python3" || got.ShellType != "sh" {
		t.Fatalf("build read back = %+v, %v", got, err)
	}
	u, err := s.CreateUpload(ctx, &got, "cloud-a", "qcow2")
	if err != nil {
		t.Fatal(err)
	}
	ups, err := s.Uploads(ctx, store.UploadFilter{BuildID: b.ID})
	if err != nil || len(ups) != 1 || ups[0].Username != "ubuntu" || ups[0].PythonPath != "/usr/bin/python3" || ups[0].ShellType != "sh" {
		t.Fatalf("upload read back = %+v, %v (created %+v)", ups, err, u)
	}
}

// testBuildRequest: the request that asked for a build is kept through its
// state changes, for a repeated request to find the build.
// testImageNames: the images of builds, requests and pauses are listed,
// sorted, once each; a shared state keeps an image's place once it had one,
// as nodepool's image nodes stay.
func testImageNames(t *testing.T, open Opener, shared bool) {
	ctx := context.Background()
	s := openStore(t, open, NewClock())
	names := func() []string {
		t.Helper()
		got, err := s.ImageNames(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := names(); len(got) != 0 {
		t.Fatalf("images of an empty state = %q", got)
	}
	build(t, s, "ubuntu", store.Ready)
	build(t, s, "ubuntu", store.Failed)
	if err := s.RequestBuild(ctx, "fedora"); err != nil {
		t.Fatal(err)
	}
	if err := s.SetPaused(ctx, "centos", true); err != nil {
		t.Fatal(err)
	}
	if err := s.SetPaused(ctx, "ubuntu", true); err != nil {
		t.Fatal(err)
	}
	if got, want := names(), []string{"centos", "fedora", "ubuntu"}; !slices.Equal(got, want) {
		t.Fatalf("images = %q, want %q", got, want)
	}
	if err := s.SetPaused(ctx, "centos", false); err != nil {
		t.Fatal(err)
	}
	want := []string{"fedora", "ubuntu"}
	if shared {
		want = []string{"centos", "fedora", "ubuntu"}
	}
	if got := names(); !slices.Equal(got, want) {
		t.Fatalf("images after centos was unpaused = %q, want %q", got, want)
	}
}

func testBuildRequest(t *testing.T, open Opener) {
	ctx := context.Background()
	s := openStore(t, open, NewClock())
	b, err := s.CreateBuild(ctx, store.Build{Image: "debian", Source: store.SourceDIB, Request: "job-1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.raw.SetBuildState(ctx, &b, store.Ready, ""); err != nil {
		t.Fatal(err)
	}
	got, err := s.Build(ctx, b.ID)
	if err != nil || got.Request != "job-1" || got.State != store.Ready {
		t.Fatalf("build read back = %+v, %v", got, err)
	}
	other, err := s.CreateBuild(ctx, store.Build{Image: "debian", Source: store.SourceDIB})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.Build(ctx, other.ID); err != nil || got.Request != "" {
		t.Fatalf("build without a request read back = %+v, %v", got, err)
	}
}
