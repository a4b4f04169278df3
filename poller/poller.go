// Package poller turns new Zuul image builds into store builds: it asks the Zuul
// builds API for the newest successful build of each zuul-image's job and fetches
// the formats the providers need.
package poller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"slices"
	"time"

	"github.com/nodepool-builder/nodepool-builder/artifacts"
	"github.com/nodepool-builder/nodepool-builder/config"
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
	// QemuImg is the qemu-img binary used to convert a published format into a
	// needed one; empty means "qemu-img" from PATH.
	QemuImg string
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
	client, ok := p.opts.Clients[image]
	if !ok {
		return out, fmt.Errorf("poll %s: no Zuul client", image)
	}
	zbs, err := client.Builds(ctx, zuulapi.Query{
		Project:   zi.Project,
		Branch:    zi.Branch,
		JobName:   zi.Job,
		Pipelines: zi.Pipelines,
		Result:    "SUCCESS",
		Complete:  true,
		Limit:     1,
	})
	if err != nil {
		return out, fmt.Errorf("poll %s: ask Zuul for builds of %s: %w", image, zi.Job, err)
	}
	if len(zbs) == 0 {
		out.Skipped = "Zuul has no successful build of job " + zi.Job
		return out, nil
	}
	zb := zbs[0]
	cur, err := p.opts.Store.Cursor(ctx, image)
	if err != nil {
		return out, err
	}
	if zb.ID <= cur.ZuulID {
		return p.complete(ctx, out, zi, zb, needed)
	}
	b, err := p.ingest(ctx, zi, zb, needed)
	if err != nil {
		return out, err
	}
	out.Ingested = &b
	return out, nil
}

