package poller

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/internal/redact"
	"github.com/nodepool-builder/nodepool-builder/metrics"
	"github.com/nodepool-builder/nodepool-builder/source"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/zuulapi"
)

// fetch is the poller's job: a Zuul build to fetch, as a poll found it.
type fetch struct {
	p      *Poller
	zi     *config.ZuulImage
	zb     zuulapi.Build
	needed []string // the formats to fetch
	asked  bool     // an operator asked for a build
	// Found under the image's build lock: the cursor as read, whether the
	// formats go into the ready build of zb rather than a new build, and the
	// downloads that make them, or why zb cannot be planned (a refusal).
	cur     store.Cursor
	into    bool
	plan    downloads
	refusal error
	// streams are the uploads that begin as a new build is fetched, to
	// settle once its outcome is recorded.
	streams []Streaming
}

// state is what the image's state says of Zuul's newest build: the cursor,
// how the build compares with it, the ready builds, whether it is fetched
// again though the cursor settled it, and the formats the ready build of it
// lacks.
type state struct {
	cur     store.Cursor
	verdict verdict
	ready   []store.Build
	again   bool
	missing []string
}

// fetches tells whether a new build is made of Zuul's newest build.
func (s state) fetches() bool { return s.verdict == newer || s.again }

// marks tells whether the cursor's mark of Zuul being behind it is not what
// the verdict says: it is to be set, moved or cleared.
func (s state) marks(zb zuulapi.Build) bool {
	if s.verdict == behind {
		return s.cur.BehindID != zb.ID
	}
	return s.cur.BehindID != 0
}

// Due polls one zuul-image: when Zuul has a successful build newer than the
// last one settled, its needed formats are to be fetched into a new build, and
// the poll cursor moves when it is ready. When the newest build is the one
// already ingested but lacks a format that is now needed (a provider was
// added), that format is to be fetched into it. Zuul is asked before the
// image's lock; under it (Recheck), the state is read again and Zuul's answer
// kept.
//
// An operator's request (a gearman job) is answered with the build of Zuul's
// newest successful build: fetched now (the request is recorded on it), or the
// one fetched before; an error says why there is none.
func (p *Poller) Due(ctx context.Context, image string, look source.Look) (source.Work, error) {
	f, why, err := p.poll(ctx, image, look.Asked)
	switch {
	case err != nil:
		return source.Work{}, err
	case f == nil && look.Asked:
		return source.Work{}, fmt.Errorf("fetch %s: %s", image, why)
	case f == nil:
		return source.NotDue(why), nil
	}
	// Before the image's build lock, only whether there may be work: one
	// builder fetches a Zuul build, under the lock, and the others find it
	// settled when they get the lock.
	s, err := p.read(ctx, f, false)
	switch {
	case err != nil:
		return source.Work{}, err
	case s.fetches() || s.marks(f.zb) || s.missing != nil:
		return source.Do(source.Todo{Reason: "Zuul build " + f.zb.UUID, Maker: f}), nil
	}
	return p.nothingNew(f, s)
}

// Recheck is Due under the image's build lock, for the Zuul build the look
// before the lock found: it reads afresh what the cache may not show yet,
// records on the cursor what it finds (Zuul behind it, a build waiting for
// a host), plans the downloads and says the work, which carries the plan.
func (f *fetch) Recheck(ctx context.Context) (source.Work, error) {
	p := f.p
	s, err := p.read(ctx, f, true)
	if err != nil {
		return source.Work{}, err
	}
	if s.fetches() {
		return p.newBuild(ctx, f, s)
	}
	if s.marks(f.zb) {
		if err := p.markBehind(ctx, s, f.zb); err != nil {
			return source.Work{}, err
		}
	}
	if s.missing == nil {
		return p.nothingNew(f, s)
	}
	// Formats newly needed, fetched into the build that is there.
	job, err := p.prepare(ctx, f, s.cur, s.missing)
	if err != nil {
		return source.Work{}, err
	}
	job.into = true
	b := s.ready[0]
	p.log.Info("fetching formats newly needed", "image", f.zi.Name, "build", b.ID, "formats", s.missing)
	return source.Do(source.Todo{Reason: "formats newly needed: " + strings.Join(s.missing, ", "), Into: &b, Maker: job}), nil
}

