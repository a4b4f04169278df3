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
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nodepool-builder/nodepool-builder/artifacts"
	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/internal/hostpattern"
	"github.com/nodepool-builder/nodepool-builder/internal/redact"
	"github.com/nodepool-builder/nodepool-builder/internal/untrusted"
	"github.com/nodepool-builder/nodepool-builder/metrics"
	"github.com/nodepool-builder/nodepool-builder/qemuimg"
	"github.com/nodepool-builder/nodepool-builder/source"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/zuulapi"
)

// Builds is the part of the Zuul API the poller needs: the builds, and the
// name a project's builds are stored under.
type Builds interface {
	Builds(ctx context.Context, q zuulapi.Query) ([]zuulapi.Build, error)
	ProjectName(ctx context.Context, project string) (string, error)
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
	// Metrics is told of polls and downloads; nil: nobody is.
	Metrics *metrics.Metrics
}

// Poller ingests Zuul-built images into the store.
type Poller struct {
	opts Options
	log  *slog.Logger

	mu sync.Mutex
	// projects are, by zuul-image, the projects as configured and the names
	// Zuul stores their builds under, once looked up; unknown, the projects
	// Zuul said it does not know, once said.
	projects map[string][2]string
	unknown  map[string]string
}

// New returns a Poller.
func New(opts Options) *Poller {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Poller{opts: opts, log: opts.Logger, projects: map[string][2]string{}, unknown: map[string]string{}}
}

// looksCanonical tells whether a project may be written by its canonical
// name, review.example.com/org/images: its first path segment holds a dot,
// as a hostname does. Zuul takes the segment for a hostname when it is one
// of its canonical hostnames, which only Zuul knows.
func looksCanonical(project string) bool {
	host, _, ok := strings.Cut(project, "/")
	return ok && strings.Contains(host, ".") && !strings.Contains(project, "*")
}

// Project is the project zi's builds are asked for under: the name Zuul
// stores them under and filters them by (its SQL reporter records the
// project's short name, org/images), which a project written by its
// canonical name is looked up to; the project as written until it was, or
// when it is no canonical name. The MQTT listener matches reports with it,
// as the poll asks.
func (p *Poller) Project(zi config.ZuulImage) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if r, ok := p.projects[zi.Name]; ok && r[0] == zi.Project {
		return r[1]
	}
	return zi.Project
}

