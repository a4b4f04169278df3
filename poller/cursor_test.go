package poller

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/store/storetest"
	"github.com/nodepool-builder/nodepool-builder/zuulapi"
	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

func TestJudge(t *testing.T) {
	end := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	cur := store.Cursor{Image: "debian", ZuulID: 1000, ZuulUUID: "aaa", ZuulEndTime: end, Outcome: "ready", Time: end.Add(time.Minute)}
	old := cur // recorded before end times were kept
	old.ZuulEndTime = time.Time{}
	for _, tt := range []struct {
		name string
		cur  store.Cursor
		zb   zuulapi.Build
		want verdict
	}{
		{"no cursor", store.Cursor{Image: "debian"}, zuulapi.Build{ID: 1, UUID: "bbb", EndTime: end}, newer},
		{"the cursor's build", cur, zuulapi.Build{ID: 1000, UUID: "aaa", EndTime: end}, settled},
		{"the cursor's build under another id", cur, zuulapi.Build{ID: 4, UUID: "aaa", EndTime: end}, settled},
		{"a higher id", cur, zuulapi.Build{ID: 1001, UUID: "bbb", EndTime: end.Add(time.Hour)}, newer},
		{"a higher id that ended earlier", cur, zuulapi.Build{ID: 1001, UUID: "bbb", EndTime: end.Add(-time.Hour)}, newer},
		{"a lower id that ended later", cur, zuulapi.Build{ID: 3, UUID: "bbb", EndTime: end.Add(time.Second)}, newer},
		{"a lower id that ended as the cursor's", cur, zuulapi.Build{ID: 3, UUID: "bbb", EndTime: end}, behind},
		{"a lower id that ended earlier", cur, zuulapi.Build{ID: 999, UUID: "bbb", EndTime: end.Add(-time.Hour)}, behind},
		{"the same id, another build, earlier", cur, zuulapi.Build{ID: 1000, UUID: "bbb", EndTime: end.Add(-time.Hour)}, behind},
		{"a lower id with no end time", cur, zuulapi.Build{ID: 3, UUID: "bbb"}, behind},
		{"an old cursor: ended after it was recorded", old, zuulapi.Build{ID: 3, UUID: "bbb", EndTime: end.Add(2 * time.Minute)}, newer},
		{"an old cursor: ended before it was recorded", old, zuulapi.Build{ID: 3, UUID: "bbb", EndTime: end}, behind},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := judge(tt.cur, tt.zb); got != tt.want {
				t.Errorf("judge(%+v, %+v) = %d, want %d", tt.cur, tt.zb, got, tt.want)
			}
		})
	}
}

func (f *fixture) publishAt(id int64, end time.Time, tag string) zuultest.Build {
	f.t.Helper()
	b, err := f.zuul.AddBuild(zuultest.BuildSpec{Job: "build-debian", Project: "org/images", ID: id, EndTime: end,
		Artifacts: []zuultest.ArtifactSpec{{Name: "qcow2", Data: f.image("qcow2", tag), Metadata: meta("qcow2")}}})
	if err != nil {
		f.t.Fatal(err)
	}
	return b
}

// poll polls and fails the test unless it ingested the Zuul build want.
func (f *fixture) pollIngests(what string, want zuultest.Build) {
	f.t.Helper()
	out, err := f.poll(context.Background(), "debian")
	if err != nil || out.Ingested == nil || out.Ingested.Zuul.UUID != want.UUID || out.Ingested.State != store.Ready {
		f.t.Fatalf("%s: poll = %+v, %v; want Zuul build %s (id %d) fetched\n%s", what, out, err, want.UUID, want.ID, f.logs.String())
	}
}

