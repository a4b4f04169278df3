package source

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/internal/diskspace"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/store/storetest"
)

// fake is a Source whose looks and makes each test decides; it records what
// it is asked and told.
type fake struct {
	mu sync.Mutex
	// due, when set, answers Due and its job's Recheck; otherwise every look
	// finds a new build due (work).
	due func(ctx context.Context, image string, look fakeLook) (Work, error)
	// make, when set, makes the files; otherwise one qcow2 file is made.
	make func(ctx context.Context, w *store.BuildWriter) error

	looks   map[string][]fakeLook
	made    []string // the image of each Make, in order
	commits []store.Build
	aborts  []aborted
	ends    []End
}

// fakeLook is one look of the fake: Due's, or its job's Recheck, under the
// image's lock, with the work the look before found (Seen).
type fakeLook struct {
	Look
	Seen *Work
}

func (l fakeLook) Locked() bool { return l.Seen != nil }

// fakeMaker is the fake's maker: the look that found it, and what the test tags
// it with.
type fakeMaker struct {
	f     *fake
	image string
	look  Look
	tag   string
}

type aborted struct {
	build store.Build
	err   error
}

func newFake() *fake { return &fake{looks: map[string][]fakeLook{}} }

func (f *fake) Images() map[string]time.Duration { return nil }

func (f *fake) Abandon(context.Context, store.Build) error { return nil }

func (f *fake) Due(ctx context.Context, image string, look Look) (Work, error) {
	return f.look(ctx, image, fakeLook{Look: look})
}

func (f *fake) look(ctx context.Context, image string, look fakeLook) (Work, error) {
	f.mu.Lock()
	f.looks[image] = append(f.looks[image], look)
	due := f.due
	f.mu.Unlock()
	if due != nil {
		return due(ctx, image, look)
	}
	return f.work(image, look), nil
}

// Recheck looks again, with the work of the look before.
func (j *fakeMaker) Recheck(ctx context.Context) (Work, error) {
	seen := Do(Todo{Maker: j})
	return j.f.look(ctx, j.image, fakeLook{Look: j.look, Seen: &seen})
}

func (j *fakeMaker) Make(ctx context.Context, w *store.BuildWriter) error {
	f := j.f
	f.mu.Lock()
	f.made = append(f.made, w.Build().Image)
	mk := f.make
	f.mu.Unlock()
	if mk != nil {
		return mk(ctx, w)
	}
	return writeFile(ctx, w, "qcow2")
}

// Cursor moves the image's cursor to a ready build, or records the failure
// in it; the fake records each.
func (j *fakeMaker) Cursor(b store.Build, err error) *store.Cursor {
	f := j.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if err == nil {
		f.commits = append(f.commits, b)
		return &store.Cursor{Image: j.image, Outcome: "ready", Build: b.ID}
	}
	f.aborts = append(f.aborts, aborted{b, err})
	return &store.Cursor{Image: j.image, Outcome: "failed", Reason: err.Error()}
}

func (j *fakeMaker) Done(_ context.Context, end End) error {
	f := j.f
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ends = append(f.ends, end)
	return nil
}

// work is a new build of image, due, by a job of the look.
func (f *fake) work(image string, look fakeLook) Work {
	return Do(Todo{
		Reason: "the test asks",
		New:    store.Build{Image: image, Source: store.SourceDIB},
		Maker:  &fakeMaker{f: f, image: image, look: look.Look},
	})
}

func (f *fake) setDue(due func(ctx context.Context, image string, look fakeLook) (Work, error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.due = due
}

func (f *fake) setMake(mk func(ctx context.Context, w *store.BuildWriter) error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.make = mk
}

func (f *fake) looksOf(image string) []fakeLook {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.looks[image])
}

func (f *fake) madeImages() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.made)
}

func (f *fake) committed() []store.Build {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.commits)
}

func (f *fake) abortedBuilds() []aborted {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.aborts)
}

func (f *fake) ended() []End {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.ends)
}

// writeFile makes a format's file of the build where the writer says and
// adds it with its real checksums, as a source that verified it does.
func writeFile(ctx context.Context, w *store.BuildWriter, format string) error {
	path := mustPath(w.Temp(format))
	if err := os.WriteFile(path, []byte(w.Build().Name()+" "+format), 0o600); err != nil {
		return err
	}
	sha, md, size, err := store.HashFile(ctx, path)
	if err != nil {
		return err
	}
	return w.Add(store.File{Format: format, SHA256: sha, MD5: md, Size: size})
}

