package main

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/nodepool-builder/nodepool-builder/builder"
	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/internal/escape"
	"github.com/nodepool-builder/nodepool-builder/listing"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/uploader"
)

// adminCommands are the commands that change what the builder does while it runs.
// They open the store without the images-dir lock and only record intent there
// (a build request, a pause, a record marked deleting); the running daemon, or the
// next --once, carries it out.
func adminCommands() []*cli.Command {
	jsonFlag := &cli.BoolFlag{Name: "json", Usage: "print JSON instead of text", DisableDefaultText: true}
	return []*cli.Command{
		{
			Name: "image-status",
			Usage: "show each image's pauses, pending build request, newest ready build, last Zuul build and last failed build; " +
				"and what the daemon runs now: downloads, uploads, builds, gearman jobs, its listener to Zuul's MQTT reports",
			Flags:  []cli.Flag{jsonFlag},
			Action: imageStatus,
		},
		{
			Name:      "image-build",
			Usage:     "request a build of a diskimage; the builder starts it on its next pass",
			ArgsUsage: "<image>",
			Flags:     []cli.Flag{jsonFlag},
			Action:    imageBuild,
		},
		{
			Name:      "dib-image-delete",
			Usage:     "delete a build: its uploads in every cloud, its files and its record",
			ArgsUsage: "<image>-<build_id>",
			Flags:     []cli.Flag{jsonFlag},
			Action:    dibImageDelete,
		},
		{
			Name:  "image-delete",
			Usage: "delete one upload from its cloud (a newest build's upload is made again)",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "provider", Usage: "provider of the upload"},
				&cli.StringFlag{Name: "image", Usage: "image of the upload"},
				&cli.StringFlag{Name: "build-id", Usage: "build id of the upload"},
				&cli.StringFlag{Name: "upload-id", Usage: "upload id, e.g. 0000000001"},
				jsonFlag,
			},
			Action: imageDelete,
		},
		{
			Name:      "image-pause",
			Usage:     "stop building or fetching new builds of an image (uploads go on; a provider's pause stops those)",
			ArgsUsage: "<image>",
			Flags:     []cli.Flag{jsonFlag},
			Action:    func(c *cli.Context) error { return imagePause(c, true) },
		},
		{
			Name:      "image-unpause",
			Usage:     "undo image-pause",
			ArgsUsage: "<image>",
			Flags:     []cli.Flag{jsonFlag},
			Action:    func(c *cli.Context) error { return imagePause(c, false) },
		},
		{
			Name: "zuul-cursor-reset",
			Usage: "forget which Zuul build a zuul-image's poller got to, so that its next poll fetches Zuul's newest " +
				"successful build (after Zuul's database was rebuilt or restored: image-status shows Zuul behind the cursor)",
			ArgsUsage: "<zuul-image>",
			Action:    zuulCursorReset,
		},
		{
			Name:      "alien-image-list",
			Usage:     "list cloud images tagged with this builder's id that it has no record of",
			ArgsUsage: "[provider]",
			Flags:     []cli.Flag{jsonFlag},
			Action:    alienImageList,
		},
	}
}

// adminSession is what every admin command starts from: the config and the store.
type adminSession struct {
	cfg *config.Config
	st  *store.Store
}

// openAdmin loads the config and opens the store: ReadOnly for commands that
// only read, Existing for the commands that record a request.
func openAdmin(c *cli.Context, access store.Access) (*adminSession, error) {
	return openSession(c, access, false)
}

// openListing is openAdmin for the listings, which take no arguments and read
// records only: in ZooKeeper they need no images-dir on this host.
func openListing(c *cli.Context) (*adminSession, error) {
	if err := noArgs(c); err != nil {
		return nil, err
	}
	return openSession(c, store.ReadOnly, true)
}

func openSession(c *cli.Context, access store.Access, stateOnly bool) (*adminSession, error) {
	cfg, err := loadConfig(c)
	if err != nil {
		return nil, err
	}
	st, err := openStore(c, cfg, access, stateOnly)
	if err != nil {
		return nil, err
	}
	return &adminSession{cfg: cfg, st: st}, nil
}

