package builder

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/gearman"
	"github.com/nodepool-builder/nodepool-builder/internal/ratelimit"
	"github.com/nodepool-builder/nodepool-builder/internal/redact"
	"github.com/nodepool-builder/nodepool-builder/source"
	"github.com/nodepool-builder/nodepool-builder/status"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/uploader"
	"github.com/nodepool-builder/nodepool-builder/zuulmqtt"
)

// The gearman functions a builder serves (docs/operation.md, Gearman jobs), each
// followed by its argument: an image name or a build id.
const (
	FnBuild  = config.GearmanBuild + ":"
	FnUpload = config.GearmanUpload + ":"
	FnDelete = config.GearmanDelete + ":"
)

// kindOf is the kind of a function name, as builder.gearman-functions names
// it: "image-build" for "image-build:debian"; "" when it is none of ours.
func kindOf(function string) string {
	for _, prefix := range []string{FnBuild, FnUpload, FnDelete} {
		if strings.HasPrefix(function, prefix) {
			return strings.TrimSuffix(prefix, ":")
		}
	}
	return ""
}

// wellFormed tells whether a function name is one of the builders' functions
// with an argument it could carry: an image name as the config allows one, or
// a build id. Only such names are registered, and only such names' unserved
// jobs are judged: the others are left to whoever serves them.
func wellFormed(function string) bool {
	switch kind, arg, _ := strings.Cut(function, ":"); kind + ":" {
	case FnBuild:
		return arg != "" && arg != "." && arg != ".." && len(function) <= 512 && utf8.ValidString(arg) &&
			!strings.ContainsFunc(arg, func(r rune) bool { return r == '/' || unicode.IsSpace(r) || unicode.IsControl(r) })
	case FnUpload, FnDelete:
		return validBuildID.MatchString(arg)
	}
	return false
}

var (
	// validBuildID is what a build id in a function name may be: nodepool's
	// uuid hex, or an older nodepool's sequence number.
	validBuildID = regexp.MustCompile(`^[0-9A-Za-z][0-9A-Za-z_-]{0,63}$`)
	// validRequest is what an image-build request id may be.
	validRequest = regexp.MustCompile(`^[0-9A-Za-z][0-9A-Za-z._:-]{0,127}$`)
)

// deleteTimeout bounds an image-delete job's wait for its build to be gone.
const deleteTimeout = 15 * time.Minute

// deletedBuild is a build an image-delete job deleted: its delete function
// stays for deletedGrace, so that the same job handed out again (its
// connection was lost before the answer) is answered at once.
type deletedBuild struct {
	name string
	at   time.Time
}

// deletedGrace is how long a deleted build's delete function stays registered.
const deletedGrace = time.Hour

// gearmanMaxJobs bounds the jobs a builder takes at once.
const gearmanMaxJobs = 32

// recentJobs is how many of the jobs served the status keeps.
const recentJobs = 20

// gearmanService serves the builder's gearman functions: it keeps the worker's
// functions in step with the images and builds, and answers each job through
// the same steps the daemon takes.
type gearmanService struct {
	b    *Builder
	w    *gearman.Worker
	log  *slog.Logger
	wake chan struct{} // look at the functions now

	flights flights
	polls   *zuulPolls

	mu       sync.Mutex
	deleted  map[string]deletedBuild   // builds image-delete deleted, by id
	recent   []status.GearmanJob       // newest last
	progress map[string][]*gearman.Job // by upload key: jobs told how the upload goes
	changed  chan struct{}             // the status changed: write it
	file     *status.File
}

func newGearmanService(b *Builder) *gearmanService {
	cfg := b.cur.Load().cfg
	g := &gearmanService{
		b:        b,
		log:      b.log.With("part", "gearman"),
		wake:     make(chan struct{}, 1),
		progress: map[string][]*gearman.Job{},
		changed:  make(chan struct{}, 1),
		deleted:  map[string]deletedBuild{},
	}
	g.polls = newZuulPolls(g.log)
	g.file = status.NewFile(b.store, status.GearmanPart, g.log)
	var servers []gearman.Server
	for _, s := range cfg.Builder.GearmanServers {
		servers = append(servers, gearman.Server{Host: s.Host, Port: s.Port})
	}
	host, _ := os.Hostname()
	g.w = gearman.New(gearman.Options{
		Servers:  servers,
		ClientID: "nodepool-builder:" + host,
		Handler:  g.handle,
		Logger:   g.log,
		// The builder bounds the work itself (build-workers, upload-workers):
		// a job waiting for a build holds up no delete.
		MaxJobs:           gearmanMaxJobs,
		Unserved:          g.unserved,
		UnservedAfter:     cfg.Builder.GearmanUnservedAfter,
		UnservedCandidate: wellFormed,
		OnJob:             g.served,
	})
	return g
}