// fixture is a runner on a store of its own, with a fake source and a clock
// the test moves.
type fixture struct {
	t     *testing.T
	st    *store.Store
	raw   storetest.Raw // writes the records a test sets up
	clock *storetest.Clock
	cfg   atomic.Pointer[config.Config]
	src   *fake
	run   *Runner
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	clock := storetest.NewClock()
	st, raw := storetest.Open(t, store.Options{ImagesDir: t.TempDir(), Now: clock.Now})
	t.Cleanup(func() { st.Close() })
	f := &fixture{t: t, st: st, raw: raw, clock: clock, src: newFake()}
	f.cfg.Store(&config.Config{DiskImages: []config.DiskImage{{Name: "debian"}}})
	f.newRunner(nil)
	return f
}

// newRunner replaces the runner with one bounded by slots.
func (f *fixture) newRunner(slots chan struct{}) {
	f.run = NewRunner(Options{Store: f.st, Config: f.cfg.Load, Logger: slog.New(slog.DiscardHandler),
		Slots: slots, Now: f.clock.Now})
}

func (f *fixture) step(image string) (Result, error) {
	return f.run.Step(context.Background(), f.src, image)
}

// builds lists the image's builds in the store.
func (f *fixture) builds(image string) []store.Build {
	f.t.Helper()
	bs, err := f.st.Builds(context.Background(), store.BuildFilter{Image: image})
	if err != nil {
		f.t.Fatal(err)
	}
	return bs
}

// noneBegun checks that no build of the image was begun nor made.
func (f *fixture) noneBegun(image, what string) {
	f.t.Helper()
	if bs := f.builds(image); len(bs) != 0 {
		f.t.Fatalf("%s began builds: %+v", what, bs)
	}
	if made := f.src.madeImages(); len(made) != 0 {
		f.t.Fatalf("%s made %q", what, made)
	}
}

// only is the one build of the image in the store.
func (f *fixture) only(image string) store.Build {
	f.t.Helper()
	bs := f.builds(image)
	if len(bs) != 1 {
		f.t.Fatalf("builds of %s: %+v; want one", image, bs)
	}
	return bs[0]
}

// filesOn lists the names in the images-dir of the build's files (sidecars
// included).
func (f *fixture) filesOn(b store.Build) []string {
	f.t.Helper()
	names, err := filepath.Glob(filepath.Join(f.st.Dir(), b.Name()+".*"))
	if err != nil {
		f.t.Fatal(err)
	}
	return names
}

// readyBuild records a ready build of image with a qcow2 file, made as a
// source would make it.
func (f *fixture) readyBuild(image string) store.Build {
	f.t.Helper()
	ctx := context.Background()
	w, err := f.st.BeginBuild(ctx, store.Build{Image: image, Source: store.SourceZuul})
	if err != nil {
		f.t.Fatal(err)
	}
	if err := writeFile(ctx, w, "qcow2"); err != nil {
		f.t.Fatal(err)
	}
	b, err := w.Commit(ctx, nil)
	if err != nil {
		f.t.Fatal(err)
	}
	return b
}

