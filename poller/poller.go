// Package poller turns new Zuul image builds into store builds: it asks the Zuul
// builds API for the newest successful build of each zuul-image's job and fetches
// the formats the providers need.
package poller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/nodepool-builder/nodepool-builder/artifacts"
	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/internal/diskspace"
	"github.com/nodepool-builder/nodepool-builder/internal/hostpattern"
	"github.com/nodepool-builder/nodepool-builder/internal/redact"
	"github.com/nodepool-builder/nodepool-builder/internal/untrusted"
	"github.com/nodepool-builder/nodepool-builder/metrics"
	"github.com/nodepool-builder/nodepool-builder/qemuimg"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/zuulapi"
)

// Builds is the part of the Zuul API the poller needs.
type Builds interface {
	Builds(ctx context.Context, q zuulapi.Query) ([]zuulapi.Build, error)
}

// Options configure a Poller.
type Options struct {
	Store  *store.Store
	Config *config.Config
	// Fetchers and Clients hold, by image name, each zuul-image's downloader (its
	// HTTP client trusts the image's ca-cert) and its Zuul client.
	Fetchers map[string]*artifacts.Fetcher
	Clients  map[string]Builds
	Logger   *slog.Logger
	// QemuImg is the qemu-img binary that checks every fetched image and converts
	// a published format into a needed one; empty means "qemu-img" from PATH.
	QemuImg string
	// Backoff holds the images whose fetch waits after running out of disk
	// space; it outlives a Poller, so that a reload does not forget it. Nil:
	// one of the Poller's own.
	Backoff *Backoff
	Now     func() time.Time // default time.Now
	// Metrics is told of polls and downloads; nil: nobody is.
	Metrics *metrics.Metrics
}

// Poller ingests Zuul-built images into the store.
type Poller struct {
	opts Options
	log  *slog.Logger
}