// projectName is Project, looked up from Zuul when it may be a canonical
// name and has not been. A name Zuul does not know is asked for as written,
// with a warning: Zuul answers no build of it.
func (p *Poller) projectName(ctx context.Context, zi *config.ZuulImage, client Builds) (string, error) {
	if !looksCanonical(zi.Project) {
		return zi.Project, nil
	}
	p.mu.Lock()
	r, ok := p.projects[zi.Name]
	p.mu.Unlock()
	if ok && r[0] == zi.Project {
		return r[1], nil
	}
	name, err := client.ProjectName(ctx, zi.Project)
	switch {
	case errors.Is(err, zuulapi.ErrUnknownProject):
		// Asked again at the next poll: Zuul may know it by then.
		p.mu.Lock()
		said := p.unknown[zi.Name] == zi.Project
		p.unknown[zi.Name] = zi.Project
		p.mu.Unlock()
		if !said {
			p.log.Warn("Zuul's tenant knows no project of this name, so no build of it will be found; check project",
				"image", zi.Name, "project", zi.Project, "error", err)
		}
		return zi.Project, nil
	case err != nil:
		return "", fmt.Errorf("poll %s: %w", zi.Name, err)
	case name != zi.Project:
		p.log.Info("Zuul stores the project's builds under its name, not its canonical name: they are asked for by it",
			"image", zi.Name, "project", zi.Project, "name", name)
	}
	p.mu.Lock()
	p.projects[zi.Name] = [2]string{zi.Project, name}
	p.mu.Unlock()
	return name, nil
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

// Abandon settles nothing for a Zuul build a stopped builder left: its download
// stopped with it, and the partial files stay to be resumed.
func (p *Poller) Abandon(context.Context, store.Build) error { return nil }

// noNewBuild begins the reason nothing is fetched when Zuul's newest build is
// the one settled.
const noNewBuild = "no new Zuul build"

// ErrRefused marks a Zuul build that was looked at and refused for good (a needed
// format is missing, a checksum does not match); it is not fetched again.
var ErrRefused = errors.New("zuul build refused")

// fetch is a Zuul build to fetch, as a poll found it.
type fetch struct {
	zi     *config.ZuulImage
	zb     zuulapi.Build
	needed []string // the formats to fetch
	asked  bool     // an operator asked for a build
}

// Due polls one zuul-image: when Zuul has a successful build newer than the
// last one settled, its needed formats are to be fetched into a new build, and
// the poll cursor moves when it is ready. When the newest build is the one
// already ingested but lacks a format that is now needed (a provider was
// added), that format is to be fetched into it. Zuul is asked before the
// image's lock; under it, the state is read again and Zuul's answer kept.
//
// An operator's request (a gearman job) is answered with the build of Zuul's
// newest successful build: fetched now (the request is recorded on it), or the
// one fetched before; an error says why there is none.
func (p *Poller) Due(ctx context.Context, image string, look source.Look) (source.Work, error) {
	w, err := p.due(ctx, image, look)
	if err != nil || !look.Asked || w.Skip == "" {
		return w, err
	}
	if !strings.HasPrefix(w.Skip, noNewBuild) {
		return source.Work{}, fmt.Errorf("fetch %s: %s", image, w.Skip)
	}
	b, err := p.settledBuild(ctx, image)
	if err != nil {
		return source.Work{}, err
	}
	return source.Work{Have: &b}, nil
}

// settledBuild is the ready build of the Zuul build the image's cursor settled.
func (p *Poller) settledBuild(ctx context.Context, image string) (store.Build, error) {
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

func (p *Poller) due(ctx context.Context, image string, look source.Look) (source.Work, error) {
	if look.Locked() {
		return p.dueLocked(ctx, look.Seen.Data.(*fetch))
	}
	zi := p.opts.Config.ZuulImage(image)
	if zi == nil {
		return source.Work{}, fmt.Errorf("poll %s: not a zuul-image", image)
	}
	needed := p.opts.Config.NeededFormats(image)
	if len(needed) == 0 {
		return source.NotDue("no provider lists it and it has no formats"), nil
	}
	client, ok := p.opts.Clients[image]
	if !ok {
		return source.Work{}, fmt.Errorf("poll %s: no Zuul client", image)
	}
	project, err := p.projectName(ctx, zi, client)
	if err != nil {
		p.opts.Metrics.Failed(metrics.StepPoll, err)
		return source.Work{}, err
	}
	q := zuulapi.Successful(project, zi.Branch, zi.Job, zi.Pipelines)
	q.Limit = 1
	if !zi.AllowUnmergedChanges {
		// Builds of changes are passed over: look a little further back for the
		// newest build of merged code.
		q.Limit = mergedWindow
	}
	zbs, err := client.Builds(ctx, q)
	if err != nil {
		p.opts.Metrics.Failed(metrics.StepPoll, err)
		return source.Work{}, fmt.Errorf("poll %s: ask Zuul for builds of %s: %w", image, zi.Job, err)
	}
	p.opts.Metrics.Polled(image)
	zbs = p.answers(image, q, zbs)
	if len(zbs) == 0 {
		return source.NotDue("Zuul has no successful build of job " + zi.Job), nil
	}
	zb, ok := p.newestAllowed(zi, zbs)
	if !ok {
		return source.NotDue(fmt.Sprintf("Zuul's newest %d successful builds of job %s are all of unmerged changes; "+
			"set pipelines to those that run on merged code (periodic, post), or allow-unmerged-changes", len(zbs), zi.Job)), nil
	}
	f := &fetch{zi: zi, zb: zb, needed: needed, asked: look.Asked}
	cur, err := p.opts.Store.Cursor(ctx, image)
	if err != nil {
		return source.Work{}, err
	}
	if judge(cur, zb) != newer {
		ready, err := p.opts.Store.Builds(ctx, store.BuildFilter{Image: zi.Name, State: store.Ready})
		if err != nil {
			return source.Work{}, err
		}
		if !due(cur, zb, ready, look.Asked) && !marks(cur, zb) && p.missing(ready, zb, needed) == nil {
			return p.whyNotDue(f, cur, ready), nil // nothing to fetch: it says why
		}
	}
	// One builder fetches a Zuul build under the image's build lock; the
	// others find it settled when they get the lock.
	return source.Work{Reason: "Zuul build " + zb.UUID, Data: f}, nil
}

// dueLocked is Due under the image's build lock, for the Zuul build f the
// look before the lock found.
func (p *Poller) dueLocked(ctx context.Context, f *fetch) (source.Work, error) {
	zi, zb, image := f.zi, f.zb, f.zi.Name
	cur, err := p.opts.Store.Cursor(ctx, image)
	if err != nil {
		return source.Work{}, err
	}
	ready, err := p.opts.Store.Builds(ctx, store.BuildFilter{Image: image, State: store.Ready})
	if err != nil {
		return source.Work{}, err
	}
	again := due(cur, zb, ready, f.asked)
	if again {
		if again, err = p.gone(ctx, cur); err != nil {
			return source.Work{}, err
		}
	}
	v := judge(cur, zb)
	if v != newer && !again {
		if marks(cur, zb) {
			if err := p.markBehind(ctx, cur, zb); err != nil {
				return source.Work{}, err
			}
		}
		if missing := p.missing(ready, zb, f.needed); missing != nil {
			if _, err := p.waitForHosts(ctx, cur, zi, zb, missing); err != nil {
				return source.Work{}, err
			}
			// Formats newly needed, fetched into the build that is there.
			b := ready[0]
			p.log.Info("fetching formats newly needed", "image", image, "build", b.ID, "formats", missing)
			return source.Work{Reason: "formats newly needed: " + strings.Join(missing, ", "), Into: &b,
				Data: &fetch{zi: zi, zb: zb, needed: missing}}, nil
		}
		return p.whyNotDue(f, cur, ready), nil
	}
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
	if cur, err = p.waitForHosts(ctx, cur, zi, zb, f.needed); err != nil {
		return source.Work{}, err
	}
	st := p.opts.Store
	return source.Work{
		Reason: "new Zuul build " + zb.UUID,
		// The connection settings of the image's declaration in nodepool.yaml:
		// the upload records carry them to nodepool-launcher.
		New: store.Build{
			Image:    image,
			Source:   store.SourceZuul,
			Zuul:     store.ZuulRef{UUID: zb.UUID, ID: zb.ID, EndTime: zb.EndTime, LogURL: redact.URL(zb.LogURL)},
			Username: zi.Username, PythonPath: zi.PythonPath, ShellType: zi.ShellType,
		},
		// The build becomes ready and the cursor moves in one write, so a
		// crash leaves either a build to settle and fetch again, or both done.
		Commit: func(b store.Build) []store.Change {
			cur := cursorAt(image, zb, store.Ready, "", st.Now())
			cur.Build = b.ID
			return []store.Change{store.PutCursor(cur)}
		},
		// A build refused for good is settled: the next poll waits for a
		// newer Zuul build.
		Abort: func(_ store.Build, err error) []store.Change {
			var wait *WaitingForHost
			switch {
			case errors.As(err, &wait) && wait.Reason != cur.Waiting:
				// A redirect, or an address a host resolved to: the cursor
				// says what the build waits for, as the check before does.
				next := cur
				next.Image, next.Waiting = image, wait.Reason
				return []store.Change{store.PutCursor(next)}
			case !errors.Is(err, ErrRefused):
				return nil
			}
			return []store.Change{store.PutCursor(cursorAt(image, zb, store.Failed, err.Error(), st.Now()))}
		},
		Done: func(_ context.Context, end source.End) error {
			if end.Recorded && (end.Build.State == store.Ready || errors.Is(end.Err, ErrRefused)) {
				p.prunePartials(image)
			}
			return nil
		},
		Data: f,
	}, nil
}

// waitForHosts checks, under the image's lock, that the artifacts of Zuul
// build zb that make the needed formats are on hosts the zuul-image allows.
// When one is not, the build waits: the poll cursor says why (it stays where
// it is otherwise) and the error is a *WaitingForHost. A cursor that said so
// of a wait that is over says so no more. It returns the cursor as it now is.
func (p *Poller) waitForHosts(ctx context.Context, cur store.Cursor, zi *config.ZuulImage, zb zuulapi.Build, needed []string) (store.Cursor, error) {
	wait := ""
	if d, err := planDownloads(zi, zb, needed); err == nil {
		// A build that cannot be planned is refused by its fetch, as ever.
		if wait, err = checkHosts(zi, zb, d); err != nil {
			return cur, err
		}
	}
	if wait != cur.Waiting {
		cur.Image = zi.Name
		if err := p.opts.Store.SetCursorWaiting(ctx, cur, wait); err != nil {
			return cur, fmt.Errorf("poll %s: Zuul build %s: %w", zi.Name, zb.UUID, err)
		}
		cur.Waiting = wait
	}
	if wait != "" {
		return cur, &WaitingForHost{Image: zi.Name, Reason: wait}
	}
	return cur, nil
}

// Make fetches the formats of the work's Zuul build into w: a new build, or
// one that lacks formats now needed. Failed, nothing of a new build stays on
// disk but resumable downloads. A format newly needed that is refused for good
// (a checksum, an unsafe image) is recorded on the build and not fetched again.
func (p *Poller) Make(ctx context.Context, work *source.Work, w *store.BuildWriter) error {
	f := work.Data.(*fetch)
	if work.Into == nil {
		p.log.Info("new Zuul build", "image", f.zi.Name, "zuul_build", f.zb.UUID, "zuul_id", f.zb.ID,
			"end_time", f.zb.EndTime, "formats", f.needed)
		if err := p.fetch(ctx, f.zi, f.zb, w, f.needed); err != nil {
			return fmt.Errorf("fetch Zuul build %s of %s: %w", f.zb.UUID, f.zi.Name, err)
		}
		return nil
	}
	err := p.fetch(ctx, f.zi, f.zb, w, f.needed)
	var rf *refusedFormat
	if errors.As(err, &rf) {
		// Recorded, so that the next poll does not fetch it again.
		refuse := func(b *store.Build) { b.Refuse(rf.format, rf.err.Error()) }
		if werr := w.Update(context.WithoutCancel(ctx), refuse); werr != nil {
			err = errors.Join(err, werr)
		}
	}
	if err != nil {
		return fmt.Errorf("fetch %v of Zuul build %s of %s: %w", f.needed, f.zb.UUID, f.zi.Name, err)
	}
	return nil
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
// fetched again; nor is one whose build another program deleted, unless an
// operator asks: fetched again, it would be deleted again.
func due(cur store.Cursor, zb zuulapi.Build, ready []store.Build, asked bool) bool {
	if len(ready) > 0 {
		return false
	}
	if cur.ZuulUUID == zb.UUID {
		switch cur.Outcome {
		case string(store.Failed):
			return false
		case store.OutcomeLost:
			return asked
		}
	}
	return true
}

// gone tells, reading the state itself, whether the build the cursor's Zuul
// build became is gone, released by a builder of ours. The ready builds come from a cache, which in ZooKeeper
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
	case errors.Is(err, store.ErrNotFound) && p.opts.Store.Owns(cur.Image, cur.Build):
		// Its record went though no builder of ours released it: another
		// program deleted it, which the tidy-up settles on the cursor.
		return false, nil
	case errors.Is(err, store.ErrNotFound):
		return true, nil
	case err != nil:
		return false, err
	}
	if b.State == store.Deleting && !b.Released() && p.opts.Store.Owns(b.Image, b.ID) {
		return false, nil // another program marked it deleting: as above, once it is gone
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
	var behindID int64
	if judge(cur, zb) == behind {
		behindID = zb.ID
		p.log.Warn("Zuul's newest build is behind the poll cursor: its id is below the cursor's and it ended no later, "+
			"so it is not fetched; builds that end later are. If Zuul's database was rebuilt or restored, or the cursor "+
			"is wrong, run zuul-cursor-reset for the image", "image", cur.Image, "zuul_build", zb.UUID, "zuul_id", zb.ID,
			"cursor_build", cur.ZuulUUID, "cursor_id", cur.ZuulID)
	} else {
		p.log.Info("Zuul's newest build is no longer behind the poll cursor", "image", cur.Image, "zuul_build", zb.UUID, "zuul_id", zb.ID)
	}
	if err := p.opts.Store.MarkZuulBehind(ctx, cur, behindID); err != nil {
		return fmt.Errorf("poll %s: %w", cur.Image, err)
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
// order: its filtering is not relied on. Builds beyond q's limit are not
// looked at. The first maxLoggedSkips builds skipped are logged, and why, with
// their fields clipped; the others are counted in one line, so that a hostile
// answer makes a log of a few lines.
func (p *Poller) answers(image string, q zuulapi.Query, zbs []zuulapi.Build) []zuulapi.Build {
	limit := q.Limit
	if limit <= 0 {
		limit = zuulapi.DefaultPageSize
	}
	if len(zbs) > limit {
		p.log.Warn("Zuul answered more builds than the query's limit; those beyond it are ignored", "image", image,
			"answered", len(zbs), "limit", limit)
		zbs = zbs[:limit]
	}
	var kept []zuulapi.Build
	skipped := 0
	for _, zb := range zbs {
		if q.Matches(zb) {
			kept = append(kept, zb)
			continue
		}
		skipped++
		if skipped <= maxLoggedSkips {
			p.log.Warn("skipping a build Zuul answered that is not one asked for", "image", image,
				"zuul_build", clip(zb.UUID), "zuul_id", zb.ID, "reason", q.Check(zb))
		}
	}
	if skipped > maxLoggedSkips {
		p.log.Warn("skipped more builds Zuul answered that are not ones asked for; only the first are logged",
			"image", image, "skipped", skipped, "logged", maxLoggedSkips)
	}
	return kept
}

// maxLoggedSkips is how many builds Zuul answered that are not what a poll
// asked for the poll logs one by one.
const maxLoggedSkips = 3

// clip shortens a field of Zuul's answer for a log line.
func clip(s string) string {
	const most = 100
	if len(s) > most {
		return s[:most] + "..."
	}
	return s
}

// mergedWindow is how many of Zuul's newest successful builds a poll looks at
// for one of merged code.
const mergedWindow = 20

// newestAllowed returns the newest build the zuul-image may fetch: any, with
// allow-unmerged-changes; else the newest that did not run on a change, which
// anyone may propose and nobody has reviewed.
func (p *Poller) newestAllowed(zi *config.ZuulImage, zbs []zuulapi.Build) (zuulapi.Build, bool) {
	for _, zb := range zbs {
		if zi.AllowUnmergedChanges || !zb.Unmerged() {
			return zb, true
		}
		p.log.Debug("passing over a Zuul build of an unmerged change", "image", zi.Name, "zuul_build", zb.UUID,
			"pipeline", zb.Pipeline, "change", zb.Ref.Change)
	}
	return zuulapi.Build{}, false
}

// prunePartials drops the image's partial downloads once its cursor has moved:
// the Zuul builds they belong to will not be fetched again.
func (p *Poller) prunePartials(image string) {
	if err := p.opts.Store.RemovePartials(image, ""); err != nil {
		p.log.Warn("could not remove stale partial downloads", "image", image, "error", err)
	}
}

// whyNotDue says why nothing is fetched for Zuul's newest build zb, which the
// cursor has settled, and the image's builds lack nothing they can have.
func (p *Poller) whyNotDue(f *fetch, cur store.Cursor, ready []store.Build) source.Work {
	why := noNewBuild
	if len(ready) > 0 && ready[0].Zuul.UUID == f.zb.UUID && ready[0].BuilderID == p.opts.Store.BuilderID() {
		var refused []string
		for _, format := range f.needed {
			if reason, ok := ready[0].Refused[format]; ok {
				refused = append(refused, format+" ("+reason+")")
			}
		}
		if len(refused) > 0 {
			why += "; refused in the newest: " + strings.Join(refused, "; ")
		}
	}
	if why == noNewBuild && cur.ZuulUUID == f.zb.UUID && cur.Outcome == store.OutcomeLost && len(ready) == 0 {
		why = fmt.Sprintf("%s: the build Zuul's newest build %s became was deleted by another program (%s); it is "+
			"fetched again when Zuul has a newer build, or now with image-build", noNewBuild, f.zb.UUID, cur.Reason)
	}
	if why == noNewBuild && judge(cur, f.zb) == behind {
		why = fmt.Sprintf("%s: Zuul's newest build %s (id %d) is behind the poll cursor (id %d); see zuul-cursor-reset",
			noNewBuild, f.zb.UUID, f.zb.ID, cur.ZuulID)
	}
	return source.NotDue(why)
}

// missing is the needed formats that this builder's build of the newest Zuul
// build, among the image's ready builds, lacks and has not refused: they are
// fetched into it. nil when it lacks none, or the newest build is another
// builder's, whose files are on its host.
func (p *Poller) missing(ready []store.Build, zb zuulapi.Build, needed []string) []string {
	if len(ready) == 0 || ready[0].Zuul.UUID != zb.UUID || ready[0].BuilderID != p.opts.Store.BuilderID() {
		return nil
	}
	var missing []string
	for _, f := range needed {
		if _, refused := ready[0].Refused[f]; refused {
			continue
		}
		if file, ok := ready[0].File(f); !ok || !file.Present {
			missing = append(missing, f)
		}
	}
	return missing
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

// downloads is what a Zuul build's fetch downloads: the formats in order, the
// artifact of each, and the formats converted from one of them.
type downloads struct {
	plan    []string
	matched map[string]artifacts.Candidate
	convert map[string]string
}

// planDownloads picks the artifacts of zb that make the needed formats. A
// needed format that is neither published nor convertible, or an artifact
// that cannot be told apart, refuses the build for good (ErrRefused).
func planDownloads(zi *config.ZuulImage, zb zuulapi.Build, needed []string) (downloads, error) {
	cands := make([]artifacts.Candidate, 0, len(zb.Artifacts))
	for _, a := range zb.Artifacts {
		cands = append(cands, artifacts.Candidate{Name: a.Name, URL: a.URL, Metadata: a.Metadata})
	}
	mappings := make([]artifacts.Mapping, 0, len(zi.Artifacts))
	for _, m := range zi.Artifacts {
		mappings = append(mappings, artifacts.Mapping{Format: m.Format, Type: m.Type, Name: m.Name})
	}
	available := artifacts.Available(cands, mappings)
	plan, convert, err := planFormats(needed, available)
	if err != nil {
		return downloads{}, err
	}
	matched, err := artifacts.Match(cands, mappings, plan)
	if err != nil {
		return downloads{}, fmt.Errorf("%w: %w", ErrRefused, err)
	}
	return downloads{plan: plan, matched: matched, convert: convert}, nil
}

// WaitingForHost is the error of a poll whose due Zuul build is not fetched
// because an artifact it needs is on a host the zuul-image does not allow:
// the operator's configuration, not the build's content. The build stays due
// and is fetched once the host is allowed; the poll cursor says so meanwhile.
type WaitingForHost struct {
	Image  string
	Reason string
}

func (e *WaitingForHost) Error() string { return e.Image + ": " + e.Reason }

// NotDone marks the error as due work left undone, for the builder's summary.
func (e *WaitingForHost) NotDone() {}

// hostWait says why a Zuul build waits for an artifact host: err wraps
// artifacts.ErrHostNotAllowed.
func hostWait(zb zuulapi.Build, c artifacts.Candidate, format string, err error) string {
	name := c.Name
	if len(name) > 100 { // Zuul's answer names it: the state keeps what is said
		name = name[:100] + "..."
	}
	return fmt.Sprintf("Zuul build %s is not fetched: artifact %q (%s): %v (in %s); once it is allowed (a reload), "+
		"the build is fetched at the next poll", zb.UUID, name, format, err, config.BuilderFileName)
}

// checkHosts finds the first artifact of d on a host the zuul-image does not
// allow, and says why the build waits for it; "" when every one is allowed.
// Redirects and the addresses a host resolves to are only known as a download
// goes: a refusal then is said by the fetch (see Make).
func checkHosts(zi *config.ZuulImage, zb zuulapi.Build, d downloads) (string, error) {
	hosts, err := artifactHosts(zi, zb)
	if err != nil {
		return "", err
	}
	for _, format := range d.plan {
		c := d.matched[format]
		if err := hosts.Check(c.URL); errors.Is(err, artifacts.ErrHostNotAllowed) {
			return hostWait(zb, c, format, err), nil
		}
	}
	return "", nil
}

// fetch downloads each needed format once, verified and in place, and records it.
// A format that is not published but can be converted from one that is, is.
func (p *Poller) fetch(ctx context.Context, zi *config.ZuulImage, zb zuulapi.Build, w *store.BuildWriter, needed []string) error {
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
	d, err := planDownloads(zi, zb, needed)
	if err != nil {
		return err
	}
	plan, matched, convert := d.plan, d.matched, d.convert
	b := w.Build()
	inspected := map[string]qemuimg.Image{}
	for _, format := range plan {
		c := matched[format]
		sha, md5 := artifacts.Checksums(c)
		if sha == "" && zi.RequireChecksum {
			return refuse(format, fmt.Errorf("artifact %q (%s) has no sha256 in its metadata and require-checksum is set", c.Name, format))
		}
		dest, err := w.Path(format)
		if err != nil {
			return err
		}
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
		case errors.Is(err, artifacts.ErrHostNotAllowed):
			// The operator's to allow, not the build's fault: not refused.
			return &WaitingForHost{Image: zi.Name, Reason: hostWait(zb, c, format, err)}
		case errors.Is(err, untrusted.ErrTooLarge):
			return refuse(format, fmt.Errorf("artifact %q (%s): %w (%s)", c.Name, format, err, maxImageSize(limit)))
		case errors.Is(err, artifacts.ErrChecksum), errors.Is(err, untrusted.ErrUnsafe), errors.Is(err, artifacts.ErrUnfetchableURL):
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
		src, ok := qemuimg.ConvertSource(f, available)
		if !ok {
			return nil, nil, fmt.Errorf("%w: %w", ErrRefused, &artifacts.MissingError{Missing: []string{f}, Available: available})
		}
		convert[f] = src
		if !slices.Contains(download, src) {
			download = append(download, src)
		}
	}
	return download, convert, nil
}

// convertFormat converts src, a file of the build fetched and inspected, into
// format dst and records it.
func (p *Poller) convertFormat(ctx context.Context, w *store.BuildWriter, src qemuimg.Image, dst string, limit int64) error {
	b := w.Build()
	if err := qemuimg.Installed(p.opts.QemuImg); err != nil {
		return fmt.Errorf("convert %s to %s: %w", src.Format, dst, err)
	}
	out, err := w.Path(dst)
	if err != nil {
		return err
	}
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