// run serves until ctx ends, then waits for the jobs under way.
func (g *gearmanService) run(ctx context.Context) {
	g.setFunctions(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := g.w.Run(ctx); err != nil {
			g.log.Error("gearman worker stopped", "error", err)
		}
	})
	wg.Go(func() {
		g.b.every(ctx, g.b.opts.Intervals.Plan, g.wake, "gearman functions", func(ctx context.Context) error {
			return g.setFunctions(ctx)
		})
	})
	wg.Go(func() { g.writeStatus(ctx) })
	wg.Wait()
	g.saveStatus(false)
}

// refresh asks for the functions to be looked at now: a build was made or deleted.
func (g *gearmanService) refresh() {
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// functions lists what this builder can do now: build each image of its
// config, and upload or delete each of its builds whose files are here.
func (g *gearmanService) functions(ctx context.Context) ([]string, error) {
	p := g.b.cur.Load()
	var out []string
	for _, src := range p.sources {
		for image := range src.Images() {
			out = append(out, FnBuild+image)
		}
	}
	out = slices.DeleteFunc(out, func(fn string) bool { return !g.carries(fn) })
	builds, err := g.b.store.Builds(ctx, store.BuildFilter{})
	if err != nil {
		return nil, err
	}
	for _, bd := range builds {
		if bd.BuilderID != g.b.store.BuilderID() {
			continue
		}
		if !g.carries(FnDelete + bd.ID) {
			continue
		}
		switch bd.State {
		case store.Ready:
			out = append(out, FnUpload+bd.ID, FnDelete+bd.ID)
		case store.Deleting:
			out = append(out, FnDelete+bd.ID)
		}
	}
	g.mu.Lock()
	for id, d := range g.deleted {
		if time.Since(d.at) > deletedGrace {
			delete(g.deleted, id)
			continue
		}
		out = append(out, FnDelete+id)
	}
	g.mu.Unlock()
	// The kinds the operator left out of builder.gearman-functions are never
	// registered: gearmand hands none of their jobs to this builder.
	served := p.cfg.Builder
	out = slices.DeleteFunc(out, func(fn string) bool { return !served.ServesGearman(kindOf(fn)) })
	slices.Sort(out)
	return slices.Compact(out), nil
}

// carries tells whether a function name is well formed, and logs the name
// refused: an id read from the state could otherwise hold a tab or a newline,
// and break gearmand's admin status for every builder that uses it.
func (g *gearmanService) carries(function string) bool {
	if wellFormed(function) {
		return true
	}
	g.log.Error("a name from the config or the state cannot make a gearman function; it is not registered",
		"function", limit(function))
	return false
}

func (g *gearmanService) setFunctions(ctx context.Context) error {
	fns, err := g.functions(ctx)
	if err != nil {
		return fmt.Errorf("list the gearman functions: %w", err)
	}
	g.w.SetFunctions(fns)
	return nil
}

// handle answers one job. An answer ends with a newline, as a command's output
// does: the gearman command prints it as it is, and the progress lines after it.
func (g *gearmanService) handle(ctx context.Context, j *gearman.Job) ([]byte, error) {
	var res string
	var err error
	kind := kindOf(j.Function)
	switch {
	case kind != "" && !g.b.cur.Load().cfg.Builder.ServesGearman(kind):
		// Left out of the config after the job was handed out.
		err = fmt.Errorf("this builder does not take %s jobs (builder.gearman-functions)", kind)
	case strings.HasPrefix(j.Function, FnBuild):
		res, err = g.build(ctx, j, strings.TrimPrefix(j.Function, FnBuild))
	case strings.HasPrefix(j.Function, FnUpload):
		res, err = g.upload(ctx, j, strings.TrimPrefix(j.Function, FnUpload))
	case strings.HasPrefix(j.Function, FnDelete):
		res, err = g.delete(ctx, strings.TrimPrefix(j.Function, FnDelete))
	default:
		err = fmt.Errorf("%s is not a function of this builder", quote(j.Function))
	}
	if err != nil {
		// The answer goes to gearmand, in clear, to whoever asked.
		return nil, redact.UserinfoError(err)
	}
	return []byte(res + "\n"), nil
}

// build answers image-build:<image>: the id of a ready build made now. The
// job's data, else its gearman unique id, names the request: the same request
// again returns the build it made, at once.
func (g *gearmanService) build(ctx context.Context, j *gearman.Job, image string) (string, error) {
	var src source.Source
	for _, s := range g.b.cur.Load().sources {
		if _, ok := s.Images()[image]; ok {
			src = s
		}
	}
	if src == nil {
		return "", fmt.Errorf("%s is not an image of this builder's config", quote(image))
	}
	request := strings.TrimSpace(string(j.Data))
	if request != "" && !validRequest.MatchString(request) {
		return "", fmt.Errorf("malformed request id %s: use letters, digits and . _ : - (at most 128)", quote(request))
	}
	if request == "" && validRequest.MatchString(j.Unique) {
		request = j.Unique
	}
	key := ""
	if request != "" {
		key = "build/" + image + "/" + request
	}
	return g.flights.do(key, func() (string, error) {
		if request != "" {
			if id, done, err := g.requested(ctx, image, request); done {
				return id, err
			}
		}
		if g.b.cur.Load().cfg.ZuulImage(image) != nil {
			return g.polls.share(ctx, image, func(started func()) (string, error) {
				return g.answer(g.b.buildNow(ctx, src, image, request, func(context.Context) error {
					started()
					return nil
				}))
			})
		}
		return g.answer(g.b.buildNow(ctx, src, image, request, func(ctx context.Context) error {
			return g.tooSoon(ctx, image)
		}))
	})
}

// answer is what an image-build job answers for the outcome of a build asked for.
func (g *gearmanService) answer(built store.Build, err error) (string, error) {
	if built.State == store.Ready {
		if err != nil {
			g.log.Warn("build is ready, with a failure after it", "build", built.Name(), "error", err)
		}
		return built.ID, nil
	}
	return "", err
}

// tooSoon refuses an image-build job for a diskimage whose newest ready build
// is younger than builder.gearman-min-build-interval: jobs in a row would
// otherwise each make a build, and keep-builds would rotate the good ones out
// as fast as anyone who reaches gearmand asks. A zuul-image's job is not
// bounded so: it makes a build only of the Zuul build that the poller fetches
// within its poll-interval anyway, and its polls are bounded by zuulPolls.
func (g *gearmanService) tooSoon(ctx context.Context, image string) error {
	cfg := g.b.cur.Load().cfg
	interval := cfg.Builder.GearmanMinBuildInterval
	if interval <= 0 || cfg.DiskImage(image) == nil {
		return nil
	}
	builds, err := g.b.store.Builds(ctx, store.BuildFilter{Image: image, State: store.Ready})
	if err != nil {
		return fmt.Errorf("image-build %s: %w", image, err)
	}
	newest := store.NewestReady(builds, image)
	if newest == nil {
		return nil
	}
	age := g.b.store.Now().Sub(newest.StateTime)
	if age >= interval {
		return nil
	}
	return fmt.Errorf("image-build %s refused: its newest ready build %s is %s old, younger than builder.gearman-min-build-interval (%s); "+
		"ask again after %s, or request a build on the builder's host with image-build",
		image, newest.Name(), max(age, 0).Round(time.Second), interval, newest.StateTime.Add(interval).UTC().Format(time.RFC3339))
}

// requested looks for the build a request made before; done says it found one
// that answers the request.
func (g *gearmanService) requested(ctx context.Context, image, request string) (string, bool, error) {
	builds, err := g.b.store.Builds(ctx, store.BuildFilter{Image: image})
	if err != nil {
		return "", true, err
	}
	for _, bd := range builds {
		if bd.Request != request {
			continue
		}
		switch bd.State {
		case store.Ready:
			return bd.ID, true, nil
		case store.Failed:
			return "", true, fmt.Errorf("build %s, made for request %s, failed: %s", bd.Name(), request, bd.Reason)
		case store.Building:
			if bd.BuilderID != g.b.store.BuilderID() {
				return "", true, fmt.Errorf("build %s, made for request %s, is being built by the builder on %s", bd.Name(), request, bd.Hostname)
			}
		}
	}
	return "", false, nil
}

// upload answers image-upload:<build_id> with a provider name as data: the
// cloud image id of the build's ready upload there, made now unless it exists.
func (g *gearmanService) upload(ctx context.Context, j *gearman.Job, id string) (string, error) {
	provider := strings.TrimSpace(string(j.Data))
	if provider == "" {
		return "", fmt.Errorf("image-upload needs a provider name as its data, e.g. gearman -f %s%s <provider>", FnUpload, id)
	}
	cfg := g.b.cur.Load().cfg
	prov := cfg.Provider(provider)
	if prov == nil {
		var names []string
		for _, p := range cfg.Providers {
			names = append(names, p.Name)
		}
		return "", fmt.Errorf("unknown provider %s; this builder's providers are: %s", quote(provider), strings.Join(names, ", "))
	}
	return g.flights.do("upload/"+id+"/"+provider, func() (string, error) {
		st := g.b.store
		bd, err := g.ownBuild(ctx, id)
		if err != nil {
			return "", err
		}
		if bd.State != store.Ready {
			return "", fmt.Errorf("build %s is %s, not ready", bd.Name(), bd.State)
		}
		pi := prov.Entry(bd.Image)
		if pi == nil {
			return "", fmt.Errorf("provider %s does not take image %s: it is not in the provider's diskimages", provider, bd.Image)
		}
		if pi.Pause {
			return "", fmt.Errorf("provider %s is paused for image %s (pause: true in its diskimages)", provider, bd.Image)
		}
		format := prov.Format()
		if f, ok := bd.File(format); !ok || !g.b.cur.Load().uploader.Uploadable(provider, f) {
			return "", fmt.Errorf("build %s has no %s file, which provider %s takes; it has: %s",
				bd.Name(), format, provider, strings.Join(bd.Formats(), ", "))
		}
		job := uploader.Planned{Build: bd, Provider: provider, Format: format, Asked: true}
		g.watch(job.Key(), j)
		defer g.unwatch(job.Key(), j)
		var last error
		// A job of the planner's may be queued or running for the same upload:
		// its outcome comes first; a second round then makes ours.
		for range 3 {
			if ext, state, err := readyUpload(ctx, st, id, provider); err != nil || ext != "" {
				return ext, err
			} else if state == store.Uploading {
				// Another builder, or a worker of this one not in the queue
				// (recovery), is on it: wait for it to settle.
				if err := g.waitSettled(ctx, id, provider); err != nil {
					return "", err
				}
				continue
			}
			done, _ := g.b.queue.addWait(job)
			select {
			case o := <-done:
				if o.err == nil && o.upload.State == store.Ready {
					return o.upload.ExternalID, nil
				}
				if o.err != nil && !errors.Is(o.err, uploader.ErrDropped) {
					return "", o.err
				}
				last = o.err
			case <-ctx.Done():
				return "", ctx.Err()
			}
		}
		if last == nil {
			last = errors.New("no ready upload came of it")
		}
		return "", fmt.Errorf("upload %s to %s: %w", bd.Name(), provider, last)
	})
}

// readyUpload returns the cloud image id of a build's ready upload to a
// provider, if it has one, and otherwise whether one is uploading.
func readyUpload(ctx context.Context, st *store.Store, buildID, provider string) (string, store.State, error) {
	ups, err := st.Uploads(ctx, store.UploadFilter{BuildID: buildID, Provider: provider})
	if err != nil {
		return "", "", err
	}
	var state store.State
	for _, up := range ups {
		switch up.State {
		case store.Ready:
			return up.ExternalID, store.Ready, nil
		case store.Uploading:
			state = store.Uploading
		}
	}
	return "", state, nil
}

// waitSettled waits until no upload of a build to a provider is uploading.
func (g *gearmanService) waitSettled(ctx context.Context, buildID, provider string) error {
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		_, state, err := readyUpload(ctx, g.b.store, buildID, provider)
		if err != nil || state != store.Uploading {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// delete answers image-delete:<build_id>: the build's uploads, files and
// records are deleted through the lifecycle; the answer is the build's name.
func (g *gearmanService) delete(ctx context.Context, id string) (string, error) {
	return g.flights.do("delete/"+id, func() (string, error) {
		st := g.b.store
		g.mu.Lock()
		d, done := g.deleted[id]
		g.mu.Unlock()
		if done {
			return d.name, nil
		}
		bd, err := g.ownBuild(ctx, id)
		if err != nil {
			return "", err
		}
		if bd.State != store.Deleting {
			if _, err := st.ReleaseBuild(ctx, id, "deleted by a gearman image-delete job"); err != nil {
				if errors.Is(err, store.ErrInProgress) {
					return "", fmt.Errorf("%w; ask again when it is done", err)
				}
				return "", err
			}
			g.log.Info("build released by a gearman job", "build", bd.Name())
		}
		ctx, cancel := context.WithTimeout(ctx, deleteTimeout)
		defer cancel()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			err := g.b.cur.Load().uploader.Delete(ctx)
			_, gone := st.Build(ctx, id)
			if errors.Is(gone, store.ErrNotFound) {
				g.mu.Lock()
				g.deleted[id] = deletedBuild{name: bd.Name(), at: time.Now()}
				g.mu.Unlock()
				g.refresh()
				return bd.Name(), nil
			}
			if err != nil {
				return "", fmt.Errorf("build %s is marked deleting and the builder keeps trying: %w", bd.Name(), err)
			}
			// Another step holds a lock of the build or an upload of it.
			select {
			case <-ctx.Done():
				return "", fmt.Errorf("build %s is marked deleting, but is not gone yet: %w", bd.Name(), ctx.Err())
			case <-t.C:
			}
		}
	})
}

// ownBuild reads a build whose files must be on this host.
func (g *gearmanService) ownBuild(ctx context.Context, id string) (store.Build, error) {
	st := g.b.store
	bd, err := st.Build(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return bd, fmt.Errorf("no build %s is known: it was deleted, or never made", id)
	}
	if err != nil {
		return bd, err
	}
	if bd.BuilderID != st.BuilderID() {
		return bd, fmt.Errorf("build %s was made by the builder on %s: its files are there, not here", bd.Name(), bd.Hostname)
	}
	return bd, nil
}

// unserved tells the worker which jobs nobody serves are bad input, and why:
// those of the builders' functions, for images no builder makes and builds
// that do not exist, or exist where no builder serves them. The worker asks
// only about well-formed names, a bounded number at a time.
func (g *gearmanService) unserved(function string) (string, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	none := "no builder connected to this gearman server serves " + quote(function) + ": "
	if kind := kindOf(function); kind != "" && !g.b.cur.Load().cfg.Builder.ServesGearman(kind) {
		// Answered, so that the client does not wait forever, without saying
		// whether the image or build exists.
		return none + "the builder answering does not take " + kind + " jobs (builder.gearman-functions)", true
	}
	switch {
	case strings.HasPrefix(function, FnBuild):
		image := strings.TrimPrefix(function, FnBuild)
		for _, src := range g.b.cur.Load().sources {
			if _, ok := src.Images()[image]; ok {
				return "", false // ours: it is served as soon as it is registered
			}
		}
		return none + quote(image) + " is not an image any of them builds", true
	case strings.HasPrefix(function, FnUpload), strings.HasPrefix(function, FnDelete):
		_, id, _ := strings.Cut(function, ":")
		bd, err := g.b.store.Build(ctx, id)
		if errors.Is(err, store.ErrNotFound) {
			return none + "no build " + id + " is known here: it was deleted, or never made, or its builder is not connected", true
		}
		if err != nil {
			return "", false
		}
		if bd.BuilderID == g.b.store.BuilderID() && (bd.State == store.Ready || bd.State == store.Deleting) {
			return "", false // ours: it is served as soon as it is registered
		}
		if bd.State != store.Ready && bd.State != store.Deleting {
			return none + "build " + bd.Name() + " is " + string(bd.State), true
		}
		return none + "build " + bd.Name() + " is on the builder on " + bd.Hostname + ", which is not connected", true
	}
	return "", false
}

// watch has an upload's progress told to a job.
func (g *gearmanService) watch(key string, j *gearman.Job) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.progress[key] = append(g.progress[key], j)
}

func (g *gearmanService) unwatch(key string, j *gearman.Job) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.progress[key] = slices.DeleteFunc(g.progress[key], func(x *gearman.Job) bool { return x == j })
	if len(g.progress[key]) == 0 {
		delete(g.progress, key)
	}
}