// New returns a Poller.
func New(opts Options) *Poller {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.QemuImg == "" {
		opts.QemuImg = "qemu-img"
	}
	if opts.Backoff == nil {
		opts.Backoff = NewBackoff()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Poller{opts: opts, log: opts.Logger}
}

// Images lists the zuul-images of the config, each with its poll interval.
func (p *Poller) Images() map[string]time.Duration {
	out := map[string]time.Duration{}
	for _, zi := range p.opts.Config.ZuulImages {
		every := zi.PollInterval
		if every <= 0 {
			every = p.opts.Config.Builder.PollInterval
		}
		out[zi.Name] = every
	}
	return out
}

// Step polls one zuul-image and returns the build it made ready, if any.
func (p *Poller) Step(ctx context.Context, image string) (*store.Build, error) {
	out, err := p.Poll(ctx, image)
	if out.Skipped != "" {
		p.log.Debug("nothing fetched", "image", image, "reason", out.Skipped)
	}
	return out.Ingested, err
}

// Abandon settles nothing for a Zuul build a stopped builder left: its download
// stopped with it, and the partial files stay to be resumed.
func (p *Poller) Abandon(context.Context, store.Build) error { return nil }

// noNewBuild begins Outcome.Skipped when Zuul's newest build is the one settled.
const noNewBuild = "no new Zuul build"

// Outcome says what one poll did.
type Outcome struct {
	Image    string
	Ingested *store.Build // the build made ready, if any
	Skipped  string       // why nothing was done, if nothing was
}

// ErrRefused marks a Zuul build that was looked at and refused for good (a needed
// format is missing, a checksum does not match); it is not fetched again.
var ErrRefused = errors.New("zuul build refused")

// Poll is one poll of one zuul-image: when Zuul has a successful build newer than
// the last one settled, its needed formats are fetched into a new ready build.
// When the newest build is the one already ingested but lacks a format that is now
// needed (a provider was added), that format is fetched into it.
func (p *Poller) Poll(ctx context.Context, image string) (Outcome, error) {
	return p.poll(ctx, image, "")
}

// BuildNow polls a zuul-image now, as an operator's request (a gearman job)
// asks, and returns the build of Zuul's newest successful build: fetched now
// (request is recorded on it), or the one fetched before. It fails, saying
// why, when there is none to return.
func (p *Poller) BuildNow(ctx context.Context, image, request string) (store.Build, error) {
	out, err := p.poll(ctx, image, request)
	if err != nil {
		return store.Build{}, err
	}
	if out.Ingested != nil {
		return *out.Ingested, nil
	}
	if !strings.HasPrefix(out.Skipped, noNewBuild) {
		return store.Build{}, fmt.Errorf("fetch %s: %s", image, out.Skipped)
	}
	cur, err := p.opts.Store.Cursor(ctx, image)
	if err != nil {
		return store.Build{}, err
	}
	if cur.Outcome != "ready" {
		return store.Build{}, fmt.Errorf("fetch %s: Zuul's newest build %s was refused: %s", image, cur.ZuulUUID, cur.Reason)
	}
	builds, err := p.opts.Store.Builds(ctx, store.BuildFilter{Image: image, State: store.Ready})
	if err != nil {
		return store.Build{}, err
	}
	for _, b := range builds {
		if b.Zuul.UUID == cur.ZuulUUID {
			return b, nil
		}
	}
	return store.Build{}, fmt.Errorf("fetch %s: Zuul's newest build %s was fetched, but its build is no longer ready", image, cur.ZuulUUID)
}

func (p *Poller) poll(ctx context.Context, image, request string) (Outcome, error) {
	out := Outcome{Image: image}
	zi := p.opts.Config.ZuulImage(image)
	if zi == nil {
		return out, fmt.Errorf("poll %s: not a zuul-image", image)
	}
	paused, err := p.opts.Store.Paused(ctx)
	if err != nil {
		return out, err
	}
	if _, ok := paused[image]; ok || zi.Pause {
		out.Skipped = "paused"
		return out, nil
	}
	needed := p.opts.Config.NeededFormats(image)
	if len(needed) == 0 {
		out.Skipped = "no provider lists it and it has no formats"
		return out, nil
	}
	if until := p.opts.Backoff.until(image); p.opts.Now().Before(until) {
		out.Skipped = "images-dir had too little free space; next try after " + until.Format(time.RFC3339)
		return out, nil
	}
	client, ok := p.opts.Clients[image]
	if !ok {
		return out, fmt.Errorf("poll %s: no Zuul client", image)
	}
	q := zuulapi.Query{
		Project:   zi.Project,
		Branch:    zi.Branch,
		JobName:   zi.Job,
		Pipelines: zi.Pipelines,
		Result:    "SUCCESS",
		Complete:  true,
		Limit:     1,
		Final:     true,
	}
	if !zi.AllowUnmergedChanges {
		// Builds of changes are passed over: look a little further back for the
		// newest build of merged code.
		q.Limit = mergedWindow
	}
	zbs, err := client.Builds(ctx, q)
	if err != nil {
		p.opts.Metrics.Failed(metrics.StepPoll, err)
		return out, fmt.Errorf("poll %s: ask Zuul for builds of %s: %w", image, zi.Job, err)
	}
	p.opts.Metrics.Polled(image)
	zbs = p.answers(image, q, zbs)
	if len(zbs) == 0 {
		out.Skipped = "Zuul has no successful build of job " + zi.Job
		return out, nil
	}
	zb, ok := p.newestAllowed(zi, zbs)
	if !ok {
		out.Skipped = fmt.Sprintf("Zuul's newest %d successful builds of job %s are all of unmerged changes; "+
			"set pipelines to those that run on merged code (periodic, post), or allow-unmerged-changes", len(zbs), zi.Job)
		return out, nil
	}
	cur, err := p.opts.Store.Cursor(ctx, image)
	if err != nil {
		return out, err
	}
	if judge(cur, zb) != newer {
		ready, err := p.opts.Store.Builds(ctx, store.BuildFilter{Image: zi.Name, State: store.Ready})
		if err != nil {
			return out, err
		}
		if !due(cur, zb, ready) && !marks(cur, zb) && !p.lacks(ready, zb, needed) {
			return p.settled(ctx, out, zi, zb, cur, needed, ready) // nothing to fetch: it says why
		}
	}
	// The image's build lock: one builder fetches a Zuul build, the others
	// find it settled when they get the lock.
	held, err := p.opts.Store.TryLock(ctx, store.LockKey{Image: image})
	if errors.Is(err, store.ErrHeld) {
		out.Skipped = "another builder holds the image's build lock"
		p.log.Info("another builder holds the image's build lock; it fetches the build", "image", image, "zuul_build", zb.UUID)
		return out, nil
	}
	if err != nil {
		return out, fmt.Errorf("poll %s: %w", image, err)
	}
	defer held.Release()
	ctx, cancel := store.UnderLock(ctx, held)
	defer cancel()
	if cur, err = p.opts.Store.Cursor(ctx, image); err != nil {
		return out, err
	}
	ready, err := p.opts.Store.Builds(ctx, store.BuildFilter{Image: zi.Name, State: store.Ready})
	if err != nil {
		return out, err
	}
	again := due(cur, zb, ready)
	if again {
		if again, err = p.gone(ctx, cur); err != nil {
			return out, err
		}
	}
	if v := judge(cur, zb); v == newer || again {
		switch {
		case v != newer:
			p.log.Info("the zuul-image has no ready build: fetching Zuul's newest build again", "image", image,
				"zuul_build", zb.UUID, "zuul_id", zb.ID)
		case zb.ID < cur.ZuulID:
			// Once: the cursor moves to this build.
			p.log.Warn("Zuul's ids went back: its newest build's id is below the poll cursor's, but it ended later, so it is "+
				"fetched; Zuul's database was rebuilt, or the cursor came from a hostile answer", "image", image,
				"zuul_build", zb.UUID, "zuul_id", zb.ID, "cursor_build", cur.ZuulUUID, "cursor_id", cur.ZuulID)
		}
		var b store.Build
		if b, err = p.ingest(ctx, zi, zb, needed, request); err == nil {
			out.Ingested = &b
		}
	} else {
		if marks(cur, zb) {
			if err = p.markBehind(ctx, cur, zb); err != nil {
				return out, err
			}
		}
		out, err = p.settled(ctx, out, zi, zb, cur, needed, ready)
	}
	if errors.Is(err, diskspace.ErrNoSpace) {
		wait := p.opts.Backoff.fail(image, p.opts.Now())
		err = fmt.Errorf("%w; fetching %s waits %s before it tries again: free space in the images-dir", err, image, wait)
	} else if err == nil {
		p.opts.Backoff.clear(image)
	}
	return out, err
}

// verdict is what a poll makes of Zuul's newest build against the cursor.
type verdict int

const (
	// settled: the cursor's build, or one that is not newer than it.
	settled verdict = iota
	// newer: a build to fetch.
	newer
	// behind: not newer, and its id not above the cursor's either, though it
	// is another build: Zuul's ids restarted (its database was rebuilt or
	// restored) or the cursor came from a hostile answer.
	behind
)

// judge tells whether zb, Zuul's newest build, is new to the cursor. It is
// when there is no cursor, when its id is above the cursor's, or when it is
// another build than the cursor's that ended later: Zuul's ids alone are not
// trusted, as a database rebuilt starts them again and one hostile answer may
// push the cursor to any id. A cursor recorded without an end time is
// compared by when it was recorded.
func judge(cur store.Cursor, zb zuulapi.Build) verdict {
	switch {
	case cur.ZuulID == 0 && cur.ZuulUUID == "":
		return newer
	case zb.UUID == cur.ZuulUUID:
		return settled
	case zb.ID > cur.ZuulID:
		return newer
	}
	since := cur.ZuulEndTime
	if since.IsZero() {
		since = cur.Time
	}
	if !zb.EndTime.IsZero() && zb.EndTime.After(since) {
		return newer
	}
	return behind
}

// due tells whether Zuul's newest build zb is to be fetched again though the
// cursor has settled it: the zuul-image has no ready build left (all were
// deleted), as a diskimage with none is built. A build refused for good is not
// fetched again.
func due(cur store.Cursor, zb zuulapi.Build, ready []store.Build) bool {
	refused := cur.ZuulUUID == zb.UUID && cur.Outcome == string(store.Failed)
	return len(ready) == 0 && !refused
}

// gone tells, reading the state itself, whether the build the cursor's Zuul
// build became is gone. The ready builds come from a cache, which in ZooKeeper
// may not have seen yet a build another builder made a moment ago, before it
// let go of the image's lock: the cursor, read afresh, names that build. A
// cursor that names none (a refusal, or recorded before builds were named) is
// taken at its word.
func (p *Poller) gone(ctx context.Context, cur store.Cursor) (bool, error) {
	if cur.Build == "" {
		return true, nil
	}
	b, err := p.opts.Store.Build(ctx, cur.Build)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return true, nil
	case err != nil:
		return false, err
	}
	return b.State != store.Ready, nil
}

