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
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/nodepool-builder/nodepool-builder/config"
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
	err := app.RunContext(ctx, args)
	if err == nil {
		return exitOK
	}
	fmt.Fprintln(stderr, "nodepool-builder:", err)
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	// Anything urfave/cli reports itself is a usage error.
	return exitUsage
}

func newApp(stdout, stderr io.Writer) *cli.App {
	jsonFlag := &cli.BoolFlag{Name: "json", Usage: "print JSON instead of a table"}
	return &cli.App{
		Name:      "nodepool-builder",
		Usage:     "keep clouds supplied with fresh disk images built by Zuul",
		Writer:    stdout,
		ErrWriter: stderr,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "config", Aliases: []string{"c"}, Value: "/etc/nodepool/nodepool.yaml", Usage: "nodepool.yaml to use"},
			&cli.StringFlag{Name: "log-format", Value: "text", Usage: "log format: text or json"},
			&cli.BoolFlag{Name: "debug", Usage: "log debug messages"},
			&cli.BoolFlag{Name: "once", Usage: "do every due step once (poll, fetch, upload, retain, delete, sweep), then exit"},
		},
		ExitErrHandler: func(*cli.Context, error) {},
		Action: func(c *cli.Context) error {
			if c.Args().Present() {
				return withCode(exitUsage, fmt.Errorf("unknown command %q; see --help", c.Args().First()))
			}
			if c.Bool("once") {
				return runOnce(c)
			}
			return runDaemon(c)
		},
		Commands: append([]*cli.Command{
			{
				Name:   "config-validate",
				Usage:  "check the config file and exit",
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
		}, adminCommands()...),
	}
}

func newLogger(c *cli.Context) (*slog.Logger, error) {
	level := slog.LevelInfo
	if c.Bool("debug") {
		level = slog.LevelDebug
	}
	opts := &slog.HandlerOptions{Level: level}
	switch f := c.String("log-format"); f {
	case "text":
		return slog.New(slog.NewTextHandler(c.App.ErrWriter, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(c.App.ErrWriter, opts)), nil
	default:
		return nil, withCode(exitUsage, fmt.Errorf("--log-format %q: use text or json", f))
	}
}

func loadConfig(c *cli.Context) (*config.Config, error) {
	cfg, err := config.Load(c.String("config"))
	if err != nil {
		return nil, withCode(exitUsage, err)
	}
	return cfg, nil
}

func configValidate(c *cli.Context) error {
	cfg, err := loadConfig(c)
	if err != nil {
		return err
	}
	fmt.Fprintf(c.App.Writer, "%s is valid: %d diskimages, %d zuul-images, %d providers to upload to\n",
		cfg.Path, len(cfg.DiskImages), len(cfg.ZuulImages), len(cfg.Providers))
	return nil
}

// openStore opens the images-dir's state for reading and admin writes; it does not
// take the lock, so it works while a daemon runs.
func openStore(c *cli.Context, cfg *config.Config) (*store.Store, error) {
	if cfg.ImagesDir == "" {
		return nil, withCode(exitUsage, fmt.Errorf("%s: images-dir is not set", cfg.Path))
	}
	st, err := store.Open(c.Context, store.Options{ImagesDir: cfg.ImagesDir, DBPath: cfg.Builder.StateDB})
	if err != nil {
		return nil, withCode(exitFailed, err)
	}
	return st, nil
}