// uploadProgress tells the jobs waiting for an upload how far its data has gone.
func (g *gearmanService) uploadProgress(j uploader.Planned, sent, total int64) {
	g.mu.Lock()
	jobs := slices.Clone(g.progress[j.Key()])
	g.mu.Unlock()
	for _, gj := range jobs {
		gj.Status(uint64(max(sent, 0)), uint64(max(total, 0)))
	}
}

// served logs a job answered and keeps it for the status.
func (g *gearmanService) served(r gearman.JobResult) {
	took := r.Ended.Sub(r.Started).Round(time.Millisecond)
	rec := status.GearmanJob{Server: r.Server, Function: quoteLimit(r.Function), Started: r.Started, Ended: r.Ended,
		Delivered: r.Delivered, Result: strings.TrimSpace(string(r.Result))}
	if r.Err != nil {
		rec.Error = r.Err.Error()
	}
	switch {
	case r.Err != nil:
		g.log.Warn("gearman job failed", "function", rec.Function, "handle", r.Handle, "unique", r.Unique,
			"server", r.Server, "duration", took, "error", rec.Error)
	default:
		g.log.Info("gearman job done", "function", rec.Function, "handle", r.Handle, "unique", r.Unique,
			"server", r.Server, "duration", took, "result", rec.Result)
	}
	if !r.Delivered {
		g.log.Warn("the gearman job's connection was lost before its answer; its outcome is in the state, and the same job asked again returns it",
			"function", rec.Function, "handle", r.Handle, "unique", r.Unique, "server", r.Server)
	}
	g.mu.Lock()
	g.recent = append(g.recent, rec)
	if len(g.recent) > recentJobs {
		g.recent = g.recent[len(g.recent)-recentJobs:]
	}
	g.mu.Unlock()
	select {
	case g.changed <- struct{}{}:
	default:
	}
}