// TestPollAfterZuulIDsRestart: Zuul's database is rebuilt and its ids start
// again, far below the cursor; its new builds are fetched all the same.
func TestPollAfterZuulIDsRestart(t *testing.T) {
	f := newFixture(t, "qcow2")
	now := time.Now().UTC().Truncate(time.Second)
	f.publishAt(0, now.Add(-3*time.Hour), "1")
	f.publishAt(0, now.Add(-2*time.Hour), "2")
	last := f.publishAt(0, now.Add(-time.Hour), "3")
	f.pollIngests("before the rebuild", last)

	f.zuul.Restart()
	first := f.publishAt(0, now.Add(-30*time.Minute), "4")
	f.pollIngests("the first build after the rebuild (id 1)", first)
	second := f.publishAt(0, now.Add(-20*time.Minute), "5")
	f.pollIngests("the second build after the rebuild (id 2)", second)
	if c, _ := f.st.Cursor(context.Background(), "debian"); c.ZuulID != second.ID || c.BehindID != 0 || !c.ZuulEndTime.Equal(now.Add(-20*time.Minute)) {
		t.Fatalf("cursor = %+v", c)
	}
	logs := f.logs.String()
	if strings.Contains(logs, "behind the poll cursor") {
		t.Errorf("builds fetched were called behind the cursor:\n%s", logs)
	}
	if n := strings.Count(logs, "Zuul's ids went back"); n != 1 {
		t.Errorf("the ids going back were logged %d times, want once:\n%s", n, logs)
	}
}

// TestPollZuulBehindCursor: Zuul's newest build is below the cursor and ended
// before it (a database restored from an older backup): it is not fetched,
// the cursor says so, and it is logged once, not at every poll.
func TestPollZuulBehindCursor(t *testing.T) {
	f := newFixture(t, "qcow2")
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Second)
	f.publishAt(0, now.Add(-2*time.Hour), "1")
	last := f.publishAt(0, now.Add(-time.Hour), "2")
	f.pollIngests("before the restore", last)

	f.zuul.Restart()
	older := f.publishAt(0, now.Add(-2*time.Hour), "1")
	for i := range 3 {
		out, err := f.poll(ctx, "debian")
		if err != nil || out.Ingested != nil || !strings.Contains(out.Skipped, "behind the poll cursor") {
			t.Fatalf("poll %d = %+v, %v; want nothing fetched, Zuul behind the cursor", i, out, err)
		}
	}
	c, _ := f.st.Cursor(ctx, "debian")
	if c.BehindID != older.ID || c.ZuulUUID != last.UUID {
		t.Fatalf("cursor = %+v; want it to record id %d behind it", c, older.ID)
	}
	if n := strings.Count(f.logs.String(), "Zuul's newest build is behind the poll cursor"); n != 1 {
		t.Fatalf("the warning was logged %d times, want once:\n%s", n, f.logs.String())
	}
	// A new build ends later: fetched, and the cursor is no longer behind.
	next := f.publishAt(0, now, "3")
	f.pollIngests("a build newer than the cursor", next)
	if c, _ := f.st.Cursor(ctx, "debian"); c.BehindID != 0 || c.ZuulUUID != next.UUID {
		t.Fatalf("cursor after a newer build = %+v", c)
	}
}

// TestPollAfterHostileHugeID: one answer carries a build with a huge _id (and
// an end time far ahead); the real builds that follow it are still fetched.
func TestPollAfterHostileHugeID(t *testing.T) {
	for _, tt := range []struct {
		name string
		end  time.Duration // of the hostile build, from now
	}{
		{"a plausible end time", -10 * time.Minute},
		{"an end time far ahead", 100 * 365 * 24 * time.Hour},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, "qcow2")
			now := time.Now().UTC().Truncate(time.Second)
			real1 := f.publishAt(0, now.Add(-time.Hour), "1")
			f.pollIngests("the first real build", real1)

			hostile := f.publishAt(1<<62, now.Add(tt.end), "hostile")
			f.pollIngests("the hostile answer", hostile)
			f.zuul.RemoveBuild(hostile.UUID) // the next answers are real again

			// Zuul's clock a little ahead of the builder's, as the hostile
			// end time was clamped to the builder's now.
			real2 := f.publishAt(0, time.Now().UTC().Add(2*time.Second).Truncate(time.Second), "2")
			f.pollIngests("the real build after the hostile answer", real2)
			real3 := f.publishAt(0, time.Now().UTC().Add(3*time.Second).Truncate(time.Second), "3")
			f.pollIngests("the next real build", real3)
		})
	}
}

