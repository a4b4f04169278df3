// Command nodepool-builder keeps OpenStack clouds supplied with fresh disk images
// built by Zuul jobs: as a daemon, or once from cron with --once.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/nodepool-builder/nodepool-builder/builder"
	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/internal/escape"
	"github.com/nodepool-builder/nodepool-builder/internal/redact"
	"github.com/nodepool-builder/nodepool-builder/state"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// Exit codes.
const (
	exitOK     = 0
	exitFailed = 1 // something the run tried failed
	exitUsage  = 2 // bad config or usage
	exitLocked = 3 // another builder holds the images-dir
)

// exitError carries an exit code up to main.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func withCode(code int, err error) error {
	if err == nil {
		return nil
	}
	return &exitError{code: code, err: err}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run is the whole program: it parses args, does the work and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	app := newApp(stdout, stderr)
	// The error that ends the program is written in the --log-format of its
	// logs, once the flags are read; before that, as text.
	logFormat := "text"
	checks := app.Before
	app.Before = func(c *cli.Context) error {
		if f := c.String("log-format"); f == "json" {
			logFormat = f
		}
		return checks(c)
	}
	err := app.RunContext(ctx, args)
	if err == nil {
		return exitOK
	}
	code := exitUsage // anything urfave/cli reports itself is a usage error
	var ee *exitError
	if errors.As(err, &ee) {
		code = ee.code
	}
	reportExit(stderr, logFormat, code, err)
	return code
}

// recorded is an error made of parts (the failed steps of a --once run, the
// providers an incomplete listing lacks) that a JSON record gives as
// attributes of their own beside its message.
type recorded interface {
	error
	record() (msg string, attrs []any)
}

// reportExit writes the error that ends the program: text, or with
// --log-format json one JSON log record, as the logs before it. The failures of
// a --once run are listed in it, and the providers an incomplete
// alien-image-list lacks. Errors carry what Zuul, clouds and the state
// said: as text, their control characters are printed escaped, but for the
// newlines that part an error's problems (a config's, say); a --once summary
// has one line for each failed step, whatever its error holds. Like every log
// line, it shows no userinfo of a URL.
func reportExit(w io.Writer, format string, code int, err error) {
	if format != "json" {
		lines := strings.Split(redact.Userinfo(err.Error()), "\n")
		for i, l := range lines {
			lines[i] = escape.Controls(l)
		}
		fmt.Fprintln(w, "nodepool-builder:", strings.Join(lines, "\n"))
		return
	}
	log := slog.New(redact.Handler(slog.NewJSONHandler(w, nil)))
	var rec recorded
	if errors.As(err, &rec) {
		msg, attrs := rec.record()
		log.Error(msg, append(attrs, "exit_code", code)...)
		return
	}
	log.Error("nodepool-builder failed", "error", err.Error(), "exit_code", code)
}

// reportWarnings writes what config-validate warns of, before its verdict: a
// line of text each, or with --log-format json a JSON log record each.
func reportWarnings(w io.Writer, format string, warnings []string) {
	log := slog.New(redact.Handler(slog.NewJSONHandler(w, nil)))
	for _, warning := range warnings {
		if format == "json" {
			log.Warn(warning)
		} else {
			fmt.Fprintln(w, "nodepool-builder: warning:", escape.Controls(redact.Userinfo(warning)))
		}
	}
}