// quote quotes a name that came in a job, bounded, for messages and logs.
func quote(s string) string { return fmt.Sprintf("%q", limit(s)) }

// quoteLimit keeps a function name as it is when it is printable, else quotes it.
func quoteLimit(s string) string {
	for _, r := range s {
		if r < 0x21 || r > 0x7e {
			return quote(s)
		}
	}
	return limit(s)
}

func limit(s string) string {
	const most = 200
	if len(s) > most {
		return s[:most] + "..."
	}
	return s
}

// flights runs one call per key at a time: a caller with a key that is under
// way waits for it and shares its outcome.
type flights struct {
	mu sync.Mutex
	m  map[string]*flight
}

type flight struct {
	done   chan struct{}
	joined int // callers waiting on it besides the first
	res    string
	err    error
}

func (f *flights) do(key string, fn func() (string, error)) (string, error) {
	if key == "" {
		return fn()
	}
	f.mu.Lock()
	if fl, ok := f.m[key]; ok {
		fl.joined++
		f.mu.Unlock()
		<-fl.done
		return fl.res, fl.err
	}
	if f.m == nil {
		f.m = map[string]*flight{}
	}
	fl := &flight{done: make(chan struct{})}
	f.m[key] = fl
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.m, key)
		f.mu.Unlock()
		close(fl.done)
	}()
	fl.res, fl.err = fn()
	return fl.res, fl.err
}