// deleteReleased deletes a build as the builder's lifecycle does once an
// operator or retention released it: released, its files forgotten, then its
// record.
func deleteReleased(t *testing.T, st *store.Store, id string) {
	t.Helper()
	ctx := context.Background()
	b, err := st.ReleaseBuild(ctx, id, "released by the test")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.ForgetBuild(b); err != nil {
		t.Fatal(err)
	}
	if err := st.RemoveBuild(ctx, b); err != nil {
		t.Fatal(err)
	}
}

// TestPollRefetchesWhenNoBuildIsReady: every build of a zuul-image was
// released and deleted; the next poll fetches Zuul's newest build again,
// though the cursor has it.
func TestPollRefetchesWhenNoBuildIsReady(t *testing.T) {
	f := newFixture(t, "qcow2")
	ctx := context.Background()
	zb := f.publishAt(0, time.Time{}, "1")
	f.pollIngests("the first poll", zb)
	out, err := f.poll(ctx, "debian")
	if err != nil || out.Ingested != nil {
		t.Fatalf("poll with the build ready = %+v, %v; want nothing fetched", out, err)
	}
	builds, _ := f.st.Builds(ctx, store.BuildFilter{Image: "debian"})
	for _, b := range builds {
		deleteReleased(t, f.st, b.ID)
	}
	f.pollIngests("after every build was deleted", zb)
	out, err = f.poll(ctx, "debian")
	if err != nil || out.Ingested != nil {
		t.Fatalf("poll with the build ready again = %+v, %v; want nothing fetched", out, err)
	}
}

// laggingBackend is a state whose listings have not seen the builds made
// lately, as a ZooKeeper cache may not have seen, when a builder takes the
// image's lock, the build another builder made just before it let go. Reads of
// one record and the cursor go to the state itself.
type laggingBackend struct {
	store.Backend
	lag atomic.Bool
}

func (l *laggingBackend) Builds(ctx context.Context, f store.BuildFilter) ([]store.Build, error) {
	if l.lag.Load() {
		return nil, nil
	}
	return l.Backend.Builds(ctx, f)
}

// TestPollUnderLockReadsTheCursorsBuild: a zuul-image whose listing shows no
// ready build is fetched again only when the build its cursor names is gone
// in the state itself, not when a lagging listing misses a build another
// builder has just made.
func TestPollUnderLockReadsTheCursorsBuild(t *testing.T) {
	f := newFixture(t, "qcow2")
	ctx := context.Background()
	lag := &laggingBackend{Backend: f.raw.Backend}
	f.st, f.raw = storetest.Open(t, store.Options{ImagesDir: f.cfg.ImagesDir, Backend: lag})
	f.newPoller()
	zb := f.publishAt(0, time.Time{}, "1")
	f.pollIngests("the first poll", zb)
	cur, err := f.st.Cursor(ctx, "debian")
	if err != nil || cur.Build == "" {
		t.Fatalf("cursor after the fetch = %+v, %v; want it to name the build", cur, err)
	}
	lag.lag.Store(true)
	out, err := f.poll(ctx, "debian")
	if err != nil || out.Ingested != nil {
		t.Fatalf("poll while the listing lags = %+v, %v; want nothing fetched: the cursor's build is ready\n%s", out, err, f.logs.String())
	}
	// Once that build is really gone, the image is due again.
	lag.lag.Store(false)
	deleteReleased(t, f.st, cur.Build)
	lag.lag.Store(true)
	f.pollIngests("after the cursor's build was deleted", zb)
}