func (a *adminSession) close() { a.st.Close() }

// oneArg returns a command's single positional argument. urfave/cli stops reading
// flags at the first argument, so a stray one usually is a flag put after it.
func oneArg(c *cli.Context, what string) (string, error) {
	switch c.NArg() {
	case 0:
		return "", withCode(exitUsage, fmt.Errorf("%s needs %s; see %s --help", c.Command.Name, what, c.Command.Name))
	case 1:
		return c.Args().First(), nil
	default:
		return "", withCode(exitUsage, fmt.Errorf("%s takes one argument, %s, not %d (%s); put flags such as --json before it",
			c.Command.Name, what, c.NArg(), strings.Join(c.Args().Slice(), " ")))
	}
}

// openImage is openAdmin for a command on one image of the config, named by
// its single argument (what says what it is): the session, the image and
// where it comes from.
func openImage(c *cli.Context, what string) (*adminSession, string, store.SourceName, error) {
	name, err := oneArg(c, what)
	if err != nil {
		return nil, "", "", err
	}
	a, err := openAdmin(c, store.Existing)
	if err != nil {
		return nil, "", "", err
	}
	src, err := a.knownImage(c.Command.Name, name)
	if err != nil {
		a.close()
		return nil, "", "", err
	}
	return a, name, src, nil
}

// knownImage checks that name is an image of the config and says where it comes from.
func (a *adminSession) knownImage(cmd, name string) (store.SourceName, error) {
	switch {
	case a.cfg.DiskImage(name) != nil:
		return store.SourceDIB, nil
	case a.cfg.ZuulImage(name) != nil:
		return store.SourceZuul, nil
	}
	known := strings.Join(a.cfg.ImageNames(), ", ")
	if known == "" {
		known = "none"
	}
	return "", withCode(exitUsage, fmt.Errorf("%s: %q is neither a diskimage nor a zuul-image in %s (images: %s)",
		cmd, name, a.cfg.Path, known))
}

// imageBuild records a manual build request for a diskimage, as nodepool's
// image-build does; it refuses images that a build would not be started for.
func imageBuild(c *cli.Context) error {
	a, name, src, err := openImage(c, "the name of a diskimage")
	if err != nil {
		return err
	}
	defer a.close()
	if src == store.SourceZuul {
		zi := a.cfg.ZuulImage(name)
		return withCode(exitFailed, fmt.Errorf("image-build: %s is a zuul-image: Zuul job %s in %s builds it, and the builder "+
			"fetches each new successful build of that job by itself; to get a new image, run the job in Zuul", name, zi.JobName, zi.Project))
	}
	status, err := a.status(c, name)
	if err != nil {
		return err
	}
	if len(status.PausedBy) > 0 {
		return withCode(exitFailed, fmt.Errorf("image-build: %s is paused (%s), so no build would start; %s, then request the build again",
			name, strings.Join(status.PausedBy, ", "), unpauseHint(a.cfg, name, status.PausedBy)))
	}
	if err := a.st.RequestBuild(c.Context, name); err != nil {
		return withCode(exitFailed, err)
	}
	status, err = a.status(c, name)
	if err != nil {
		return err
	}
	if c.Bool("json") {
		return writeJSON(c.App.Writer, status.JSON())
	}
	if status.Request == nil {
		// The builder took the request up between the two reads.
		fmt.Fprintf(c.App.Writer, "build of %s requested; the builder has taken it up\n", name)
		return nil
	}
	fmt.Fprintf(c.App.Writer, "build of %s requested (pending since %s); the builder starts it on its next pass\n",
		name, status.Request.Format(time.RFC3339))
	return nil
}