// ingest fetches a new Zuul build's needed formats into a new store build. The
// build becomes ready and the cursor moves in one write, so a crash leaves either
// a build to settle and fetch again, or both done.
func (p *Poller) ingest(ctx context.Context, zi *config.ZuulImage, zb zuulapi.Build, needed []string) (store.Build, error) {
	st := p.opts.Store
	log := p.log.With("image", zi.Name, "zuul_build", zb.UUID)
	log.Info("new Zuul build", "zuul_id", zb.ID, "end_time", zb.EndTime, "formats", needed)
	b, err := st.CreateBuild(ctx, store.Build{
		Image:  zi.Name,
		Source: store.SourceZuul,
		Zuul:   store.ZuulRef{UUID: zb.UUID, ID: zb.ID, EndTime: zb.EndTime, LogURL: zb.LogURL},
	})
	if err != nil {
		return b, err
	}
	err = p.fetch(ctx, zi, zb, &b, needed)
	if err == nil {
		ready := b
		ready.SetState(store.Ready, st.Now())
		cur := store.Cursor{Image: zi.Name, ZuulID: zb.ID, ZuulUUID: zb.UUID, Outcome: "ready", Time: st.Now()}
		if err = st.Write(ctx, store.PutBuild(&ready), store.PutCursor(cur)); err == nil {
			log.Info("build ready", "build", b.ID)
			p.prunePartials(zi.Name)
			return ready, nil
		}
	}
	// Failed: nothing of it stays on disk but resumable downloads.
	werr := fmt.Errorf("fetch Zuul build %s of %s: %w", zb.UUID, zi.Name, err)
	ctx = context.WithoutCancel(ctx)
	failed := b
	failed.SetState(store.Failed, st.Now())
	failed.Reason = err.Error()
	changes := []store.Change{store.PutBuild(&failed)}
	refused := errors.Is(err, ErrRefused)
	if refused {
		// Settled for good: the next poll waits for a newer Zuul build.
		changes = append(changes, store.PutCursor(store.Cursor{Image: zi.Name, ZuulID: zb.ID, ZuulUUID: zb.UUID,
			Outcome: "failed", Reason: err.Error(), Time: st.Now()}))
	}
	if serr := st.Write(ctx, changes...); serr != nil {
		return b, errors.Join(werr, serr)
	}
	if rerr := st.RemoveBuildFiles(b.Image, b.ID); rerr != nil {
		log.Warn("could not remove files of failed build", "error", rerr)
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

// complete fetches formats that became needed after the newest build was ingested.
func (p *Poller) complete(ctx context.Context, out Outcome, zi *config.ZuulImage, zb zuulapi.Build, needed []string) (Outcome, error) {
	builds, err := p.opts.Store.Builds(ctx, store.BuildFilter{Image: zi.Name, State: store.Ready})
	if err != nil {
		return out, err
	}
	if len(builds) == 0 || builds[0].Zuul.UUID != zb.UUID {
		out.Skipped = "no new Zuul build"
		return out, nil
	}
	b := builds[0]
	var missing []string
	for _, f := range needed {
		if file, ok := b.File(f); !ok || !file.Present {
			missing = append(missing, f)
		}
	}
	if len(missing) == 0 {
		out.Skipped = "no new Zuul build"
		return out, nil
	}
	p.log.Info("fetching formats newly needed", "image", zi.Name, "build", b.ID, "formats", missing)
	if err := p.fetch(ctx, zi, zb, &b, missing); err != nil {
		return out, fmt.Errorf("fetch %v of Zuul build %s of %s: %w", missing, zb.UUID, zi.Name, err)
	}
	out.Ingested = &b
	return out, nil
}

// fetch downloads each needed format once, verified and in place, and records it.
// A format that is not published but can be converted from one that is, is.
func (p *Poller) fetch(ctx context.Context, zi *config.ZuulImage, zb zuulapi.Build, b *store.Build, needed []string) error {
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
	available := artifacts.Available(cands, mappings)
	plan, convert, err := planFormats(needed, available)
	if err != nil {
		return err
	}
	matched, err := artifacts.Match(cands, mappings, plan)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrRefused, err)
	}
	for _, format := range plan {
		c := matched[format]
		sha, md5 := artifacts.Checksums(c)
		if sha == "" && zi.RequireChecksum {
			return fmt.Errorf("%w: artifact %q (%s) has no sha256 in its metadata and require-checksum is set", ErrRefused, c.Name, format)
		}
		dest := p.opts.Store.FilePath(b.Image, b.ID, format)
		res, err := fetcher.Fetch(ctx, artifacts.Request{
			URL:    c.URL,
			Dest:   dest,
			Key:    store.PartialKey(b.Image, zb.UUID, format),
			SHA256: sha,
			MD5:    md5,
		})
		if errors.Is(err, artifacts.ErrChecksum) {
			return fmt.Errorf("%w: artifact %q (%s): %w", ErrRefused, c.Name, format, err)
		}
		if err != nil {
			return fmt.Errorf("download artifact %q (%s): %w", c.Name, format, err)
		}
		if err := p.record(ctx, b, format, res.SHA256, res.MD5, res.Size, c.URL); err != nil {
			return err
		}
	}
	for dst, src := range convert {
		if err := p.convertFormat(ctx, b, src, dst); err != nil {
			return err
		}
	}
	return nil
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

func (p *Poller) convertFormat(ctx context.Context, b *store.Build, src, dst string) error {
	st := p.opts.Store
	if _, err := exec.LookPath(p.opts.QemuImg); err != nil {
		return fmt.Errorf("convert %s to %s: %s is not installed: %w", src, dst, p.opts.QemuImg, err)
	}
	in, out := st.FilePath(b.Image, b.ID, src), st.FilePath(b.Image, b.ID, dst)
	p.log.Info("converting", "image", b.Image, "build", b.ID, "from", src, "to", dst)
	if err := artifacts.Convert(ctx, p.opts.QemuImg, in, src, out, dst); err != nil {
		return err
	}
	sha, md, size, err := store.HashFile(out)
	if err != nil {
		return err
	}
	return p.record(ctx, b, dst, sha, md, size, "")
}

// record writes a verified file's sidecars and adds it to the build's record.
func (p *Poller) record(ctx context.Context, b *store.Build, format, sha, md5 string, size int64, url string) error {
	path := p.opts.Store.FilePath(b.Image, b.ID, format)
	if err := store.WriteSidecars(path, sha, md5); err != nil {
		return err
	}
	next := *b
	next.SetFile(store.File{Format: format, SHA256: sha, MD5: md5, Size: size, URL: url, Present: true})
	if err := p.opts.Store.Write(ctx, store.PutBuild(&next)); err != nil {
		return fmt.Errorf("record %s file of %s: %w", format, b.Name(), err)
	}
	*b = next
	return nil
}