// TestPollDoesNotRefetchALostBuild: the record of the build a Zuul build
// became goes without a builder of ours releasing it (a Python
// nodepool-builder whose nodepool.yaml lacks the image deletes it). The poll
// does not fetch that Zuul build again, which would only be deleted again;
// the tidy-up removes the build's files and says on the cursor that it was
// lost; an operator's request fetches it, and a newer Zuul build is fetched
// as ever.
func TestPollDoesNotRefetchALostBuild(t *testing.T) {
	for _, how := range []string{"deleted", "marked deleting"} {
		t.Run(how, func(t *testing.T) {
			f := newFixture(t, "qcow2")
			ctx := context.Background()
			zb := f.publishAt(0, time.Time{}, "1")
			f.pollIngests("the first poll", zb)
			cur, _ := f.st.Cursor(ctx, "debian")
			b := mustBuild(t, f.st, cur.Build)
			file := mustPath(f.st.FilePath("debian", b.ID, "qcow2"))
			// As nodepool's cleanup writes it: the state changes, the reason
			// it had while ready (none) stays.
			b.SetState(store.Deleting, time.Now())
			if err := f.raw.Write(ctx, store.PutBuild(&b)); err != nil {
				t.Fatal(err)
			}
			if how == "deleted" {
				if err := f.raw.Write(ctx, store.DeleteBuild(b)); err != nil {
					t.Fatal(err)
				}
			}
			out, err := f.poll(ctx, "debian")
			if err != nil || out.Ingested != nil {
				t.Fatalf("poll after the record went = %+v, %v; want nothing fetched\n%s", out, err, f.logs.String())
			}
			if how == "marked deleting" {
				// The lifecycle deletes it, as it deletes any deleting build.
				if err := f.st.ForgetBuild(b); err != nil {
					t.Fatal(err)
				}
				if err := f.st.RemoveBuild(ctx, b); err != nil {
					t.Fatal(err)
				}
				if _, err := os.Stat(file); !errors.Is(err, os.ErrNotExist) {
					t.Fatalf("file of the deleted build: %v", err)
				}
			}
			lost, err := f.st.SettleLost(ctx, time.Now(), nil)
			if err != nil || len(lost) != 1 || lost[0].ID != b.ID || lost[0].ZuulUUID != zb.UUID {
				t.Fatalf("SettleLost = %+v, %v; want build %s of Zuul build %s", lost, err, b.ID, zb.UUID)
			}
			if _, err := os.Stat(file); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("file of the lost build: %v, want it removed", err)
			}
			if again, _ := f.st.SettleLost(ctx, time.Now(), nil); len(again) != 0 {
				t.Errorf("SettleLost again = %+v, want nothing: settled once", again)
			}
			cur, _ = f.st.Cursor(ctx, "debian")
			if cur.Outcome != store.OutcomeLost || cur.ZuulUUID != zb.UUID || !strings.Contains(cur.Reason, "deleted by another program") {
				t.Fatalf("cursor = %+v, want Zuul build %s lost", cur, zb.UUID)
			}
			out, err = f.poll(ctx, "debian")
			if err != nil || out.Ingested != nil || !strings.Contains(out.Skipped, "was deleted by another program") {
				t.Fatalf("poll after the loss was settled = %+v, %v; want nothing fetched, and why", out, err)
			}
			got, err := f.buildNow(ctx, "debian", "")
			if err != nil || got.Zuul.UUID != zb.UUID || got.State != store.Ready {
				t.Fatalf("an operator's request = %+v, %v; want Zuul build %s fetched again", got, err, zb.UUID)
			}
			f.pollIngests("a newer Zuul build", f.publishAt(0, time.Time{}, "2"))
		})
	}
}

func mustBuild(t *testing.T, st *store.Store, id string) store.Build {
	t.Helper()
	b, err := st.Build(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