// imagePause pauses or unpauses an image at run time; the config's pause is
// separate and only the config can lift it.
func imagePause(c *cli.Context, pause bool) error {
	a, name, src, err := openImage(c, "the name of an image")
	if err != nil {
		return err
	}
	defer a.close()
	if err := a.st.SetPaused(c.Context, name, pause); err != nil {
		return withCode(exitFailed, err)
	}
	status, err := a.status(c, name)
	if err != nil {
		return err
	}
	if c.Bool("json") {
		return writeJSON(c.App.Writer, status.JSON())
	}
	stops, resumes := "starts no builds of it", "starts builds of it again"
	if src == store.SourceZuul {
		stops, resumes = "fetches no new Zuul builds of it", "fetches new Zuul builds of it again"
	}
	switch {
	case pause:
		fmt.Fprintf(c.App.Writer, "%s paused: the builder %s until image-unpause %s; uploads of its builds go on\n", name, stops, name)
	case len(status.PausedBy) > 0:
		fmt.Fprintf(c.App.Writer, "%s unpaused at run time, but it stays paused by %s: %s\n",
			name, strings.Join(status.PausedBy, ", "), unpauseHint(a.cfg, name, status.PausedBy))
	default:
		fmt.Fprintf(c.App.Writer, "%s unpaused: the builder %s\n", name, resumes)
	}
	return nil
}

// unpauseHint says how to lift the pauses that hold an image.
func unpauseHint(cfg *config.Config, name string, pausedBy []string) string {
	var do []string
	for _, by := range pausedBy {
		switch by {
		case store.PausedByCommand:
			do = append(do, "run image-unpause "+name)
		case store.PausedByConfig:
			// A zuul-image's pause is in its zuul-images entry, a diskimage's in nodepool.yaml.
			file := cfg.Path
			if cfg.ZuulImage(name) != nil {
				file = cfg.OwnPath()
			}
			do = append(do, fmt.Sprintf("set pause: false for %s in %s", name, file))
		}
	}
	return strings.Join(do, " and ")
}

// dibImageDelete marks a build and its uploads deleting, as nodepool's
// dib-image-delete does; the builder removes them everywhere on its next pass.
func dibImageDelete(c *cli.Context) error {
	arg, err := oneArg(c, "a build's <image>-<build_id> (dib-image-list shows them)")
	if err != nil {
		return err
	}
	image, id, ok := store.ParseBuildName(arg)
	if !ok {
		return withCode(exitUsage, fmt.Errorf("dib-image-delete: %q is not <image>-<build_id>; dib-image-list shows the builds", arg))
	}
	a, err := openAdmin(c, store.Existing)
	if err != nil {
		return err
	}
	defer a.close()
	unknown := withCode(exitUsage, fmt.Errorf("dib-image-delete: no build %s; dib-image-list shows the builds", arg))
	b, err := a.st.Build(c.Context, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return unknown
	case err != nil:
		return withCode(exitFailed, err)
	case b.Image != image:
		return unknown
	}
	b, err = a.st.ReleaseBuild(c.Context, id, "dib-image-delete")
	switch {
	case errors.Is(err, store.ErrNotFound):
		return unknown
	case errors.Is(err, store.ErrInProgress):
		return withCode(exitFailed, fmt.Errorf("dib-image-delete: %w; wait until it is done (dib-image-list and image-list show "+
			"the states), then delete it", err))
	case err != nil:
		return withCode(exitFailed, err)
	}
	ups, err := a.st.Uploads(c.Context, store.UploadFilter{BuildID: id})
	if err != nil {
		return withCode(exitFailed, err)
	}
	if c.Bool("json") {
		return writeJSON(c.App.Writer, listing.NewBuild(b))
	}
	fmt.Fprintf(c.App.Writer, "%s marked deleting with %d upload(s); the builder deletes them in the clouds, "+
		"then its files and records, on its next pass\n", arg, len(ups))
	return nil
}