// marks tells whether the cursor's mark of Zuul being behind it is not what
// Zuul's newest build zb says: it is to be set, moved or cleared.
func marks(cur store.Cursor, zb zuulapi.Build) bool {
	if judge(cur, zb) == behind {
		return cur.BehindID != zb.ID
	}
	return cur.BehindID != 0
}

// markBehind records on the cursor, under the image's build lock, whether
// Zuul's newest build zb is behind it, and logs the change once.
func (p *Poller) markBehind(ctx context.Context, cur store.Cursor, zb zuulapi.Build) error {
	next := cur
	next.BehindID = 0
	if judge(cur, zb) == behind {
		next.BehindID = zb.ID
		p.log.Warn("Zuul's newest build is behind the poll cursor: its id is below the cursor's and it ended no later, "+
			"so it is not fetched; builds that end later are. If Zuul's database was rebuilt or restored, or the cursor "+
			"is wrong, run zuul-cursor-reset for the image", "image", cur.Image, "zuul_build", zb.UUID, "zuul_id", zb.ID,
			"cursor_build", cur.ZuulUUID, "cursor_id", cur.ZuulID)
	} else {
		p.log.Info("Zuul's newest build is no longer behind the poll cursor", "image", cur.Image, "zuul_build", zb.UUID, "zuul_id", zb.ID)
	}
	if err := p.opts.Store.Write(ctx, store.PutCursor(next)); err != nil {
		return fmt.Errorf("poll %s: record that Zuul is behind the poll cursor: %w", cur.Image, err)
	}
	return nil
}