// receive waits for a value on ch, failing the test when none comes in time.
func receive[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(time.Minute):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

type stepped struct {
	res Result
	err error
}

// goStep runs a step in a goroutine of its own; its outcome comes on the
// channel returned.
func (f *fixture) goStep(ctx context.Context, image string) <-chan stepped {
	ch := make(chan stepped, 1)
	go func() {
		res, err := f.run.Step(ctx, f.src, image)
		ch <- stepped{res, err}
	}()
	return ch
}

// mustReady checks that a step made a ready build and returns it.
func mustReady(t *testing.T, s stepped, what string) store.Build {
	t.Helper()
	if s.err != nil || s.res.Build == nil || s.res.Build.State != store.Ready {
		t.Fatalf("%s: %+v, %v; want a ready build", what, s.res, s.err)
	}
	return *s.res.Build
}

// TestStepNotDue: a step on an image its source finds nothing due for begins
// nothing, makes nothing, and says why the source said.
func TestStepNotDue(t *testing.T) {
	f := newFixture(t)
	f.src.setDue(func(context.Context, string, fakeLook) (Work, error) {
		return NotDue("nothing new since build 7"), nil
	})
	res, err := f.step("debian")
	if err != nil || res.Skipped != "nothing new since build 7" || res.Build != nil {
		t.Fatalf("step: %+v, %v; want skipped as the source said", res, err)
	}
	f.noneBegun("debian", "a step with nothing due")
	if looks := f.src.looksOf("debian"); len(looks) != 1 || looks[0].Seen != nil {
		t.Fatalf("looks: %+v; want one, before the lock", looks)
	}
}

// TestStepCommits: due work is begun, made and committed: the build is ready
// with its file, the commit's changes land with it, and the source is told.
func TestStepCommits(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	res, err := f.step("debian")
	if err != nil || res.Build == nil {
		t.Fatalf("step: %+v, %v; want a build", res, err)
	}
	b := f.only("debian")
	if b.State != store.Ready || b.ID != res.Build.ID || res.Build.State != store.Ready {
		t.Fatalf("store has %+v, the step says %+v; want the one ready build", b, *res.Build)
	}
	file, ok := b.File("qcow2")
	if !ok || !file.Present {
		t.Fatalf("ready build %+v has no present qcow2 file", b)
	}
	data, err := os.ReadFile(mustPath(f.st.FilePath("debian", b.ID, "qcow2")))
	if err != nil || string(data) != b.Name()+" qcow2" {
		t.Fatalf("the build's file reads %q, %v", data, err)
	}
	if sha, _ := store.ReadSidecar(mustPath(f.st.FilePath("debian", b.ID, "qcow2")) + ".sha256"); sha != file.SHA256 {
		t.Fatalf("sha256 sidecar %q, record %q", sha, file.SHA256)
	}

	commits := f.src.committed()
	if len(commits) != 1 || commits[0].ID != b.ID || commits[0].ID == "" {
		t.Fatalf("Commit was called with %+v; want once, with build %s", commits, b.ID)
	}
	if _, ok := commits[0].File("qcow2"); !ok {
		t.Fatalf("Commit was called with %+v, without the file the build was made with", commits[0])
	}
	cur, err := f.st.Cursor(ctx, "debian")
	if err != nil || cur.Outcome != "ready" || cur.Build != b.ID {
		t.Fatalf("cursor %+v, %v; want the commit's change, naming %s", cur, err, b.ID)
	}
	if a := f.src.abortedBuilds(); len(a) != 0 {
		t.Fatalf("a committed build was aborted: %+v", a)
	}
	ends := f.src.ended()
	if len(ends) != 1 || !ends[0].Recorded || ends[0].Err != nil || ends[0].Build.ID != b.ID || ends[0].Build.State != store.Ready {
		t.Fatalf("Done was told %+v; want recorded, the ready build %s", ends, b.ID)
	}
	if looks := f.src.looksOf("debian"); len(looks) != 2 || looks[0].Locked() || !looks[1].Locked() {
		t.Fatalf("looks: %+v; want one before the lock and one under it", looks)
	}
}

// TestMakeFails: a build whose Make fails is recorded failed with the error as
// its reason, its files go, the abort's changes land with it, and the step's
// error names it.
func TestMakeFails(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	failure := errors.New("disk-image-create exited with status 1")
	var half string
	f.src.setMake(func(ctx context.Context, w *store.BuildWriter) error {
		if err := writeFile(ctx, w, "qcow2"); err != nil {
			return err
		}
		// One made and not added yet: it goes too.
		half = mustPath(w.Temp("raw"))
		if err := os.WriteFile(half, []byte("half"), 0o600); err != nil {
			return err
		}
		return failure
	})
	res, err := f.step("debian")
	b := f.only("debian")
	if !errors.Is(err, failure) || !strings.Contains(err.Error(), b.Name()) || res.Build != nil {
		t.Fatalf("step: %+v, %v; want the failure, naming build %s", res, err, b.Name())
	}
	if b.State != store.Failed || b.Reason != failure.Error() {
		t.Fatalf("build %+v; want failed, with reason %q", b, failure)
	}
	if _, err := os.Stat(half); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the file made and not added left by the abort: %v", err)
	}
	if files := f.filesOn(b); len(files) != 0 {
		t.Fatalf("files of the failed build left: %q", files)
	}
	aborts := f.src.abortedBuilds()
	if len(aborts) != 1 || aborts[0].build.ID != b.ID || !errors.Is(aborts[0].err, failure) {
		t.Fatalf("Abort was called with %+v; want once, with build %s and the failure", aborts, b.ID)
	}
	cur, err := f.st.Cursor(ctx, "debian")
	if err != nil || cur.Outcome != "failed" || cur.Reason != failure.Error() {
		t.Fatalf("cursor %+v, %v; want the abort's change", cur, err)
	}
	if c := f.src.committed(); len(c) != 0 {
		t.Fatalf("a failed build was committed: %+v", c)
	}
	ends := f.src.ended()
	if len(ends) != 1 || !ends[0].Recorded || !errors.Is(ends[0].Err, failure) || ends[0].Build.ID != b.ID || ends[0].Build.State != store.Failed {
		t.Fatalf("Done was told %+v; want recorded, the failed build %s and the failure", ends, b.ID)
	}
}

