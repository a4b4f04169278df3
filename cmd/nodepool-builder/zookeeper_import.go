package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/state"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// zookeeperImport copies the images-dir's SQLite state into the config's
// ZooKeeper, under the images-dir lock, and prints what it did.
func zookeeperImport(c *cli.Context) error {
	log, cfg, err := startOffline(c)
	if err != nil {
		return err
	}
	if cfg.ZooKeeper == nil {
		return withCode(exitUsage, fmt.Errorf("zookeeper-import: %w", state.NoZooKeeper(cfg)))
	}
	lock, err := lockImagesDir("zookeeper-import", cfg, "so there is no state to import", "the state must not change while it is copied")
	if err != nil {
		return err
	}
	defer lock.Unlock()
	r, err := state.ImportToZooKeeper(c.Context, cfg, state.Options{Logger: log})
	if err != nil {
		return offlineError("zookeeper-import", err)
	}
	printImport(c.App.Writer, r, cfg.Files.Flags())
	return nil
}

func printImport(w io.Writer, r state.ImportReport, flags string) {
	if !r.MovedAt.IsZero() {
		fmt.Fprintf(w, "%s was copied to ZooKeeper %s on %s already; nothing copied. Once the builder has run there, "+
			"a copy would bring back records it has deleted since.\n", r.From, r.To, r.MovedAt.Format(time.RFC3339))
		return
	}
	fmt.Fprintf(w, "Copied %s to ZooKeeper %s (builder id %s):\n", r.From, r.To, r.BuilderID)
	for _, row := range []struct {
		what string
		n    store.CopyCount
	}{
		{"builds", r.Builds}, {"uploads", r.Uploads}, {"poll cursors", r.Cursors}, {"paused images", r.Pauses},
		{"build requests", r.Requests},
	} {
		fmt.Fprintf(w, "  %-15s %d copied, %d there already\n", row.what+":", row.n.Copied, row.n.Present)
	}
	if len(r.Skipped) > 0 {
		fmt.Fprintln(w, "Skipped:")
		for _, s := range r.Skipped {
			fmt.Fprintln(w, "  "+s)
		}
	}
	if r.Uploads.Copied > 0 {
		fmt.Fprintln(w, "ZooKeeper numbers uploads itself, so image-list shows new upload ids; each upload keeps its cloud image.")
	}
	if r.Interrupted > 0 {
		fmt.Fprintf(w, "%d build(s) or upload(s) were interrupted when the builder last stopped; it settles them on its next pass.\n",
			r.Interrupted)
	}
	fmt.Fprintf(w, "The SQLite state is marked moved, and the builder now keeps its state in ZooKeeper: start it "+
		"(nodepool-builder %s) with this images-dir and its builder_id.txt. The SQLite file is not used any more.\n",
		flags)
}

// startOffline starts a command that runs with the builder stopped and takes
// no arguments: its logger, and the config.
func startOffline(c *cli.Context) (*slog.Logger, *config.Config, error) {
	if err := noArgs(c); err != nil {
		return nil, nil, err
	}
	log, err := newLogger(c)
	if err != nil {
		return nil, nil, err
	}
	cfg, err := loadConfig(c)
	if err != nil {
		return nil, nil, err
	}
	return log, cfg, nil
}

// offlineError is the exit of a command that runs with the builder stopped
// and could not open or copy the state: a config, images-dir or state it
// cannot use is a usage error, anything else a failure.
func offlineError(command string, err error) error {
	err = fmt.Errorf("%s: %w", command, err)
	if errors.Is(err, config.ErrUnusable) || errors.Is(err, store.ErrNotInitialized) || errors.Is(err, store.ErrOtherBuilder) {
		return withCode(exitUsage, err)
	}
	return withCode(exitFailed, err)
}

// lockImagesDir takes the images-dir lock for a command that must run with the
// builder stopped; unset says why the command needs an images-dir, busy why it
// needs the builder stopped.
func lockImagesDir(command string, cfg *config.Config, unset, busy string) (*store.Lock, error) {
	if cfg.ImagesDir == "" {
		return nil, withCode(exitUsage, fmt.Errorf("%s: %s: images-dir is not set, %s", command, cfg.Path, unset))
	}
	lock, err := store.LockDir(cfg.ImagesDir)
	if errors.Is(err, store.ErrLocked) {
		return nil, withCode(exitLocked, fmt.Errorf("%s: %w (%s)", command, err, busy))
	}
	if err != nil {
		return nil, withCode(exitFailed, err)
	}
	return lock, nil
}
