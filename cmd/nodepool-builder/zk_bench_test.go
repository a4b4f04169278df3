package main

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
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/builder"
	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/state"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/store/storetest"
	"github.com/nodepool-builder/nodepool-builder/store/zookeeper/zktest"
	"github.com/nodepool-builder/nodepool-builder/zuulapi/zuultest"
)

// zkFleet is the installation BenchmarkZooKeeperNoOp runs: zuul-images, each
// listed by every provider, and builders sharing one ZooKeeper over TLS.
type zkFleet struct {
	images, providers, builders int
	z                           *testenv.ZooKeeper
	zuul                        *zuultest.Server
	glance                      *testenv.Glance
	chroot                      string
	dirs, configs               []string // per builder: its directory and nodepool.yaml
	// Per builder: a proxy that counts its requests, and a nodepool.yaml like
	// its own that reaches ZooKeeper through it, for the runs that count reads
	// (the timed ones go straight to ZooKeeper).
	wires   []*testenv.ZooKeeperCounter
	counted []string
}

func (f *zkFleet) image(i int) string    { return fmt.Sprintf("img-%03d", i) }
func (f *zkFleet) provider(p int) string { return fmt.Sprintf("cloud-%02d", p) }

// writeConfigs writes each builder's nodepool.yaml: the same images, providers
// and ZooKeeper, its own images-dir; and its twin through a counting proxy.
func (f *zkFleet) writeConfigs(tb testing.TB, root string) {
	tb.Helper()
	for n := range f.builders {
		dir := filepath.Join(root, fmt.Sprintf("builder-%d", n))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			tb.Fatal(err)
		}
		var cfg strings.Builder
		cfg.WriteString("zuul-images:\n")
		for i := range f.images {
			fmt.Fprintf(&cfg, "  - name: %s\n    api-url: %s\n    tenant: example\n    project: org/images\n    job: build-%s\n",
				f.image(i), f.zuul.URL(), f.image(i))
		}
		cfg.WriteString("providers:\n")
		for p := range f.providers {
			fmt.Fprintf(&cfg, "  - name: %s\n    cloud: %s\n    image-format: qcow2\n    diskimages:\n", f.provider(p), f.glance.Cloud)
			for i := range f.images {
				fmt.Fprintf(&cfg, "      - name: %s\n", f.image(i))
			}
		}
		top := fmt.Sprintf("images-dir: %s\n", filepath.Join(dir, "images"))
		wire := testenv.NewZooKeeperCounter(tb, f.z)
		path, counted := filepath.Join(dir, "nodepool.yaml"), filepath.Join(dir, "nodepool-counted.yaml")
		for file, zk := range map[string]string{path: zkKeys(f.z, f.chroot), counted: zkKeysAt(f.z, wire.Addr, f.chroot)} {
			if err := os.WriteFile(file, []byte(top+zk+cfg.String()), 0o644); err != nil {
				tb.Fatal(err)
			}
		}
		f.dirs = append(f.dirs, dir)
		f.configs = append(f.configs, path)
		f.wires = append(f.wires, wire)
		f.counted = append(f.counted, counted)
	}
}