// zuulPolls are the polls of Zuul that image-build jobs of zuul-images make,
// bounded as MQTT reports are: whoever reaches gearmand could otherwise have
// the builder poll Zuul once per job. The jobs of an image that come before
// its poll starts share that poll's answer; the polls they start are spaced
// by a limiter, as hints are. A job whose poll the limiter holds waits for it
// (at most one interval, or until its context ends), so that, as
// docs/operation.md's Gearman jobs has it, its answer is a build of Zuul's newest build as a
// poll made after the job came sees it, never an older answer.
type zuulPolls struct {
	log *slog.Logger

	mu      sync.Mutex
	limiter *ratelimit.Limiter
	pending map[string]*zuulPoll // by zuul-image: the poll not started yet, which jobs join
}

type zuulPoll struct {
	allowed chan struct{} // closed when the limiter lets it start
	open    bool          // allowed is not closed yet
	done    chan struct{} // closed when id and err are set
	id      string
	err     error
}

func newZuulPolls(log *slog.Logger) *zuulPolls {
	return &zuulPolls{log: log, limiter: ratelimit.New(zuulmqtt.DefaultHintBurst, zuulmqtt.DefaultHintInterval),
		pending: map[string]*zuulPoll{}}
}

// share answers a job of image with the poll that the jobs of image coming now
// share: the first of them runs poll, once the limiter allows, and poll calls
// started when the poll begins (its image is free), after which jobs start
// another.
func (z *zuulPolls) share(ctx context.Context, image string, poll func(started func()) (string, error)) (string, error) {
	z.mu.Lock()
	p, joined := z.pending[image]
	if !joined {
		p = &zuulPoll{allowed: make(chan struct{}), open: true, done: make(chan struct{})}
		z.pending[image] = p
		if z.limiter.Allow(image, time.Now()) {
			z.allow(p)
		}
	}
	z.mu.Unlock()
	if joined {
		select {
		case <-p.done:
			return p.id, p.err
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	started := func() {
		z.mu.Lock()
		defer z.mu.Unlock()
		if z.pending[image] == p {
			delete(z.pending, image)
		}
	}
	// Jobs of one worker share its context: the ones that joined end with it too.
	defer close(p.done)
	defer started()
	if p.err = z.wait(ctx, image, p); p.err != nil {
		return "", p.err
	}
	p.id, p.err = poll(started)
	return p.id, p.err
}

// wait waits until the limiter lets p, the pending poll of image, start.
func (z *zuulPolls) wait(ctx context.Context, image string, p *zuulPoll) error {
	logged := false
	for {
		z.mu.Lock()
		// The other images' held polls are let go here too: whoever asks
		// the limiter hands out what it releases.
		images, next := z.limiter.Release(time.Now())
		for _, img := range images {
			if q := z.pending[img]; q != nil {
				z.allow(q)
			}
		}
		z.mu.Unlock()
		// No next: nothing is held, so p was let go just now.
		timer := time.NewTimer(time.Hour)
		timer.Stop()
		if !next.IsZero() {
			if !logged {
				z.log.Info("image-build jobs of a zuul-image polled Zuul just now; the next poll waits for the bound, and these jobs with it",
					"image", image, "until", next.UTC().Format(time.RFC3339))
				logged = true
			}
			timer.Reset(time.Until(next))
		}
		select {
		case <-p.allowed:
			timer.Stop()
			return nil
		case <-ctx.Done():
			timer.Stop()
			return fmt.Errorf("image-build %s: waiting to poll Zuul: %w", image, ctx.Err())
		case <-timer.C:
		}
	}
}

// allow lets a pending poll start; z.mu is held.
func (z *zuulPolls) allow(p *zuulPoll) {
	if p.open {
		p.open = false
		close(p.allowed)
	}
}

// current is the service's status now.
func (g *gearmanService) current(serving bool) status.Gearman {
	ws := g.w.Status()
	s := status.Gearman{Stamp: status.Stamp{PID: os.Getpid()}, Serving: serving,
		Functions: len(ws.Functions), Served: ws.Served, Failed: ws.Failed}
	for _, srv := range ws.Servers {
		s.Servers = append(s.Servers, status.GearmanServer{Address: srv.Address, Connected: srv.Connected && serving,
			Since: srv.Since, LastError: srv.LastError, Registered: srv.Registered})
	}
	for _, r := range ws.Running {
		s.Running = append(s.Running, status.GearmanJob{Server: r.Server, Function: quoteLimit(r.Function), Started: r.Started})
	}
	g.mu.Lock()
	s.Recent = append([]status.GearmanJob(nil), g.recent...)
	g.mu.Unlock()
	return s
}

// writeStatus keeps the status file fresh until ctx ends: at once when a job
// ends, else when what it says changed.
func (g *gearmanService) writeStatus(ctx context.Context) {
	g.file.Keep(ctx, g.changed, func() status.Stamped {
		s := g.current(true)
		return &s
	})
}

// saveStatus writes the status once.
func (g *gearmanService) saveStatus(serving bool) {
	s := g.current(serving)
	g.file.Save(&s)
}