// poll asks Zuul for the image's newest successful build it may fetch: a
// fetch of it, or why there is none.
func (p *Poller) poll(ctx context.Context, image string, asked bool) (*fetch, string, error) {
	zi := p.opts.Config.ZuulImage(image)
	if zi == nil {
		return nil, "", fmt.Errorf("poll %s: not a zuul-image", image)
	}
	needed := p.opts.Config.NeededFormats(image)
	if len(needed) == 0 {
		return nil, "no provider lists it and it has no formats", nil
	}
	client, ok := p.opts.Clients[image]
	if !ok {
		return nil, "", fmt.Errorf("poll %s: no Zuul client", image)
	}
	project, err := p.projectName(ctx, zi, client)
	if err != nil {
		p.opts.Metrics.Failed(metrics.StepPoll, err)
		return nil, "", err
	}
	q := zuulapi.Successful(project, zi.Branch, zi.JobName, zi.Pipelines)
	q.Limit = 1
	if !zi.AllowUnmergedChanges {
		// Builds of changes are passed over: look a little further back for the
		// newest build of merged code.
		q.Limit = mergedWindow
	}
	zbs, err := client.Builds(ctx, q)
	if err != nil {
		p.opts.Metrics.Failed(metrics.StepPoll, err)
		return nil, "", fmt.Errorf("poll %s: ask Zuul for builds of %s: %w", image, zi.JobName, err)
	}
	p.opts.Metrics.Polled(image)
	zbs = p.answers(image, q, zbs)
	if len(zbs) == 0 {
		return nil, "Zuul has no successful build of job " + zi.JobName, nil
	}
	zb, ok := p.newestAllowed(zi, zbs)
	if !ok {
		return nil, fmt.Sprintf("Zuul's newest %d successful builds of job %s are all of unmerged changes; "+
			"set pipelines to those that run on merged code (periodic, post), or allow-unmerged-changes", len(zbs), zi.JobName), nil
	}
	return &fetch{p: p, zi: zi, zb: zb, needed: needed, asked: asked}, "", nil
}

// read reads the image's cursor and ready builds and judges Zuul's newest
// build f.zb against them, once. Under the image's build lock (locked), a
// fetch again is confirmed from the build the cursor names, read afresh.
func (p *Poller) read(ctx context.Context, f *fetch, locked bool) (state, error) {
	image, zb := f.zi.Name, f.zb
	cur, err := p.opts.Store.Cursor(ctx, image)
	if err != nil {
		return state{}, err
	}
	s := state{cur: cur, verdict: judge(cur, zb)}
	if s.verdict == newer {
		return s, nil
	}
	if s.ready, err = p.opts.Store.Builds(ctx, store.BuildFilter{Image: image, State: store.Ready}); err != nil {
		return state{}, err
	}
	s.again = fetchAgain(cur, zb, s.ready, f.asked)
	if s.again && locked {
		if s.again, err = p.gone(ctx, cur); err != nil {
			return state{}, err
		}
	}
	if !s.again {
		s.missing = p.missing(s.ready, zb, f.needed)
	}
	return s, nil
}