func newApp(stdout, stderr io.Writer) *cli.App {
	jsonFlag := &cli.BoolFlag{Name: "json", Usage: "print JSON instead of a table", DisableDefaultText: true}
	return &cli.App{
		Name:      "nodepool-builder",
		Usage:     "keep clouds supplied with fresh disk images built by Zuul and diskimage-builder",
		Version:   versionText(),
		Writer:    stdout,
		ErrWriter: stderr,
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "config", Aliases: []string{"c"}, Value: "/etc/nodepool/nodepool.yaml", Usage: "nodepool.yaml to use"},
			&cli.StringFlag{Name: "builder-config", Usage: "the builder's own config file (zuul-images, builder)",
				DefaultText: config.BuilderFileName + " beside --config, when it exists"},
			&cli.StringFlag{Name: "secure", Aliases: []string{"s"},
				Usage: "nodepool's secure file, read over --config as nodepool reads it: zookeeper-servers, zookeeper-tls, diskimages' env-vars"},
			&cli.StringFlag{Name: "log-format", Value: "text", Usage: "log format: text or json"},
			&cli.BoolFlag{Name: "debug", Aliases: []string{"d"}, Usage: "log debug messages (nodepool's -d; the builder always runs in the foreground)", DisableDefaultText: true},
			&cli.BoolFlag{Name: "foreground", Aliases: []string{"f"}, Usage: "accepted for nodepool's -f; the builder always runs in the foreground", DisableDefaultText: true},
			&cli.StringFlag{Name: "pid-file", Aliases: []string{"p"}, Usage: "write the builder's pid to this file while it runs"},
			// No Value: unset, builder.upload-workers applies.
			&cli.IntFlag{Name: "upload-workers", Usage: "concurrent uploads", DefaultText: "builder.upload-workers of the config, else 4"},
			&cli.IntFlag{Name: "build-workers", Value: 1, Usage: "concurrent diskimage-builder builds"},
			&cli.BoolFlag{Name: "once", Usage: "do every due step once (poll, fetch, build, upload, retain, delete, sweep), then exit", DisableDefaultText: true},
			&cli.DurationFlag{Name: "progress-interval", Value: 30 * time.Second,
				Usage: "how often a line is logged per running download, upload and build, when no bars are drawn"},
		}, refusedFlags()...),
		ExitErrHandler: func(*cli.Context, error) {},
		Before:         checkFlags,
		Action: func(c *cli.Context) error {
			if c.Args().Present() {
				return withCode(exitUsage, fmt.Errorf("unknown command %q; see --help", c.Args().First()))
			}
			return runBuilder(c)
		},
		Commands: append([]*cli.Command{
			{
				Name:   "config-validate",
				Usage:  "check the config file, and everything the builder checks on this host before its first step, and exit",
				Action: configValidate,
			},
			{
				Name:   "image-list",
				Usage:  "list uploads (images in the clouds)",
				Flags:  []cli.Flag{jsonFlag},
				Action: imageList,
			},
			{
				Name:   "dib-image-list",
				Usage:  "list builds (image files on this builder)",
				Flags:  []cli.Flag{jsonFlag},
				Action: dibImageList,
			},
			{
				Name: "zookeeper-import",
				Usage: "copy the images-dir's SQLite state (builds, uploads, poll cursors, pauses, build requests) into the " +
					"config's zookeeper-servers, so that the builder keeps its uploads there; run it once, with the builder stopped",
				Action: zookeeperImport,
			},
			{
				Name: "take-over-images-dir",
				Usage: "make an images-dir that another builder used (a Python nodepool-builder's, or this builder's with its state lost) this builder's: it " +
					"becomes that builder, and leaves the files it has no record of as they are; run it once, with both builders stopped",
				Action: takeOverImagesDir,
			},
		}, adminCommands()...),
	}
}

// refused are nodepool-builder's flags that mean nothing here, with what to do
// instead.
var refused = map[string]string{
	"l":    "-l (a Python logging config) is not read: use --log-format text|json and --debug",
	"fake": "--fake is not supported: give a diskimage a dib-cmd that fakes diskimage-builder instead",
}

func refusedFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "l", Hidden: true},
		&cli.BoolFlag{Name: "fake", Hidden: true},
	}
}

// checkFlags refuses nodepool's flags that would do nothing here, and worker
// counts below one.
func checkFlags(c *cli.Context) error {
	for _, name := range []string{"l", "fake"} {
		if c.IsSet(name) {
			return withCode(exitUsage, errors.New(refused[name]))
		}
	}
	if c.Duration("progress-interval") <= 0 {
		return withCode(exitUsage, fmt.Errorf("--progress-interval %s: give a duration above 0", c.Duration("progress-interval")))
	}
	for _, name := range []string{"upload-workers", "build-workers"} {
		if c.IsSet(name) && c.Int(name) < 1 {
			return withCode(exitUsage, fmt.Errorf("--%s %d: give 1 or more", name, c.Int(name)))
		}
	}
	return nil
}