// cursorAt is the cursor that settles zb, at now: its end time no later than
// now, so that a hostile answer's end time far ahead does not hide the builds
// that follow it.
func cursorAt(image string, zb zuulapi.Build, outcome store.State, reason string, now time.Time) store.Cursor {
	end := zb.EndTime
	if end.After(now) {
		end = now
	}
	return store.Cursor{Image: image, ZuulID: zb.ID, ZuulUUID: zb.UUID, ZuulEndTime: end, Outcome: string(outcome),
		Reason: reason, Time: now}
}

// answers keeps the builds Zuul answered that are what q asks for, in Zuul's
// order: its filtering is not relied on. Each build skipped is logged, and why.
func (p *Poller) answers(image string, q zuulapi.Query, zbs []zuulapi.Build) []zuulapi.Build {
	var kept []zuulapi.Build
	for _, zb := range zbs {
		if err := q.Check(zb); err != nil {
			p.log.Warn("skipping a build Zuul answered that is not one asked for", "image", image,
				"zuul_build", zb.UUID, "zuul_id", zb.ID, "reason", err)
			continue
		}
		kept = append(kept, zb)
	}
	return kept
}

// mergedWindow is how many of Zuul's newest successful builds a poll looks at
// for one of merged code.
const mergedWindow = 20