// TestDueAgainUnderLock: the job the first look found is asked again under
// the image's build lock (Recheck); the second look decides what is made.
func TestDueAgainUnderLock(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	var lockedLook error // what taking the lock gave, under the second look
	second := NotDue("made meanwhile by another builder")
	f.src.setDue(func(ctx context.Context, image string, look fakeLook) (Work, error) {
		if look.Seen == nil {
			w := f.src.work(image, look)
			w.Todo.Maker.(*fakeMaker).tag = "first look"
			return w, nil
		}
		held, err := f.st.TryLock(ctx, store.LockKey{Image: image})
		if err == nil {
			held.Release()
		}
		lockedLook = err
		return second, nil
	})
	res, err := f.step("debian")
	if err != nil || res.Skipped != "made meanwhile by another builder" || res.Build != nil {
		t.Fatalf("step: %+v, %v; want skipped as the second look said", res, err)
	}
	f.noneBegun("debian", "a step whose second look found nothing due")
	looks := f.src.looksOf("debian")
	if len(looks) != 2 || looks[0].Seen != nil || looks[1].Seen == nil || looks[1].Seen.Todo.Maker.(*fakeMaker).tag != "first look" {
		t.Fatalf("looks: %+v; want the second with the first's work", looks)
	}
	if !errors.Is(lockedLook, store.ErrHeld) {
		t.Fatalf("taking the image's lock during the second look: %v; want it held", lockedLook)
	}

	// Other work under the lock: the second look's is what is made.
	f.src.setDue(func(_ context.Context, image string, look fakeLook) (Work, error) {
		w := f.src.work(image, look)
		w.Todo.New.Request = "first"
		if look.Locked() {
			w.Todo.New.Request = "second"
		}
		return w, nil
	})
	res, err = f.step("debian")
	if err != nil || res.Build == nil || res.Build.Request != "second" {
		t.Fatalf("step: %+v, %v; want the second look's build made", res, err)
	}
	if b, err := f.st.Build(ctx, res.Build.ID); err != nil || b.Request != "second" {
		t.Fatalf("recorded build %+v, %v; want the second look's", b, err)
	}
}