// imageDelete marks one upload deleting, as nodepool's image-delete does. When it
// belongs to an image's newest build, the builder uploads that build again.
func imageDelete(c *cli.Context) error {
	if c.NArg() > 0 {
		return withCode(exitUsage, fmt.Errorf("image-delete takes flags only, not %q; see image-delete --help", c.Args().First()))
	}
	var missing []string
	for _, f := range []string{"provider", "image", "build-id", "upload-id"} {
		if c.String(f) == "" {
			missing = append(missing, "--"+f)
		}
	}
	if len(missing) > 0 {
		return withCode(exitUsage, fmt.Errorf("image-delete needs %s; image-list shows the uploads with these values",
			strings.Join(missing, ", ")))
	}
	provider, image, buildID, uploadID := c.String("provider"), c.String("image"), c.String("build-id"), c.String("upload-id")
	a, err := openAdmin(c, store.Existing)
	if err != nil {
		return err
	}
	defer a.close()
	unknown := withCode(exitUsage, fmt.Errorf("image-delete: no upload %s of image %s build %s to provider %s; image-list shows the uploads",
		uploadID, image, buildID, provider))
	u, err := a.findUpload(c, buildID, provider, uploadID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return unknown
	case err != nil:
		return withCode(exitFailed, err)
	case u.Image != image:
		return unknown
	}
	u, err = a.st.ReleaseUpload(c.Context, buildID, provider, uploadID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return unknown
	case errors.Is(err, store.ErrInProgress):
		return withCode(exitFailed, fmt.Errorf("image-delete: %w; wait until it is ready or failed (image-list shows its state), "+
			"then delete it", err))
	case err != nil:
		return withCode(exitFailed, err)
	}
	if c.Bool("json") {
		return writeJSON(c.App.Writer, listing.NewUpload(u))
	}
	fmt.Fprintf(c.App.Writer, "upload %s of %s to %s (cloud image %s) marked deleting; the builder deletes it in the cloud "+
		"on its next pass\n", uploadID, store.BuildName(image, buildID), provider, orNone(u.ExternalID))
	if a.cfg.Provider(provider) == nil {
		fmt.Fprintf(c.App.Writer, "note: provider %s is not in %s, so the builder cannot reach its cloud until it is added back\n",
			provider, a.cfg.Path)
	}
	return nil
}

// findUpload returns one upload by its key, or an error wrapping store.ErrNotFound.
func (a *adminSession) findUpload(c *cli.Context, buildID, provider, id string) (store.Upload, error) {
	ups, err := a.st.Uploads(c.Context, store.UploadFilter{BuildID: buildID, Provider: provider})
	if err != nil {
		return store.Upload{}, err
	}
	for _, u := range ups {
		if u.ID == id {
			return u, nil
		}
	}
	return store.Upload{}, store.ErrNotFound
}

// alienJSON is an alien-image-list row in --json output.
type alienJSON struct {
	Provider   string `json:"provider"`
	Name       string `json:"name"`
	ExternalID string `json:"external_id"`
}

// alienImageList lists the cloud images tagged with this builder's id whose upload
// the store does not hold: what the leak sweep deletes once it sees them twice.
func alienImageList(c *cli.Context) error {
	if c.NArg() > 1 {
		return withCode(exitUsage, fmt.Errorf("alien-image-list takes at most one provider, not %d arguments; put flags such as --json before it", c.NArg()))
	}
	provider := c.Args().First()
	log, err := newLogger(c)
	if err != nil {
		return err
	}
	a, err := openAdmin(c, store.ReadOnly)
	if err != nil {
		return err
	}
	defer a.close()
	if provider != "" && a.cfg.Provider(provider) == nil {
		var names []string
		for _, p := range a.cfg.Providers {
			names = append(names, p.Name)
		}
		return withCode(exitUsage, fmt.Errorf("alien-image-list: %q is not an openstack provider in %s (providers: %s)",
			provider, a.cfg.Path, orNone(strings.Join(names, ", "))))
	}
	providers := a.cfg.Providers
	if provider != "" {
		providers = []config.Provider{*a.cfg.Provider(provider)}
	}
	// Opened as the daemon opens them, so that the listing is the leak sweep's.
	clouds, err := builder.OpenClouds(c.Context, providers, builder.OpenStack(log))
	if err != nil {
		return withCode(exitUsage, err)
	}
	up := uploader.New(uploader.Options{Store: a.st, Config: a.cfg, Clouds: clouds, Logger: log})
	leaks, err := up.Leaks(c.Context, provider)
	// What could be listed is shown even when a cloud failed to answer; when
	// anything else failed (the store), nothing is.
	var notListed []string
	var listErrs []error
	if err != nil {
		for _, e := range unjoin(err) {
			var le *uploader.ListError
			if !errors.As(e, &le) {
				return withCode(exitFailed, fmt.Errorf("alien-image-list: %w", err))
			}
			notListed = append(notListed, le.Provider)
			listErrs = append(listErrs, e)
		}
	}
	if c.Bool("json") {
		rows := make([]alienJSON, 0, len(leaks))
		for _, l := range leaks {
			rows = append(rows, alienJSON{l.Provider, l.Image.Name, l.Image.ID})
		}
		if err := writeJSON(c.App.Writer, rows); err != nil {
			return err
		}
	} else {
		t := listing.Table{Header: []string{"Provider", "Name", "Image ID"}}
		for _, l := range leaks {
			t.Add(l.Provider, l.Image.Name, l.Image.ID)
		}
		t.Write(c.App.Writer)
	}
	if len(notListed) > 0 {
		return withCode(exitFailed, &listIncomplete{providers: notListed, errs: listErrs, err: err})
	}
	return nil
}