// newestAllowed returns the newest build the zuul-image may fetch: any, with
// allow-unmerged-changes; else the newest that did not run on a change, which
// anyone may propose and nobody has reviewed.
func (p *Poller) newestAllowed(zi *config.ZuulImage, zbs []zuulapi.Build) (zuulapi.Build, bool) {
	for _, zb := range zbs {
		if zi.AllowUnmergedChanges || !unmerged(zb) {
			return zb, true
		}
		p.log.Debug("passing over a Zuul build of an unmerged change", "image", zi.Name, "zuul_build", zb.UUID,
			"pipeline", zb.Pipeline, "change", zb.Ref.Change)
	}
	return zuulapi.Build{}, false
}

// unmerged tells whether a build ran on a change rather than on a branch or tag.
func unmerged(zb zuulapi.Build) bool {
	return zb.Ref.Change != "" && zb.Ref.Change != "0"
}

// ingest fetches a new Zuul build's needed formats into a new store build. The
// build becomes ready and the cursor moves in one write, so a crash leaves either
// a build to settle and fetch again, or both done.
func (p *Poller) ingest(ctx context.Context, zi *config.ZuulImage, zb zuulapi.Build, needed []string, request string) (store.Build, error) {
	st := p.opts.Store
	log := p.log.With("image", zi.Name, "zuul_build", zb.UUID)
	log.Info("new Zuul build", "zuul_id", zb.ID, "end_time", zb.EndTime, "formats", needed)
	w, err := st.BeginBuild(ctx, store.Build{
		Image:   zi.Name,
		Source:  store.SourceZuul,
		Zuul:    store.ZuulRef{UUID: zb.UUID, ID: zb.ID, EndTime: zb.EndTime, LogURL: redact.URL(zb.LogURL)},
		Request: request,
	})
	if err != nil {
		return store.Build{}, err
	}
	err = p.fetch(ctx, zi, zb, w, needed)
	if err == nil {
		cur := cursorAt(zi.Name, zb, store.Ready, "", st.Now())
		cur.Build = w.Build().ID
		var ready store.Build
		if ready, err = w.Commit(ctx, store.PutCursor(cur)); err == nil {
			log.Info("build ready", "build", ready.ID)
			p.prunePartials(zi.Name)
			return ready, nil
		}
	}
	// Failed: nothing of it stays on disk but resumable downloads.
	werr := fmt.Errorf("fetch Zuul build %s of %s: %w", zb.UUID, zi.Name, err)
	var changes []store.Change
	refused := errors.Is(err, ErrRefused)
	if refused {
		// Settled for good: the next poll waits for a newer Zuul build.
		changes = append(changes, store.PutCursor(cursorAt(zi.Name, zb, store.Failed, err.Error(), st.Now())))
	}
	failed, serr := w.Abort(ctx, err.Error(), changes...)
	if failed.State != store.Failed {
		return failed, errors.Join(werr, serr)
	}
	if serr != nil {
		log.Warn("could not remove files of failed build", "error", serr)
	}
	if refused {
		p.prunePartials(zi.Name)
	}
	return failed, werr
}

// prunePartials drops the image's partial downloads once its cursor has moved:
// the Zuul builds they belong to will not be fetched again.
func (p *Poller) prunePartials(image string) {
	if err := p.opts.Store.RemovePartials(image, ""); err != nil {
		p.log.Warn("could not remove stale partial downloads", "image", image, "error", err)
	}
}

// settled is complete for Zuul's newest build zb, which the cursor has
// settled; when zb is behind the cursor, the outcome says so.
func (p *Poller) settled(ctx context.Context, out Outcome, zi *config.ZuulImage, zb zuulapi.Build, cur store.Cursor,
	needed []string, ready []store.Build) (Outcome, error) {
	out, err := p.complete(ctx, out, zi, zb, needed, ready)
	if err == nil && out.Skipped == noNewBuild && judge(cur, zb) == behind {
		out.Skipped = fmt.Sprintf("%s: Zuul's newest build %s (id %d) is behind the poll cursor (id %d); see zuul-cursor-reset",
			noNewBuild, zb.UUID, zb.ID, cur.ZuulID)
	}
	return out, err
}