// TestBusyImage: one step at a time on an image: another step leaves it at
// once, an operator's request waits for the one on it, then makes its build.
func TestBusyImage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t)
		ctx := context.Background()
		// The step's Make and then BuildNow's block until the test lets them go.
		entered, release := make(chan struct{}), make(chan struct{})
		nowEntered, nowRelease := make(chan struct{}), make(chan struct{})
		f.src.setMake(func(ctx context.Context, w *store.BuildWriter) error {
			if w.Build().Request == "" {
				close(entered)
				<-release
			} else {
				close(nowEntered)
				<-nowRelease
			}
			return writeFile(ctx, w, "qcow2")
		})
		stepDone := f.goStep(ctx, "debian")
		receive(t, entered, "the first step's Make")

		res, err := f.step("debian")
		if err != nil || res.Skipped == "" || res.Build != nil {
			t.Fatalf("a step on a busy image: %+v, %v; want skipped at once", res, err)
		}
		if looks := f.src.looksOf("debian"); len(looks) != 2 {
			t.Fatalf("looks: %+v; want only the first step's two", looks)
		}
		if !f.run.Busy("debian") {
			t.Fatal("Busy is false while a step is making the image")
		}
		if f.run.Busy("ubuntu") {
			t.Fatal("Busy is true for an image no step is on")
		}

		var allowed atomic.Int32
		type nowed struct {
			b   store.Build
			err error
		}
		nowDone := make(chan nowed, 1)
		go func() {
			b, err := f.run.BuildNow(ctx, f.src, "debian", "req-1", func(context.Context) error {
				allowed.Add(1)
				return nil
			})
			nowDone <- nowed{b, err}
		}()
		synctest.Wait() // every goroutine is blocked: BuildNow has gone as far as it goes
		if n := allowed.Load(); n != 0 || len(f.src.looksOf("debian")) != 2 || len(f.src.madeImages()) != 1 {
			t.Fatalf("BuildNow went on while a step was on the image: allow called %d times, looks %+v, made %q",
				n, f.src.looksOf("debian"), f.src.madeImages())
		}

		close(release)
		b1 := mustReady(t, receive(t, stepDone, "the first step"), "the first step")
		receive(t, nowEntered, "BuildNow's Make")
		if !f.run.Busy("debian") {
			t.Fatal("Busy is false while BuildNow is making the image")
		}
		if res, err := f.step("debian"); err != nil || res.Skipped == "" || len(f.src.madeImages()) != 2 {
			t.Fatalf("a step while BuildNow is on the image: %+v, %v, made %q; want skipped at once", res, err, f.src.madeImages())
		}
		close(nowRelease)
		now := receive(t, nowDone, "BuildNow")
		if now.err != nil || now.b.State != store.Ready || now.b.ID == b1.ID || now.b.Request != "req-1" {
			t.Fatalf("BuildNow: %+v, %v; want a new ready build of request req-1", now.b, now.err)
		}
		if n := allowed.Load(); n != 1 {
			t.Fatalf("allow was called %d times; want once", n)
		}
		if f.run.Busy("debian") {
			t.Fatal("Busy is true once every step is done")
		}
		if bs := f.builds("debian"); len(bs) != 2 {
			t.Fatalf("builds: %+v; want the step's and BuildNow's", bs)
		}
	})
}

// TestPaused: a paused image, by image-pause or in the config, is neither
// looked at by a step nor built on request, and the request says how to
// unpause it.
func TestPaused(t *testing.T) {
	for _, tc := range []struct {
		name, says string
		pause      func(f *fixture, paused bool)
	}{
		{"image-pause", "image-unpause", func(f *fixture, paused bool) {
			if err := f.st.SetPaused(context.Background(), "debian", paused); err != nil {
				f.t.Fatal(err)
			}
		}},
		{"config", "pause: true", func(f *fixture, paused bool) {
			f.cfg.Store(&config.Config{DiskImages: []config.DiskImage{{Name: "debian", Pause: paused}}})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			tc.pause(f, true)
			res, err := f.step("debian")
			if err != nil || res.Skipped != "paused" || res.Build != nil {
				t.Fatalf("step on a paused image: %+v, %v; want skipped, paused", res, err)
			}
			_, err = f.run.BuildNow(context.Background(), f.src, "debian", "", nil)
			if !errors.Is(err, ErrPaused) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("BuildNow on a paused image: %v; want ErrPaused, saying %q", err, tc.says)
			}
			if looks := f.src.looksOf("debian"); len(looks) != 0 {
				t.Fatalf("Due was asked about a paused image: %+v", looks)
			}
			if bs := f.builds("debian"); len(bs) != 0 {
				t.Fatalf("builds of a paused image: %+v", bs)
			}

			tc.pause(f, false)
			mustReady(t, stepOf(f.step("debian")), "a step once unpaused")

			// Paused after the first look (while the step waits for a
			// slot, say): nothing is begun under the lock.
			f.src.setDue(func(_ context.Context, image string, look fakeLook) (Work, error) {
				if !look.Locked() {
					tc.pause(f, true)
				}
				return f.src.work(image, look), nil
			})
			res, err = f.step("debian")
			if err != nil || res.Skipped != "paused" || res.Build != nil {
				t.Fatalf("step on an image paused after its first look: %+v, %v; want skipped, paused", res, err)
			}
			if bs := f.builds("debian"); len(bs) != 1 {
				t.Fatalf("an image paused after its first look was built: %+v", bs)
			}
		})
	}
}

func stepOf(res Result, err error) stepped { return stepped{res, err} }