func newLogger(c *cli.Context) (*slog.Logger, error) {
	return newLoggerTo(c, c.App.ErrWriter)
}

// newLoggerTo is newLogger writing to w.
func newLoggerTo(c *cli.Context, w io.Writer) (*slog.Logger, error) {
	level := slog.LevelInfo
	if c.Bool("debug") {
		level = slog.LevelDebug
	}
	opts := &slog.HandlerOptions{Level: level}
	switch f := c.String("log-format"); f {
	case "text":
		return slog.New(redact.Handler(slog.NewTextHandler(w, opts))), nil
	case "json":
		return slog.New(redact.Handler(slog.NewJSONHandler(w, opts))), nil
	default:
		return nil, withCode(exitUsage, fmt.Errorf("--log-format %q: use text or json", f))
	}
}

func loadConfig(c *cli.Context) (*config.Config, error) {
	cfg, err := config.Load(config.Files{Nodepool: c.String("config"), Builder: c.String("builder-config"), Secure: c.String("secure")})
	if err != nil {
		return nil, withCode(exitUsage, err)
	}
	return cfg, nil
}

// importCheckTimeout bounds config-validate's questions to the clouds of the
// providers whose upload-method is an import.
const importCheckTimeout = 30 * time.Second

func configValidate(c *cli.Context) error {
	if err := noArgs(c); err != nil {
		return err
	}
	cfg, err := loadConfig(c)
	if err != nil {
		return err
	}
	// What the builder checks before its first step.
	warnings, err := builder.Check(c.Context, cfg)
	if err == nil {
		// Then, of the clouds it can reach, whether they offer the import
		// methods that providers ask for.
		ctx, cancel := context.WithTimeout(c.Context, importCheckTimeout)
		problems, more := builder.CheckImportMethods(ctx, cfg, builder.OpenStack(slog.New(slog.DiscardHandler)))
		cancel()
		warnings = append(warnings, more...)
		if len(problems) > 0 {
			err = &builder.CheckError{Path: cfg.Path, Problems: problems}
		}
	}
	reportWarnings(c.App.ErrWriter, c.String("log-format"), warnings)
	if err != nil {
		return withCode(exitUsage, err)
	}
	files := []string{cfg.Path}
	if cfg.BuilderPath != "" {
		files = append(files, cfg.BuilderPath)
	}
	if cfg.SecurePath != "" {
		files = append(files, "the secure file "+cfg.SecurePath)
	}
	valid := files[0] + " is"
	if n := len(files); n > 1 {
		valid = strings.Join(files[:n-1], ", ") + " and " + files[n-1] + " are"
	}
	fmt.Fprintf(c.App.Writer, "%s valid: %d diskimages, %d zuul-images, %d providers to upload to\n",
		valid, len(cfg.DiskImages), len(cfg.ZuulImages), len(cfg.Providers))
	return nil
}

// openStore opens the images-dir's existing state without the images-dir lock,
// so it works while a builder runs: read-only for listings, read-write for admin
// requests. It creates nothing: a missing images-dir or state is a usage error
// that names the path, since a mistyped images-dir is the likely cause. With
// stateOnly (the listings) and the state in ZooKeeper, the images-dir need not
// exist: the listings then work on any host that reaches ZooKeeper.
func openStore(c *cli.Context, cfg *config.Config, access store.Access, stateOnly bool) (*store.Store, error) {
	if cfg.ImagesDir == "" {
		return nil, withCode(exitUsage, fmt.Errorf("%s: images-dir is not set", cfg.Path))
	}
	log, err := newLogger(c)
	if err != nil {
		return nil, err
	}
	st, err := state.Open(c.Context, cfg, state.Options{Access: access, Logger: log, StateOnly: stateOnly})
	if errors.Is(err, config.ErrUnusable) {
		return nil, withCode(exitUsage, err)
	}
	if errors.Is(err, store.ErrNotInitialized) {
		return nil, withCode(exitUsage, fmt.Errorf("%w; check images-dir (and builder.state-db) in %s, or start the builder "+
			"(nodepool-builder %s, or --once) to create its state", err, cfg.Path, cfg.Files.Flags()))
	}
	if err != nil {
		return nil, withCode(exitFailed, err)
	}
	return st, nil
}
