package dib

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/source"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/store/storetest"
)

// errConnection stands for a store that could not be reached.
var errConnection = errors.New("zk: could not connect to a server")

// flakyBackend fails the write that marks a build ready: before it is applied
// (readyFails 1) or after (2, an answer lost on its way back). Its locks can be
// reported lost, as a ZooKeeper session that expired reports them.
type flakyBackend struct {
	store.Backend
	readyFails atomic.Int32
	mu         sync.Mutex
	lost       []chan struct{}
}

func (b *flakyBackend) Write(ctx context.Context, changes ...store.Change) error {
	for _, c := range changes {
		if bd := c.Build(); bd != nil && bd.State == store.Ready {
			switch b.readyFails.Load() {
			case 1:
				return errConnection
			case 2:
				if err := b.Backend.Write(ctx, changes...); err != nil {
					return err
				}
				return errConnection
			case 3:
				return fmt.Errorf("write build: %w", store.ErrConflict)
			}
		}
	}
	return b.Backend.Write(ctx, changes...)
}

func (b *flakyBackend) TryLock(ctx context.Context, key store.LockKey) (store.Held, error) {
	h, err := b.Backend.TryLock(ctx, key)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	ch := make(chan struct{})
	b.lost = append(b.lost, ch)
	return losable{Held: h, lost: ch}, nil
}

// loseLocks reports every lock taken lost.
func (b *flakyBackend) loseLocks() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, ch := range b.lost {
		close(ch)
	}
	b.lost = nil
}

type losable struct {
	store.Held
	lost chan struct{}
}

func (l losable) Lost() <-chan struct{} { return l.lost }

func (f *fixture) flaky() *flakyBackend {
	f.t.Helper()
	fb := &flakyBackend{Backend: f.raw.Backend}
	f.st, f.raw = storetest.Open(f.t, store.Options{ImagesDir: f.images, Now: f.clock.Now, Backend: fb})
	return fb
}

const requested = `
  - name: debian
    dib-cmd: {{DIB}}
    elements: [debian-minimal]
    env-vars:
      FAKE_DIB_RECORD: {{RECORD}}
`

// TestReadyWriteFailedLeavesBuildToRecovery: a build that succeeded but could
// not be recorded ready (the store was unreachable) is not then recorded
// failed, its files stay, and the build request that asked for it stays: the
// builder's recovery settles the record, and only a ready build settles the
// request.
func TestReadyWriteFailedLeavesBuildToRecovery(t *testing.T) {
	f := newFixture(t)
	fb := f.flaky()
	b := f.builder(f.diskimages(requested))
	ctx := context.Background()
	if err := f.st.RequestBuild(ctx, "debian"); err != nil {
		t.Fatal(err)
	}
	fb.readyFails.Store(1)
	_, err := b.Step(ctx, "debian")
	if !errors.Is(err, errConnection) {
		t.Fatalf("step err = %v, want the failed ready write", err)
	}
	bs, _ := f.st.Builds(ctx, store.BuildFilter{Image: "debian"})
	if len(bs) != 1 || bs[0].State != store.Building {
		t.Fatalf("builds = %+v, want the one build still building, for recovery", bs)
	}
	if _, err := os.Stat(mustPath(f.st.FilePath("debian", bs[0].ID, "qcow2"))); err != nil {
		t.Errorf("the build's file was removed though its outcome was never recorded: %v", err)
	}
	if reqs, _ := f.st.BuildRequests(ctx); len(reqs) != 1 {
		t.Errorf("requests = %v, want the request kept until a build for it is ready", reqs)
	}

	// Recovery marks it interrupted; the request makes the next step build.
	rec := bs[0]
	if err := f.raw.SetBuildState(ctx, &rec, store.Failed, source.InterruptedReason); err != nil {
		t.Fatal(err)
	}
	fb.readyFails.Store(0)
	f.clock.Add(time.Minute)
	built, err := b.Step(ctx, "debian")
	if err != nil || built == nil || built.State != store.Ready {
		t.Fatalf("step after recovery = %+v, %v; want a ready build for the request", built, err)
	}
	if reqs, _ := f.st.BuildRequests(ctx); len(reqs) != 0 {
		t.Errorf("requests after the ready build = %v, want none", reqs)
	}
}

// TestReadyWriteAnswerLostSettlesRequestOnce: when the ready write took but its
// answer was lost, the request that asked for the build is settled by that
// build on the next check, not built a second time.
func TestReadyWriteAnswerLostSettlesRequestOnce(t *testing.T) {
	f := newFixture(t)
	fb := f.flaky()
	b := f.builder(f.diskimages(requested))
	ctx := context.Background()
	if err := f.st.RequestBuild(ctx, "debian"); err != nil {
		t.Fatal(err)
	}
	f.clock.Add(time.Second)
	fb.readyFails.Store(2)
	if _, err := b.Step(ctx, "debian"); !errors.Is(err, errConnection) {
		t.Fatalf("step err = %v, want the lost answer", err)
	}
	fb.readyFails.Store(0)
	bs, _ := f.st.Builds(ctx, store.BuildFilter{Image: "debian"})
	if len(bs) != 1 || bs[0].State != store.Ready {
		t.Fatalf("builds = %+v, want the one build ready", bs)
	}
	if _, err := os.Stat(mustPath(f.st.FilePath("debian", bs[0].ID, "qcow2"))); err != nil {
		t.Errorf("the ready build's file was removed: %v", err)
	}
	f.clock.Add(time.Minute)
	built, err := b.Step(ctx, "debian")
	if err != nil || built != nil {
		t.Fatalf("step = %+v, %v; want nothing built: the request's build is ready", built, err)
	}
	if reqs, _ := f.st.BuildRequests(ctx); len(reqs) != 0 {
		t.Errorf("requests = %v, want the request settled by its ready build", reqs)
	}
}