// TestLockHeldElsewhere: while another holder has the image's build lock, a
// step leaves the image to it without an error, and a request is refused.
func TestLockHeldElsewhere(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	held, err := f.st.TryLock(ctx, store.LockKey{Image: "debian"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := f.step("debian")
	if err != nil || res.Build != nil || !strings.Contains(res.Skipped, "another builder holds the image's build lock") {
		t.Fatalf("step while the lock is held: %+v, %v; want skipped without an error", res, err)
	}
	if looks := f.src.looksOf("debian"); len(looks) != 1 {
		t.Fatalf("looks: %+v; want the one before the lock only", looks)
	}
	_, err = f.run.BuildNow(ctx, f.src, "debian", "req-1", nil)
	if !errors.Is(err, store.ErrHeld) {
		t.Fatalf("BuildNow while the lock is held: %v; want ErrHeld", err)
	}
	if bs := f.builds("debian"); len(bs) != 0 {
		t.Fatalf("builds begun while another held the lock: %+v", bs)
	}
	if made := f.src.madeImages(); len(made) != 0 {
		t.Fatalf("made %q while another held the lock", made)
	}

	held.Release()
	mustReady(t, stepOf(f.step("debian")), "a step once the lock is released")
}

// TestNoSpaceBacksOff: a Make that runs out of space holds the image's work
// back for a minute, then twice as long after another; a success ends it.
func TestNoSpaceBacksOff(t *testing.T) {
	f := newFixture(t)
	var full atomic.Bool
	full.Store(true)
	f.src.setMake(func(ctx context.Context, w *store.BuildWriter) error {
		if full.Load() {
			return fmt.Errorf("convert to raw: %w", diskspace.ErrNoSpace)
		}
		return writeFile(ctx, w, "qcow2")
	})
	looks := func() int { return len(f.src.looksOf("debian")) }

	_, err := f.step("debian")
	if !errors.Is(err, diskspace.ErrNoSpace) || !strings.Contains(err.Error(), "waits 1m0s") {
		t.Fatalf("step that ran out of space: %v; want ErrNoSpace, saying it waits 1m0s", err)
	}
	before := looks()
	f.clock.Add(time.Minute - time.Second)
	res, err := f.step("debian")
	if err != nil || !strings.Contains(res.Skipped, "too little free space") {
		t.Fatalf("step during the wait: %+v, %v; want skipped, too little free space", res, err)
	}
	if looks() != before {
		t.Fatal("Due was asked during the wait for free space")
	}

	f.clock.Add(time.Second)
	if _, err := f.step("debian"); !strings.Contains(fmt.Sprint(err), "waits 2m0s") {
		t.Fatalf("second step that ran out of space: %v; want it to wait 2m0s", err)
	}
	if looks() == before {
		t.Fatal("Due was not asked once the wait was over")
	}

	f.clock.Add(2 * time.Minute)
	full.Store(false)
	mustReady(t, stepOf(f.step("debian")), "a step with room")
	full.Store(true)
	if _, err := f.step("debian"); !strings.Contains(fmt.Sprint(err), "waits 1m0s") {
		t.Fatalf("a step that ran out of space after a success: %v; want the wait back at 1m0s", err)
	}
}

// TestSlots: work that takes a build slot waits for one; work that takes none
// is not held back, and a step waiting for a slot ends with its context.
func TestSlots(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t)
		ctx := context.Background()
		slots := make(chan struct{}, 1)
		f.newRunner(slots)
		f.src.setDue(func(_ context.Context, image string, look fakeLook) (Work, error) {
			w := f.src.work(image, look)
			w.Todo.Slot = image != "c"
			return w, nil
		})
		entered, release := make(chan struct{}), make(chan struct{})
		f.src.setMake(func(ctx context.Context, w *store.BuildWriter) error {
			if w.Build().Image == "a" {
				close(entered)
				<-release
			}
			return writeFile(ctx, w, "qcow2")
		})

		aDone := f.goStep(ctx, "a")
		receive(t, entered, "a's Make")
		bDone := f.goStep(ctx, "b")
		synctest.Wait()
		if looks := f.src.looksOf("b"); len(looks) != 1 {
			t.Fatalf("looks of b while a holds the slot: %+v; want the one before the slot", looks)
		}
		if bs := f.builds("b"); len(bs) != 0 {
			t.Fatalf("b began %+v while a held the only slot", bs)
		}

		mustReady(t, stepOf(f.step("c")), "c, which takes no slot, while a holds it")

		dctx, cancel := context.WithCancel(ctx)
		dDone := f.goStep(dctx, "d")
		synctest.Wait()
		cancel()
		d := receive(t, dDone, "d, cancelled while it waits for a slot")
		if !errors.Is(d.err, context.Canceled) || !strings.Contains(d.err.Error(), "waiting for a build worker") {
			t.Fatalf("d cancelled while it waits: %+v, %v; want an error waiting for a build worker", d.res, d.err)
		}
		if bs := f.builds("d"); len(bs) != 0 {
			t.Fatalf("d began %+v though cancelled while it waited", bs)
		}

		close(release)
		mustReady(t, receive(t, aDone, "a"), "a")
		mustReady(t, receive(t, bDone, "b"), "b, once a was done")
		if made := f.src.madeImages(); !slices.Equal(made, []string{"a", "c", "b"}) {
			t.Fatalf("made %q; want a, then c beside it, then b once a was done", made)
		}
		if len(slots) != 0 {
			t.Fatalf("%d slots still taken once every step is done", len(slots))
		}
	})
}

