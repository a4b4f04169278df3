// Package poller turns new Zuul image builds into store builds: it asks the Zuul
// builds API for the newest successful build of each zuul-image's job and fetches
// the formats the providers need.
package poller

import (
	"context"
	"crypto/md5"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nodepool-builder/nodepool-builder/artifacts"
	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/internal/follow"
	"github.com/nodepool-builder/nodepool-builder/internal/hostpattern"
	"github.com/nodepool-builder/nodepool-builder/internal/redact"
	"github.com/nodepool-builder/nodepool-builder/internal/untrusted"
	"github.com/nodepool-builder/nodepool-builder/metrics"
	"github.com/nodepool-builder/nodepool-builder/qemuimg"
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
	// Streamer, when set, uploads a new build's format while it downloads.
	Streamer Streamer
}

// Streamer starts the uploads of a format of a build being made as it is
// fetched (uploader.Stream): those that follow its download from src (none
// when src is nil), and those whose cloud fetches the artifact itself. It
// returns nil when no provider begins one, and whether the format is to be
// downloaded: false when only clouds that fetch it themselves need it.
type Streamer interface {
	Stream(b store.Build, a Artifact, src *follow.File) (Streaming, bool)
}

// Artifact is a format of a Zuul build as its artifact publishes it, for the
// Streamer.
type Artifact struct {
	// Declared is the file as the artifact declares it.
	Declared store.File
	// URL is where a cloud may fetch the image itself (web-download); ""
	// when no cloud may, and NotWeb says why.
	URL, NotWeb string
}