// newBuild is the work of fetching Zuul build f.zb into a new build, under
// the image's lock, as s found it against the cursor.
func (p *Poller) newBuild(ctx context.Context, f *fetch, s state) (source.Work, error) {
	image, zb, cur := f.zi.Name, f.zb, s.cur
	switch {
	case s.verdict != newer:
		p.log.Info("the zuul-image has no ready build: fetching Zuul's newest build again", "image", image,
			"zuul_build", zb.UUID, "zuul_id", zb.ID)
	case zb.ID < cur.ZuulID:
		// Once: the cursor moves to this build.
		p.log.Warn("Zuul's ids went back: its newest build's id is below the poll cursor's, but it ended later, so it is "+
			"fetched; Zuul's database was rebuilt, or the cursor came from a hostile answer", "image", image,
			"zuul_build", zb.UUID, "zuul_id", zb.ID, "cursor_build", cur.ZuulUUID, "cursor_id", cur.ZuulID)
	}
	job, err := p.prepare(ctx, f, cur, f.needed)
	if err != nil {
		return source.Work{}, err
	}
	zi := f.zi
	return source.Do(source.Todo{
		Reason: "new Zuul build " + zb.UUID,
		// The connection settings of the image's declaration in nodepool.yaml:
		// the upload records carry them to nodepool-launcher.
		New: store.Build{
			Image:    image,
			Source:   store.SourceZuul,
			Zuul:     store.ZuulRef{UUID: zb.UUID, ID: zb.ID, EndTime: zb.EndTime, LogURL: redact.URL(zb.LogURL)},
			Username: zi.Username, PythonPath: zi.PythonPath, ShellType: zi.ShellType,
		},
		Maker: job,
	}), nil
}

// nothingNew says why nothing is fetched for Zuul's newest build f.zb, which the
// cursor has settled, as s found it. An operator's request is answered with
// the ready build of that Zuul build, or an error saying why there is none.
func (p *Poller) nothingNew(f *fetch, s state) (source.Work, error) {
	if !f.asked {
		return source.NotDue(p.whyNotDue(f, s)), nil
	}
	image, cur := f.zi.Name, s.cur
	if cur.Outcome != string(store.Ready) {
		return source.Work{}, fmt.Errorf("fetch %s: Zuul's newest build %s was refused: %s", image, cur.ZuulUUID, cur.Reason)
	}
	for _, b := range s.ready {
		if b.Zuul.UUID == cur.ZuulUUID {
			return source.Answer(b), nil
		}
	}
	return source.Work{}, fmt.Errorf("fetch %s: Zuul's newest build %s was fetched, but its build is no longer ready", image, cur.ZuulUUID)
}

// Cursor is the cursor that lands with the outcome of a new build: on Zuul
// build f.zb when the build is ready (a crash leaves either a build to settle
// and fetch again, or both done); on it, failed, when the build was refused
// for good, so that the next poll waits for a newer Zuul build; saying what
// the build waits for when a redirect or an address a host resolved to is
// not allowed, as the check before the fetch does.
func (f *fetch) Cursor(b store.Build, err error) *store.Cursor {
	image, now := f.zi.Name, f.p.opts.Store.Now()
	var wait *WaitingForHost
	switch {
	case err == nil:
		cur := cursorAt(image, f.zb, store.Ready, "", now)
		cur.Build = b.ID
		return &cur
	case errors.As(err, &wait) && wait.Reason != f.cur.Waiting:
		next := f.cur
		next.Image, next.Waiting = image, wait.Reason
		return &next
	case errors.Is(err, ErrRefused):
		cur := cursorAt(image, f.zb, store.Failed, err.Error(), now)
		return &cur
	}
	return nil
}

// Done drops the image's partial downloads once its cursor has moved, and
// tells the uploads that followed the downloads how the build ended.
func (f *fetch) Done(_ context.Context, end source.End) error {
	ready := end.Recorded && end.Build.State == store.Ready
	why := end.Err
	if !end.Recorded && why == nil {
		why = errors.New("its outcome could not be recorded")
	}
	for _, s := range f.streams {
		s.Settle(ready, why)
	}
	if !f.into && end.Recorded && (end.Build.State == store.Ready || errors.Is(end.Err, ErrRefused)) {
		f.p.prunePartials(f.zi.Name)
	}
	return nil
}