// TestBuildNow: an operator's request is answered with a build that is there when
// the source says so, refused when allow refuses it, and names itself to Due.
func TestBuildNow(t *testing.T) {
	t.Run("have", func(t *testing.T) {
		f := newFixture(t)
		have := f.readyBuild("debian")
		f.src.setDue(func(_ context.Context, image string, look fakeLook) (Work, error) {
			if !look.Asked {
				return NotDue("not asked"), nil
			}
			return Answer(have), nil
		})
		got, err := f.run.BuildNow(context.Background(), f.src, "debian", "req-7", nil)
		if err != nil || got.ID != have.ID {
			t.Fatalf("BuildNow: %+v, %v; want the build that is there, %s", got, err, have.ID)
		}
		if bs := f.builds("debian"); len(bs) != 1 {
			t.Fatalf("builds: %+v; want only the one that was there", bs)
		}
		if made := f.src.madeImages(); len(made) != 0 {
			t.Fatalf("made %q to answer with a build that is there", made)
		}
		looks := f.src.looksOf("debian")
		if len(looks) != 1 || !looks[0].Asked || looks[0].Request != "req-7" {
			t.Fatalf("looks: %+v; want one, asked by req-7", looks)
		}
	})
	t.Run("refused", func(t *testing.T) {
		f := newFixture(t)
		refusal := errors.New("debian has a build in progress elsewhere")
		_, err := f.run.BuildNow(context.Background(), f.src, "debian", "req-7", func(context.Context) error { return refusal })
		if !errors.Is(err, refusal) {
			t.Fatalf("BuildNow refused by allow: %v; want the refusal", err)
		}
		if looks := f.src.looksOf("debian"); len(looks) != 0 {
			t.Fatalf("Due was asked about a refused request: %+v", looks)
		}
		if bs := f.builds("debian"); len(bs) != 0 {
			t.Fatalf("builds of a refused request: %+v", bs)
		}
	})
	t.Run("new", func(t *testing.T) {
		f := newFixture(t)
		f.src.setDue(func(_ context.Context, image string, look fakeLook) (Work, error) {
			if !look.Asked {
				return NotDue("not asked"), nil
			}
			return f.src.work(image, look), nil
		})
		got, err := f.run.BuildNow(context.Background(), f.src, "debian", "req-8", nil)
		if err != nil || got.State != store.Ready || got.Request != "req-8" {
			t.Fatalf("BuildNow: %+v, %v; want a ready build of req-8", got, err)
		}
		if b := f.only("debian"); b.ID != got.ID || b.Request != "req-8" {
			t.Fatalf("recorded %+v; want build %s of req-8", b, got.ID)
		}
		looks := f.src.looksOf("debian")
		if len(looks) != 2 {
			t.Fatalf("looks: %+v; want two", looks)
		}
		for _, l := range looks {
			if !l.Asked || l.Request != "req-8" {
				t.Fatalf("looks: %+v; want each asked by req-8", looks)
			}
		}
	})
}