// complete fetches formats that became needed after the newest build was
// ingested; builds are the image's ready builds, read here when nil. A format
// refused for good (a checksum, an unsafe image) is recorded on the build and
// not fetched again.
func (p *Poller) complete(ctx context.Context, out Outcome, zi *config.ZuulImage, zb zuulapi.Build, needed []string, builds []store.Build) (Outcome, error) {
	if builds == nil {
		var err error
		if builds, err = p.opts.Store.Builds(ctx, store.BuildFilter{Image: zi.Name, State: store.Ready}); err != nil {
			return out, err
		}
	}
	if len(builds) == 0 || builds[0].Zuul.UUID != zb.UUID || builds[0].BuilderID != p.opts.Store.BuilderID() {
		// Nothing to add to, or the build's files are on another builder's host.
		out.Skipped = noNewBuild
		return out, nil
	}
	b := builds[0]
	var missing, refused []string
	for _, f := range needed {
		if reason, ok := b.Refused[f]; ok {
			refused = append(refused, f+" ("+reason+")")
			continue
		}
		if file, ok := b.File(f); !ok || !file.Present {
			missing = append(missing, f)
		}
	}
	if len(missing) == 0 {
		out.Skipped = noNewBuild
		if len(refused) > 0 {
			out.Skipped += "; refused in the newest: " + strings.Join(refused, "; ")
		}
		return out, nil
	}
	p.log.Info("fetching formats newly needed", "image", zi.Name, "build", b.ID, "formats", missing)
	w := p.opts.Store.WriterOf(b)
	err := p.fetch(ctx, zi, zb, w, missing)
	var rf *refusedFormat
	if errors.As(err, &rf) {
		// Recorded, so that the next poll does not fetch it again.
		refuse := func(b *store.Build) { b.Refuse(rf.format, rf.err.Error()) }
		if werr := w.Update(context.WithoutCancel(ctx), refuse); werr != nil {
			err = errors.Join(err, werr)
		}
	}
	if err != nil {
		return out, fmt.Errorf("fetch %v of Zuul build %s of %s: %w", missing, zb.UUID, zi.Name, err)
	}
	b = w.Build()
	out.Ingested = &b
	return out, nil
}

// lacks tells whether this builder's build of the newest Zuul build, among the
// image's ready builds, lacks a needed format it has not refused, as complete
// would fetch it.
func (p *Poller) lacks(builds []store.Build, zb zuulapi.Build, needed []string) bool {
	if len(builds) == 0 || builds[0].Zuul.UUID != zb.UUID || builds[0].BuilderID != p.opts.Store.BuilderID() {
		return false
	}
	for _, f := range needed {
		if _, refused := builds[0].Refused[f]; refused {
			continue
		}
		if file, ok := builds[0].File(f); !ok || !file.Present {
			return true
		}
	}
	return false
}

// refusedFormat is a format of a Zuul build refused for good; err wraps ErrRefused.
type refusedFormat struct {
	format string
	err    error
}

func (r *refusedFormat) Error() string { return r.err.Error() }
func (r *refusedFormat) Unwrap() error { return r.err }

// refuse marks a format's failure as a refusal for good.
func refuse(format string, err error) error {
	return &refusedFormat{format: format, err: fmt.Errorf("%w: %w", ErrRefused, err)}
}