// prepare plans, under the image's lock, the downloads of Zuul build f.zb
// that make the needed formats, once, and checks that their artifacts are on
// hosts the zuul-image allows. When one is not, the build waits: the poll
// cursor says why (it stays where it is otherwise) and the error is a
// *WaitingForHost. A cursor that said so of a wait that is over says so no
// more. The job it returns carries the cursor as it now is and the plan, or
// the plan's refusal, which its fetch returns.
func (p *Poller) prepare(ctx context.Context, f *fetch, cur store.Cursor, needed []string) (*fetch, error) {
	zi, zb := f.zi, f.zb
	wait := ""
	d, refusal := planDownloads(zi, zb, needed)
	if refusal == nil {
		var err error
		if wait, err = checkHosts(zi, zb, d); err != nil {
			return nil, err
		}
	}
	if wait != cur.Waiting {
		cur.Image = zi.Name
		if err := p.opts.Store.SetCursorWaiting(ctx, cur, wait); err != nil {
			return nil, fmt.Errorf("poll %s: Zuul build %s: %w", zi.Name, zb.UUID, err)
		}
		cur.Waiting = wait
	}
	if wait != "" {
		return nil, &WaitingForHost{Image: zi.Name, Reason: wait}
	}
	job := *f
	job.cur, job.needed, job.plan, job.refusal = cur, needed, d, refusal
	return &job, nil
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

// fetchAgain tells whether Zuul's newest build zb is to be fetched again though the
// cursor has settled it: the zuul-image has no ready build left (all were
// deleted), as a diskimage with none is built. A build refused for good is not
// fetched again; nor is one whose build another program deleted, unless an
// operator asks: fetched again, it would be deleted again.
func fetchAgain(cur store.Cursor, zb zuulapi.Build, ready []store.Build, asked bool) bool {
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

// markBehind records on the cursor, under the image's build lock, whether
// Zuul's newest build zb is behind it, as s judged, and logs the change once.
func (p *Poller) markBehind(ctx context.Context, s state, zb zuulapi.Build) error {
	cur := s.cur
	var behindID int64
	if s.verdict == behind {
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

// prunePartials drops the image's partial downloads once its cursor has moved:
// the Zuul builds they belong to will not be fetched again.
func (p *Poller) prunePartials(image string) {
	if err := p.opts.Store.RemovePartials(image, ""); err != nil {
		p.log.Warn("could not remove stale partial downloads", "image", image, "error", err)
	}
}

// whyNotDue says why nothing is fetched for Zuul's newest build zb, which the
// cursor has settled, and the image's builds lack nothing they can have.
func (p *Poller) whyNotDue(f *fetch, s state) string {
	cur, ready := s.cur, s.ready
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
			"fetched again when Zuul has a newer build, or now by a gearman image-build:%s job", noNewBuild, f.zb.UUID, cur.Reason, cur.Image)
	}
	if why == noNewBuild && s.verdict == behind {
		why = fmt.Sprintf("%s: Zuul's newest build %s (id %d) is behind the poll cursor (id %d); see zuul-cursor-reset",
			noNewBuild, f.zb.UUID, f.zb.ID, cur.ZuulID)
	}
	return why
}

// missing is the needed formats that this builder's build of the newest Zuul
// build, among the image's ready builds, lacks and has not refused: they are
// fetched into it. nil when it lacks none, or the newest build is another
// builder's, whose files are on its host. A format recorded at its URL only,
// never downloaded, lacks nothing while only clouds that fetch it themselves
// need it.
func (p *Poller) missing(ready []store.Build, zb zuulapi.Build, needed []string) []string {
	if len(ready) == 0 || ready[0].Zuul.UUID != zb.UUID || ready[0].BuilderID != p.opts.Store.BuilderID() {
		return nil
	}
	b := ready[0]
	var missing []string
	for _, f := range needed {
		if _, refused := b.Refused[f]; refused {
			continue
		}
		file, ok := b.File(f)
		switch {
		case ok && file.Present:
		case ok && file.URL != "" && p.opts.Config.FetchedByClouds(b.Image, f):
		default:
			missing = append(missing, f)
		}
	}
	return missing
}