// TestInto: work that adds files to a ready build records them in it; nothing
// is begun, committed or aborted.
func TestInto(t *testing.T) {
	f := newFixture(t)
	have := f.readyBuild("debian")
	f.src.setDue(func(_ context.Context, image string, look fakeLook) (Work, error) {
		w := f.src.work(image, look)
		b := have
		w.Todo.Into = &b
		return w, nil
	})
	f.src.setMake(func(ctx context.Context, w *store.BuildWriter) error {
		if w.Build().ID != have.ID {
			return fmt.Errorf("writer of build %s, want %s", w.Build().ID, have.ID)
		}
		return writeFile(ctx, w, "raw")
	})
	res, err := f.step("debian")
	if err != nil || res.Build == nil || res.Build.ID != have.ID {
		t.Fatalf("step: %+v, %v; want build %s", res, err, have.ID)
	}
	b := f.only("debian")
	raw, ok := b.File("raw")
	if b.State != store.Ready || !ok || !raw.Present || !slices.Equal(b.Formats(), []string{"qcow2", "raw"}) {
		t.Fatalf("recorded %+v; want ready, with qcow2 and a present raw file", b)
	}
	if _, err := os.Stat(mustPath(f.st.FilePath("debian", b.ID, "raw"))); err != nil {
		t.Fatalf("the added file: %v", err)
	}
	if c, a := f.src.committed(), f.src.abortedBuilds(); len(c) != 0 || len(a) != 0 {
		t.Fatalf("files added to a ready build: Commit called with %+v, Abort with %+v; want neither", c, a)
	}
	ends := f.src.ended()
	if len(ends) != 1 || !ends[0].Recorded || ends[0].Err != nil || ends[0].Build.ID != have.ID {
		t.Fatalf("Done was told %+v; want recorded, build %s", ends, have.ID)
	}
	if _, ok := ends[0].Build.File("raw"); !ok {
		t.Fatalf("Done was told of build %+v, without the file added", ends[0].Build)
	}
}

// TestIntoFailureKeepsFilesAdded: work on a ready build that fails after it
// added a file still records that file, and the step returns the failure.
func TestIntoFailureKeepsFilesAdded(t *testing.T) {
	f := newFixture(t)
	have := f.readyBuild("debian")
	f.src.setDue(func(_ context.Context, image string, look fakeLook) (Work, error) {
		w := f.src.work(image, look)
		b := have
		w.Todo.Into = &b
		return w, nil
	})
	failure := errors.New("download artifact \"vhd\": server returned 503")
	f.src.setMake(func(ctx context.Context, w *store.BuildWriter) error {
		if err := writeFile(ctx, w, "raw"); err != nil {
			return err
		}
		return failure
	})
	if _, err := f.step("debian"); !errors.Is(err, failure) {
		t.Fatalf("step: %v; want the failure", err)
	}
	b := f.only("debian")
	if b.State != store.Ready || !b.StateTime.Equal(have.StateTime) || !slices.Equal(b.Formats(), []string{"qcow2", "raw"}) {
		t.Fatalf("recorded %+v; want ready as it was, with the raw file added before the failure", b)
	}
}

// TestAbortUnwritten: when Make fails and the failure cannot be written (the
// record changed meanwhile), the build is not recorded failed: its files stay,
// and the source is told that the outcome was not recorded, so that it keeps
// what recovery needs (a build request, the build's log).
func TestAbortUnwritten(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	failure := errors.New("disk-image-create exited with status 1")
	f.src.setMake(func(ctx context.Context, w *store.BuildWriter) error {
		if err := writeFile(ctx, w, "qcow2"); err != nil {
			return err
		}
		// Another writer moves the record on: the abort's write conflicts.
		other := w.Build()
		if err := f.raw.SetBuildState(ctx, &other, store.Building, "touched"); err != nil {
			return err
		}
		return failure
	})
	_, err := f.step("debian")
	b := f.only("debian")
	if !errors.Is(err, failure) || !errors.Is(err, store.ErrConflict) || !strings.Contains(err.Error(), b.Name()) {
		t.Fatalf("step: %v; want the failure and the conflict, naming %s", err, b.Name())
	}
	if b.State != store.Building || b.Reason != "touched" {
		t.Fatalf("build %+v; want left as the other writer wrote it", b)
	}
	if files := f.filesOn(b); len(files) != 3 {
		t.Fatalf("files of a build whose failure was not written: %q; want them left", files)
	}
	if cur, err := f.st.Cursor(ctx, "debian"); err != nil || cur.Outcome != "" {
		t.Fatalf("cursor %+v, %v; want the abort's change not written", cur, err)
	}
	ends := f.src.ended()
	if len(ends) != 1 || ends[0].Recorded || !errors.Is(ends[0].Err, failure) || ends[0].Build.State != store.Building {
		t.Fatalf("Done was told %+v; want not recorded, the build building, with the failure", ends)
	}
}