// listIncomplete is an alien-image-list printed without the images of the
// providers whose clouds could not be listed.
type listIncomplete struct {
	providers []string
	errs      []error
	err       error
}

// Error names the providers missing from the list, then each one's error a
// line, its control characters escaped.
func (e *listIncomplete) Error() string {
	which := "provider " + e.providers[0] + " are not in it: its cloud could not be listed; run it again once the cloud answers"
	if len(e.providers) > 1 {
		which = "providers " + strings.Join(e.providers, ", ") + " are not in it: their clouds could not be listed; " +
			"run it again once the clouds answer"
	}
	lines := []string{e.head() + ": the images of " + which + ":"}
	for _, err := range e.errs {
		lines = append(lines, escape.Controls(err.Error()))
	}
	return strings.Join(lines, "\n")
}

func (e *listIncomplete) head() string { return "alien-image-list is incomplete" }

func (e *listIncomplete) record() (string, []any) {
	return e.head(), []any{"providers_not_listed", e.providers, "errors", errorTexts(e.errs)}
}

func (e *listIncomplete) Unwrap() error { return e.err }

// zuulCursorReset resets a zuul-image's poll cursor (the store takes the
// image's build lock, the lock a poll takes to fetch): the next poll takes
// Zuul's newest successful build as new.
func zuulCursorReset(c *cli.Context) error {
	a, name, src, err := openImage(c, "the name of a zuul-image")
	if err != nil {
		return err
	}
	defer a.close()
	zi := a.cfg.ZuulImage(name)
	if src != store.SourceZuul || zi == nil {
		return withCode(exitUsage, fmt.Errorf("zuul-cursor-reset: %s is a diskimage, not a zuul-image: it has no poll cursor", name))
	}
	was, refused, err := a.st.ResetCursor(c.Context, name, "reset by zuul-cursor-reset")
	if errors.Is(err, store.ErrHeld) {
		return withCode(exitFailed, fmt.Errorf("zuul-cursor-reset: %s's build lock is held: a builder is fetching it; "+
			"try again when the fetch is done (image-status shows it)", name))
	}
	if err != nil {
		return withCode(exitFailed, fmt.Errorf("zuul-cursor-reset: %w", err))
	}
	w := c.App.Writer
	switch {
	case refused != nil:
		fmt.Fprintf(w, "poll cursor of %s reset; the one it replaced was refused: %s\n", name, escape.Controls(refused.Error()))
	case was.ZuulUUID == "":
		fmt.Fprintf(w, "poll cursor of %s reset; it had settled no Zuul build\n", name)
	default:
		fmt.Fprintf(w, "poll cursor of %s reset; it was at Zuul build %s (id %d, %s, recorded %s)",
			name, escape.Controls(was.ZuulUUID), was.ZuulID, was.Outcome, was.Time.Format(time.RFC3339))
		if was.BehindID != 0 {
			fmt.Fprintf(w, ", and Zuul's newest build (id %d) was behind it", was.BehindID)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "the builder fetches Zuul's newest successful build of job %s in %s on its next poll of %s\n",
		zi.JobName, zi.Project, name)
	return nil
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