// fetch downloads each needed format once, verified and in place, and records it.
// A format that is not published but can be converted from one that is, is.
func (p *Poller) fetch(ctx context.Context, zi *config.ZuulImage, zb zuulapi.Build, w *store.BuildWriter, needed []string) error {
	cands := make([]artifacts.Candidate, 0, len(zb.Artifacts))
	for _, a := range zb.Artifacts {
		cands = append(cands, artifacts.Candidate{Name: a.Name, URL: a.URL, Metadata: a.Metadata})
	}
	mappings := make([]artifacts.Mapping, 0, len(zi.Artifacts))
	for _, m := range zi.Artifacts {
		mappings = append(mappings, artifacts.Mapping{Format: m.Format, Type: m.Type, Name: m.Name})
	}
	fetcher, ok := p.opts.Fetchers[zi.Name]
	if !ok {
		return fmt.Errorf("no downloader for zuul-image %s", zi.Name)
	}
	hosts, err := artifactHosts(zi, zb)
	if err != nil {
		return err
	}
	limit := fetcher.MaxSize
	if limit <= 0 {
		limit = untrusted.DefaultMaxSize
	}
	available := artifacts.Available(cands, mappings)
	plan, convert, err := planFormats(needed, available)
	if err != nil {
		return err
	}
	matched, err := artifacts.Match(cands, mappings, plan)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrRefused, err)
	}
	b := w.Build()
	inspected := map[string]qemuimg.Image{}
	for _, format := range plan {
		c := matched[format]
		sha, md5 := artifacts.Checksums(c)
		if sha == "" && zi.RequireChecksum {
			return refuse(format, fmt.Errorf("artifact %q (%s) has no sha256 in its metadata and require-checksum is set", c.Name, format))
		}
		dest := w.Path(format)
		began := time.Now()
		res, err := fetcher.Fetch(ctx, artifacts.Request{
			URL:    c.URL,
			Dest:   dest,
			Key:    store.PartialKey(b.Image, zb.UUID, format),
			SHA256: sha,
			MD5:    md5,
			Size:   declaredSize(c),
			Label:  b.Name() + "." + format,
			Hosts:  hosts,
		})
		p.opts.Metrics.Downloaded(b.Image, res.Downloaded, time.Since(began), err)
		switch {
		case errors.Is(err, untrusted.ErrTooLarge):
			return refuse(format, fmt.Errorf("artifact %q (%s): %w (%s)", c.Name, format, err, maxImageSize(limit)))
		case errors.Is(err, artifacts.ErrChecksum), errors.Is(err, untrusted.ErrUnsafe):
			return refuse(format, fmt.Errorf("artifact %q (%s): %w", c.Name, format, err))
		case err != nil:
			return fmt.Errorf("download artifact %q (%s): %w", c.Name, format, err)
		}
		// The bytes are the job's, not ours: before anything converts or
		// uploads them, they must be the format they claim, whole, and hold
		// a disk no larger than the limit.
		img, err := p.inspect(ctx, dest, format, limit)
		if err != nil {
			return fmt.Errorf("artifact %q (%s): %w", c.Name, format, err)
		}
		inspected[format] = img
		f := store.File{Format: format, SHA256: res.SHA256, MD5: res.MD5, Size: res.Size, URL: redact.URL(c.URL)}
		if err := w.Add(ctx, f); err != nil {
			return err
		}
	}
	for dst, src := range convert {
		img, ok := inspected[src]
		if !ok {
			return fmt.Errorf("convert %s to %s: %s was not fetched", src, dst, src)
		}
		if err := p.convertFormat(ctx, w, img, dst, limit); err != nil {
			return err
		}
	}
	return nil
}

// artifactHosts is what the downloads of a build may reach: the zuul-image's
// artifact-hosts, all named by the operator; or, without them, the api-url's host
// and port, named by the operator, and the build's log_url host on any port, which
// Zuul's answer names and which may therefore not be on an internal address.
func artifactHosts(zi *config.ZuulImage, zb zuulapi.Build) (*artifacts.Hosts, error) {
	hosts := &artifacts.Hosts{}
	if zi.ArtifactHosts != nil {
		for _, p := range zi.ArtifactHosts {
			hosts.Name(p)
		}
		return hosts, nil
	}
	api, err := hostpattern.FromURL(zi.APIURL, true)
	if err != nil {
		return nil, fmt.Errorf("api-url of zuul-image %s: %w", zi.Name, err)
	}
	hosts.Name(api)
	if zb.LogURL != "" {
		// A log_url that is no URL allows nothing more; its artifacts are refused.
		if logs, err := hostpattern.FromURL(zb.LogURL, false); err == nil {
			hosts.Allow(logs)
		}
	}
	return hosts, nil
}