// TestLockLostWritesNothing: a build whose image lock is lost while DIB runs
// is stopped, and nothing more is written for it: not failed, not its files
// removed, not its request cleared. Another builder may hold the lock by then.
func TestLockLostWritesNothing(t *testing.T) {
	f := newFixture(t)
	fb := f.flaky()
	b := f.builder(f.diskimages(strings.Replace(hanging, "build-timeout: 2", "build-timeout: 600", 1)))
	ctx := context.Background()
	if err := f.st.RequestBuild(ctx, "debian"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := b.Step(ctx, "debian")
		done <- err
	}()
	f.waitRecorded()
	before, _ := f.st.Builds(ctx, store.BuildFilter{Image: "debian"})
	fb.loseLocks()
	var err error
	select {
	case err = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the build did not stop when its lock was lost")
	}
	if !errors.Is(err, store.ErrLockLost) {
		t.Errorf("step err = %v, want the lost lock", err)
	}
	rec := f.recorded()
	for _, pid := range []int{rec.pid, rec.child} {
		if processRunning(pid) {
			t.Errorf("process %d survived the lost lock", pid)
		}
	}
	bs, _ := f.st.Builds(ctx, store.BuildFilter{Image: "debian"})
	if len(bs) != 1 || len(before) != 1 || bs[0].State != store.Building || bs[0].ID != before[0].ID {
		t.Errorf("builds = %+v, want the build as it was before the lock went (%+v)", bs, before)
	}
	if reqs, _ := f.st.BuildRequests(ctx); len(reqs) != 1 {
		t.Errorf("requests = %v, want the request kept", reqs)
	}
}

// TestReadyWriteConflictFailsTheBuild: a ready write refused because the record
// changed meanwhile surely did not take: the build is recorded failed and its
// files go, as any failed build's.
func TestReadyWriteConflictFailsTheBuild(t *testing.T) {
	f := newFixture(t)
	fb := f.flaky()
	b := f.builder(f.diskimages(requested))
	ctx := context.Background()
	fb.readyFails.Store(3)
	if _, err := b.Step(ctx, "debian"); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("step err = %v, want the conflict", err)
	}
	bs, _ := f.st.Builds(ctx, store.BuildFilter{Image: "debian"})
	if len(bs) != 1 || bs[0].State != store.Failed {
		t.Fatalf("builds = %+v, want the build failed", bs)
	}
	if _, err := os.Stat(mustPath(f.st.FilePath("debian", bs[0].ID, "qcow2"))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the failed build's file is still there: %v", err)
	}
}

// staleRequests is a state whose listing of build requests lags: it still
// shows a request another builder has cleared, as a ZooKeeper cache may when
// this builder takes the image's lock just after the other let it go.
type staleRequests struct {
	store.Backend
	stale map[string]time.Time
}

func (s staleRequests) BuildRequests(context.Context) (map[string]time.Time, error) {
	return s.stale, nil
}

func (s staleRequests) BuildRequest(ctx context.Context, image string) (time.Time, bool, error) {
	reqs, err := s.Backend.BuildRequests(ctx)
	at, ok := reqs[image]
	return at, ok, err
}

// TestRequestClearedMeanwhileIsNotBuilt: a request that a lagging listing
// still shows, but that the state no longer holds once the image's lock is
// taken, is not built again.
func TestRequestClearedMeanwhileIsNotBuilt(t *testing.T) {
	f := newFixture(t)
	b := f.builder(f.diskimages(requested))
	ctx := context.Background()
	first := f.build(ctx, b, "debian")
	f.clock.Add(time.Minute)
	f.st, f.raw = storetest.Open(t, store.Options{ImagesDir: f.images, Now: f.clock.Now,
		Backend: staleRequests{Backend: f.raw.Backend, stale: map[string]time.Time{"debian": f.clock.Now()}}})
	b = f.builder(f.diskimages(requested))
	f.clock.Add(time.Minute)
	built, err := b.Step(ctx, "debian")
	if err != nil || built != nil {
		t.Fatalf("step = %+v, %v; want nothing built: the request is gone", built, err)
	}
	if bs, _ := f.st.Builds(ctx, store.BuildFilter{Image: "debian"}); len(bs) != 1 || bs[0].ID != first.ID {
		t.Errorf("builds = %+v, want only the first", bs)
	}
}