// populate records, for every image, a ready build of Zuul's newest build in
// the first builder's images-dir, its poll cursor, and a ready upload to every
// provider: a steady fleet. It writes through the store, as the builder does,
// images in parallel, one writer per image (each upload changes its build);
// raw is st's backend, for the records no step of the builder writes so.
func (f *zkFleet) populate(ctx context.Context, st *store.Store, raw storetest.Raw) error {
	builds := make([]zuultest.Build, f.images)
	for i := range f.images {
		zb, err := f.zuul.AddBuild(zuultest.BuildSpec{Job: "build-" + f.image(i)})
		if err != nil {
			return err
		}
		builds[i] = zb
	}
	next := make(chan int)
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for i := range next {
				if err := f.populateImage(ctx, st, raw, f.image(i), builds[i]); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	for i := range f.images {
		next <- i
	}
	close(next)
	wg.Wait()
	return errors.Join(errs...)
}

func (f *zkFleet) populateImage(ctx context.Context, st *store.Store, raw storetest.Raw, image string, zb zuultest.Build) error {
	bd, err := st.CreateBuild(ctx, store.Build{Image: image, Source: store.SourceZuul,
		Zuul: store.ZuulRef{UUID: zb.UUID, ID: zb.ID}})
	if err != nil {
		return err
	}
	if err := os.WriteFile(mustPath(st.FilePath(image, bd.ID, "qcow2")), []byte(image), 0o644); err != nil {
		return err
	}
	bd.SetFile(store.File{Format: "qcow2", Size: int64(len(image)), Present: true})
	bd.SetState(store.Ready, st.Now())
	cur := store.Cursor{Image: image, ZuulID: zb.ID, ZuulUUID: zb.UUID, Outcome: "ready", Time: st.Now()}
	if err := raw.Write(ctx, store.PutBuild(&bd), store.PutCursor(cur)); err != nil {
		return err
	}
	for p := range f.providers {
		up, err := st.CreateUpload(ctx, &bd, f.provider(p), "qcow2")
		if err != nil {
			return err
		}
		up.SetState(store.Ready, st.Now())
		up.ExternalID, up.ExternalName = "ext-"+up.ID, image
		if err := raw.Write(ctx, store.PutUpload(&up)); err != nil {
			return err
		}
	}
	return nil
}

// openBuilder opens the state of a builder's config and the builder over it,
// as the command does.
func openBuilder(ctx context.Context, path string, log *slog.Logger, iv builder.Intervals) (*builder.Builder, *store.Store, error) {
	cfg, err := config.Load(config.Files{Nodepool: path})
	if err != nil {
		return nil, nil, err
	}
	st, err := state.Open(ctx, cfg, state.Options{Access: store.Create, Logger: log, Register: true, Version: "bench"})
	if err != nil {
		return nil, nil, err
	}
	b, err := builder.New(ctx, builder.Options{Config: cfg, Store: st, Logger: log, Intervals: iv,
		Read: func() (*config.Snapshot, error) { return config.Read(config.Files{Nodepool: path}) }})
	if err != nil {
		st.Close()
		return nil, nil, err
	}
	return b, st, nil
}

// onceNoOp is a --once of a builder's config: its state opened (reading the
// tree), every step once, the state closed.
func onceNoOp(ctx context.Context, path string, log *slog.Logger) error {
	b, st, err := openBuilder(ctx, path, log, builder.Intervals{})
	if err != nil {
		return err
	}
	defer st.Close()
	if err := b.Once(ctx); err != nil {
		return fmt.Errorf("--once: %w", err)
	}
	return nil
}

// onceReads is onceNoOp of builder n through its counting proxy: the znodes
// it read.
func (f *zkFleet) onceReads(ctx context.Context, n int, log *slog.Logger) (int64, error) {
	before := f.wires[n].Reads()
	err := onceNoOp(ctx, f.counted[n], log)
	return f.wires[n].Reads() - before, err
}

// BenchmarkZooKeeperNoOp is the ZooKeeper mode at the scale of a large
// installation: 500 zuul-images × 20 providers, each image with a ready build
// uploaded everywhere, three builders sharing one ZooKeeper over TLS. Its
// floor is one client reading the whole tree once (full-read-ns, full-read-znodes).
//
// ns/op and once-znodes are a --once with nothing to do: the state opened,
// which reads the tree, and every step once; once-x-full-read is its time
// against the floor, the median of each --once against the full read made
// just before it. Then the three builders run as daemons at once, and
// pass-ns and pass-znodes are a steady-state pass of one of them (its planning
// of uploads and its lifecycle: recovery, retention, deletes, tidy-up), the
// slowest of several, and the znodes it read per pass.
func BenchmarkZooKeeperNoOp(b *testing.B) {
	ctx := context.Background()
	f := &zkFleet{images: 500, providers: 20, builders: 3, chroot: "/nodepool-bench"}
	f.z = testenv.NewZooKeeper(b, testenv.ZooKeeperOptions{TLS: true})
	f.glance = testenv.NewGlance(b)
	b.Setenv("OS_CLIENT_CONFIG_FILE", f.glance.CloudsFile)
	f.zuul = zuultest.NewServer(zuultest.ServerOptions{Tenant: "example"})
	b.Cleanup(f.zuul.Close)
	f.writeConfigs(b, b.TempDir())
	log := slog.New(slog.DiscardHandler)

	// Each builder's first --once makes its images-dir, while the state is
	// empty.
	for _, path := range f.configs {
		if err := onceNoOp(ctx, path, log); err != nil {
			b.Fatal(err)
		}
	}
	start := time.Now()
	cfg, err := config.Load(config.Files{Nodepool: f.configs[0]})
	if err != nil {
		b.Fatal(err)
	}
	zb, err := state.OpenZooKeeper(ctx, cfg.ZooKeeper, state.Options{Access: store.Create, Logger: log})
	if err != nil {
		b.Fatal(err)
	}
	writer, raw := storetest.Open(b, store.Options{ImagesDir: cfg.ImagesDir, Access: store.Create, Logger: log, Backend: zb})
	if err := f.populate(ctx, writer, raw); err != nil {
		b.Fatal(err)
	}
	writer.Close()
	populated := time.Since(start)

	// Each builder's first --once after populating may settle what a steady
	// fleet settles once (files uploaded everywhere are dropped).
	for _, path := range f.configs {
		if err := onceNoOp(ctx, path, log); err != nil {
			b.Fatal(err)
		}
	}

	// Each --once is timed right after a full read: on a shared machine the
	// two then meet the same load, and the ratio of each pair is what counts.
	full := zktest.NewFullRead(b, f.z, f.chroot)
	b.Logf("%d images × %d providers populated in %s", f.images, f.providers, populated.Round(time.Millisecond))
	var onceReads, fullZnodes int64
	var fullTimes, ratios []float64
	for b.Loop() {
		b.StopTimer()
		start := time.Now()
		before := full.Requests.Load()
		if err := full.Read(); err != nil {
			b.Fatal(err)
		}
		fullTime := time.Since(start)
		fullZnodes = full.Requests.Load() - before
		b.StartTimer()
		start = time.Now()
		if err := onceNoOp(ctx, f.configs[1], log); err != nil {
			b.Fatal(err)
		}
		once := time.Since(start)
		b.StopTimer()
		reads, err := f.onceReads(ctx, 1, log)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		onceReads += reads
		fullTimes = append(fullTimes, float64(fullTime.Nanoseconds()))
		ratios = append(ratios, float64(once)/float64(fullTime))
		b.Logf("full read %s (%d znodes), --once %s (%d znodes): %.2fx", fullTime.Round(time.Millisecond), fullZnodes,
			once.Round(time.Millisecond), reads, float64(once)/float64(fullTime))
	}

	passTime, passReads := f.daemonPasses(b, log)

	b.ReportMetric(float64(onceReads)/float64(b.N), "once-znodes")
	b.ReportMetric(median(fullTimes), "full-read-ns")
	b.ReportMetric(float64(fullZnodes), "full-read-znodes")
	b.ReportMetric(median(ratios), "once-x-full-read")
	b.ReportMetric(float64(passTime.Nanoseconds()), "pass-ns")
	b.ReportMetric(passReads, "pass-znodes")
	b.ReportMetric(float64(populated.Nanoseconds()), "populate-ns")
}

// median is the middle of xs (of the two in the middle, their mean).
func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// daemonPasses runs every builder as a daemon at once, waits until each has
// made two passes of planning and of its lifecycle, then watches passes of
// the first: it returns the slowest of them and the znodes it read per pass.
func (f *zkFleet) daemonPasses(b *testing.B, log *slog.Logger) (time.Duration, float64) {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	iv := builder.Intervals{Plan: time.Second, Cleanup: time.Second}
	var daemons []*builder.Builder
	for n, path := range f.configs {
		if n == 0 {
			path = f.counted[0] // the daemon whose passes are watched
		}
		d, st, err := openBuilder(ctx, path, log, iv)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { st.Close() })
		daemons = append(daemons, d)
		wg.Go(func() { d.Run(ctx) })
	}
	const loopPlan, loopLifecycle = "plan uploads", "lifecycle"
	// passes waits until loop's count of passes of d reaches n, sampling
	// every pass that ends on the way, and returns their durations.
	passes := func(d *builder.Builder, loop string, n int) []time.Duration {
		var took []time.Duration
		last := -1
		deadline := time.Now().Add(5 * time.Minute)
		for {
			p := d.Passes()[loop]
			if p.Count != last && p.Count > 0 && !p.Ended.Before(p.Began) {
				if last >= 0 {
					took = append(took, p.Ended.Sub(p.Began))
				}
				last = p.Count
			}
			if p.Count >= n {
				return took
			}
			if time.Now().After(deadline) {
				// Called from a goroutine too: Error, not Fatal.
				b.Errorf("daemon's %s loop made %d passes in 5 minutes, want %d", loop, p.Count, n)
				return took
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	for _, d := range daemons {
		passes(d, loopPlan, 2)
		passes(d, loopLifecycle, 2)
	}
	a, za := daemons[0], f.wires[0]
	const watched = 5
	startCount := a.Passes()[loopLifecycle].Count
	before := za.Reads()
	var took []time.Duration
	var pwg sync.WaitGroup
	var planTook []time.Duration
	pwg.Go(func() { planTook = passes(a, loopPlan, a.Passes()[loopPlan].Count+watched) })
	took = passes(a, loopLifecycle, startCount+watched)
	pwg.Wait()
	if b.Failed() || len(took)+len(planTook) == 0 {
		b.FailNow()
	}
	reads := za.Reads() - before
	slowest := slices.Max(append(slices.Clone(took), planTook...))
	b.Logf("daemon passes: lifecycle %v, plan %v; %d znodes read over %d passes", took, planTook, reads, watched)
	return slowest, float64(reads) / watched
}