// planFormats picks what to download: every needed format that is published, and for
// each one that is not, a published format to convert it from (qcow2 first).
func planFormats(needed, available []string) (download []string, convert map[string]string, err error) {
	convert = map[string]string{}
	for _, f := range needed {
		if slices.Contains(available, f) {
			if !slices.Contains(download, f) {
				download = append(download, f)
			}
			continue
		}
		src := ""
		for _, pref := range []string{"qcow2", "raw", "vhd", "vmdk"} {
			if pref != f && slices.Contains(available, pref) && convertible(pref) && convertible(f) {
				src = pref
				break
			}
		}
		if src == "" {
			return nil, nil, fmt.Errorf("%w: %w", ErrRefused, &artifacts.MissingError{Missing: []string{f}, Available: available})
		}
		convert[f] = src
		if !slices.Contains(download, src) {
			download = append(download, src)
		}
	}
	return download, convert, nil
}

func convertible(format string) bool {
	switch format {
	case "qcow2", "raw", "vhd", "vmdk":
		return true
	}
	return false
}

// convertFormat converts src, a file of the build fetched and inspected, into
// format dst and records it.
func (p *Poller) convertFormat(ctx context.Context, w *store.BuildWriter, src qemuimg.Image, dst string, limit int64) error {
	b := w.Build()
	if _, err := exec.LookPath(p.opts.QemuImg); err != nil {
		return fmt.Errorf("convert %s to %s: %s is not installed: %w", src.Format, dst, p.opts.QemuImg, err)
	}
	out := w.Path(dst)
	p.log.Info("converting", "image", b.Image, "build", b.ID, "from", src.Format, "to", dst, "virtual_size", src.VirtualSize)
	if err := qemuimg.Convert(ctx, p.opts.QemuImg, src, out, dst, store.CreateConversionTemp); err != nil {
		return err
	}
	if _, err := p.inspect(ctx, out, dst, limit); err != nil {
		return err
	}
	sha, md, size, err := store.HashFile(ctx, out)
	if err != nil {
		return err
	}
	return w.Add(ctx, store.File{Format: dst, SHA256: sha, MD5: md, Size: size})
}

// inspect checks a fetched or converted file with qemu-img, and the size of the
// disk it holds against limit (builder.max-image-size); an unsafe or too large
// one is removed and its format refused for good.
func (p *Poller) inspect(ctx context.Context, path, format string, limit int64) (qemuimg.Image, error) {
	img, err := qemuimg.Inspect(ctx, p.opts.QemuImg, path, format)
	if err == nil {
		if err = img.CheckSize(limit); err == nil {
			return img, nil
		}
		err = fmt.Errorf("%w (%s)", err, maxImageSize(limit))
	}
	if rerr := os.Remove(path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		err = errors.Join(err, rerr)
	}
	if errors.Is(err, untrusted.ErrUnsafe) || errors.Is(err, untrusted.ErrTooLarge) {
		return qemuimg.Image{}, refuse(format, err)
	}
	return qemuimg.Image{}, fmt.Errorf("check %s image %s: %w", format, path, err)
}

// maxImageSize says, for an error, which setting sets the limit of limit bytes.
func maxImageSize(limit int64) string {
	return fmt.Sprintf("builder.max-image-size is %d bytes; raise it to accept a larger image", limit)
}

// declaredSize is the uncompressed size an artifact's metadata declares, in
// bytes; 0 when it declares none.
func declaredSize(c artifacts.Candidate) int64 {
	switch v := c.Metadata["size"].(type) {
	case float64:
		if v > 0 && v == float64(int64(v)) {
			return int64(v)
		}
	case json.Number:
		if n, err := v.Int64(); err == nil && n > 0 {
			return n
		}
	}
	return 0
}