// Streaming is the uploads that follow one download: told when the file is
// verified, which lets them complete, and how the build ended, which makes
// them ready or deletes their images.
type Streaming interface {
	Verified(f store.File)
	Settle(ready bool, why error)
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

// Make fetches the formats of the job's Zuul build into w: a new build, or
// one that lacks formats now needed. Failed, nothing of a new build stays on
// disk but resumable downloads. A format newly needed that is refused for good
// (a checksum, an unsafe image) is recorded on the build and not fetched again.
func (f *fetch) Make(ctx context.Context, w *store.BuildWriter) error {
	p := f.p
	if !f.into {
		p.log.Info("new Zuul build", "image", f.zi.Name, "zuul_build", f.zb.UUID, "zuul_id", f.zb.ID,
			"end_time", f.zb.EndTime, "formats", f.needed)
		if err := f.fetch(ctx, w, &f.streams); err != nil {
			return fmt.Errorf("fetch Zuul build %s of %s: %w", f.zb.UUID, f.zi.Name, err)
		}
		return nil
	}
	err := f.fetch(ctx, w, nil)
	var rf *refusedFormat
	if errors.As(err, &rf) {
		// Recorded, so that the next poll does not fetch it again.
		if werr := w.Refuse(context.WithoutCancel(ctx), rf.format, rf.err.Error()); werr != nil {
			err = errors.Join(err, werr)
		}
	}
	if err != nil {
		return fmt.Errorf("fetch %v of Zuul build %s of %s: %w", f.needed, f.zb.UUID, f.zi.Name, err)
	}
	return nil
}

// fetch downloads each needed format once, as the job's plan says, verified
// and in place, and records it. A format that is not published but can be
// converted from one that is, is. With streams set (a new build), the
// providers that need a format as it is published upload it while it
// downloads (see stream), and streams gets them.
func (f *fetch) fetch(ctx context.Context, w *store.BuildWriter, streams *[]Streaming) error {
	p, zi, zb := f.p, f.zi, f.zb
	if f.refusal != nil {
		return f.refusal
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
	plan, matched, convert := f.plan.plan, f.plan.matched, f.plan.convert
	b := w.Build()
	inspected := map[string]qemuimg.Info{}
	for _, format := range plan {
		c := matched[format]
		sha, md5 := artifacts.Checksums(c)
		if sha == "" && zi.RequireChecksum {
			return refuse(format, fmt.Errorf("artifact %q (%s) has no sha256 in its metadata and require-checksum is set", c.Name, format))
		}
		declared := store.File{Format: format, SHA256: sha, MD5: md5, Size: declaredSize(c)}
		var src *follow.File
		var stream Streaming
		download := true
		if streams != nil {
			src, stream, download = p.stream(zi, b, c, declared)
			if stream != nil {
				*streams = append(*streams, stream)
			}
		}
		if !download && !slices.Contains(slices.Collect(maps.Values(convert)), format) {
			// Only clouds that fetch the artifact themselves need it.
			declared.URL = redact.URL(c.URL) // as it is: stream saw no secret in it
			if err := w.AddAtURL(declared); err != nil {
				return err
			}
			p.log.Info("not downloading a format only clouds that fetch it themselves need (web-download)", "image", b.Image,
				"build", b.ID, "format", format)
			continue
		}
		files, err := w.Download(format)
		if err != nil {
			return err
		}
		began := time.Now()
		res, err := fetcher.Fetch(ctx, artifacts.Request{
			URL:    c.URL,
			Files:  files,
			SHA256: sha,
			MD5:    md5,
			Size:   declaredSize(c),
			Label:  b.Name() + "." + format,
			Hosts:  hosts,
			Follow: src,
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
		img, err := p.inspect(ctx, w, files.Dest, format, limit)
		if err != nil {
			return fmt.Errorf("artifact %q (%s): %w", c.Name, format, err)
		}
		f := store.File{Format: format, SHA256: res.SHA256, MD5: res.MD5, Size: res.Size, URL: redact.URL(c.URL)}
		if err := w.Add(f); err != nil {
			return err
		}
		if stream != nil {
			// Verified and in place: the uploads that followed the download
			// send its end.
			stream.Verified(f)
		}
		// Converted from where Add put it.
		if img.Path, err = w.Path(format); err != nil {
			return err
		}
		inspected[format] = img
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

// stream starts the uploads of a format of new build b as it is fetched:
// those that follow its download, whose src is what the download tells how
// far it has written, and those whose cloud fetches artifact c itself. Only
// an artifact that declares both its sha256 and its md5, as Zuul's image
// jobs publish them, is uploaded as it is fetched: its cloud images are
// tagged with them from the start, and what a cloud fetched is checked
// against them. Any other waits for its download, as a converted format
// does. download is false when only clouds that fetch the artifact
// themselves need the format.
func (p *Poller) stream(zi *config.ZuulImage, b store.Build, c artifacts.Candidate, declared store.File) (*follow.File, Streaming, bool) {
	if p.opts.Streamer == nil {
		return nil, nil, true
	}
	a := Artifact{Declared: declared}
	a.URL, a.NotWeb = webURL(zi, c)
	var src *follow.File
	// The digests are Zuul's answer, and tag the cloud images before the
	// download is checked against them: only digests as they are written go.
	if isDigest(declared.SHA256, sha256.Size) && isDigest(declared.MD5, md5.Size) {
		src = follow.New()
	} else if a.URL != "" {
		a.URL, a.NotWeb = "", "the artifact does not declare both its sha256 and its md5, to check what the cloud fetched against"
	}
	s, download := p.opts.Streamer.Stream(b, a, src)
	if s == nil && src != nil {
		src.Close()
		src = nil
	}
	return src, s, download
}

// webURL is the address a cloud may fetch artifact c at itself
// (web-download), or why no cloud may: the artifact must be the image as it
// is (Glance does not decompress zstd, and decompresses gzip only with an
// import plugin the builder cannot ask about), its URL must hold no secret
// (the cloud keeps it in its import task, which the project's users read),
// and its host must be one the operator named in artifact-hosts or api-url:
// the cloud fetches from its own network, where the builder cannot check
// the addresses a name resolves to, so a host the build's log_url alone
// allows is not handed on.
func webURL(zi *config.ZuulImage, c artifacts.Candidate) (string, string) {
	if z := artifacts.Compression(c.URL); z != "" {
		return "", fmt.Sprintf("the artifact is served compressed (%s), which a cloud's import does not undo", z)
	}
	if redact.URL(c.URL) != c.URL {
		return "", "the artifact's URL holds credentials (userinfo or a query), which are not handed to the cloud"
	}
	named, err := namedHosts(zi)
	if err != nil {
		return "", err.Error()
	}
	if err := named.Check(c.URL); err != nil {
		return "", "the artifact's host is not named in the zuul-image's artifact-hosts or api-url (the build's log_url " +
			"allowed it): the cloud fetches from its own network, so only hosts named by the operator are handed to it"
	}
	return c.URL, ""
}

// isDigest tells whether s is a lower-case hex digest of size bytes, as
// artifacts.Checksums returns one.
func isDigest(s string, size int) bool {
	b, err := hex.DecodeString(s)
	return err == nil && len(b) == size && s == strings.ToLower(s)
}

// artifactHosts is what the downloads of a build may reach: the zuul-image's
// artifact-hosts, all named by the operator; or, without them, the api-url's host
// and port, named by the operator, and the build's log_url host on any port, which
// Zuul's answer names and which may therefore not be on an internal address.
func artifactHosts(zi *config.ZuulImage, zb zuulapi.Build) (*artifacts.Hosts, error) {
	hosts, err := namedHosts(zi)
	if err != nil || zi.ArtifactHosts != nil {
		return hosts, err
	}
	if zb.LogURL != "" {
		// A log_url that is no URL allows nothing more; its artifacts are refused.
		if logs, err := hostpattern.FromURL(zb.LogURL, false); err == nil {
			hosts.Allow(logs)
		}
	}
	return hosts, nil
}

// namedHosts is the artifact hosts the operator named: the zuul-image's
// artifact-hosts, or, without them, the api-url's host and port.
func namedHosts(zi *config.ZuulImage) (*artifacts.Hosts, error) {
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
func (p *Poller) convertFormat(ctx context.Context, w *store.BuildWriter, src qemuimg.Info, dst string, limit int64) error {
	b := w.Build()
	if err := qemuimg.Installed(p.opts.QemuImg); err != nil {
		return fmt.Errorf("convert %s to %s: %w", src.Format, dst, err)
	}
	out, err := w.Temp(dst)
	if err != nil {
		return err
	}
	p.log.Info("converting", "image", b.Image, "build", b.ID, "from", src.Format, "to", dst, "virtual_size", src.VirtualSize)
	if err := qemuimg.Convert(ctx, p.opts.QemuImg, src, out, dst); err != nil {
		return err
	}
	if _, err := p.inspect(ctx, w, out, dst, limit); err != nil {
		return err
	}
	sha, md, size, err := store.HashFile(ctx, out)
	if err != nil {
		return errors.Join(err, w.Discard(dst))
	}
	return w.Add(store.File{Format: dst, SHA256: sha, MD5: md, Size: size})
}

// inspect checks a fetched or converted file of w with qemu-img, and the size
// of the disk it holds against limit (builder.max-image-size); an unsafe or too
// large one is discarded and its format refused for good.
func (p *Poller) inspect(ctx context.Context, w *store.BuildWriter, path, format string, limit int64) (qemuimg.Info, error) {
	img, err := qemuimg.Inspect(ctx, p.opts.QemuImg, path, format)
	if err == nil {
		if err = img.CheckSize(limit); err == nil {
			return img, nil
		}
		err = fmt.Errorf("%w (%s)", err, maxImageSize(limit))
	}
	if derr := w.Discard(format); derr != nil {
		err = errors.Join(err, derr)
	}
	if errors.Is(err, untrusted.ErrUnsafe) || errors.Is(err, untrusted.ErrTooLarge) {
		return qemuimg.Info{}, refuse(format, err)
	}
	return qemuimg.Info{}, fmt.Errorf("check %s image %s: %w", format, path, err)
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
