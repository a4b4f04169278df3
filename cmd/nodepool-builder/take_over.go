package main

import (
	"fmt"
	"io"
	"slices"

	"github.com/urfave/cli/v2"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/internal/escape"
	"github.com/nodepool-builder/nodepool-builder/state"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// takeOverImagesDir makes an images-dir that another builder used (a Python
// nodepool-builder's, or this builder's with its state lost) this builder's,
// under the images-dir lock, and prints what that means: the builds recorded
// under its builder id become this builder's, and the files no build of it
// records stay as they are.
func takeOverImagesDir(c *cli.Context) error {
	log, cfg, err := startOffline(c)
	if err != nil {
		return err
	}
	lock, err := lockImagesDir("take-over-images-dir", cfg, "so there is nothing to take over",
		"stop the builder that runs there; the take-over is for a directory no builder uses now")
	if err != nil {
		return err
	}
	defer lock.Unlock()
	st, err := state.Open(c.Context, cfg, state.Options{Access: store.Create, Logger: log, TakeOver: true})
	if err != nil {
		return offlineError("take-over-images-dir", err)
	}
	defer st.Close()
	builds, err := st.Builds(c.Context, store.BuildFilter{})
	if err != nil {
		return withCode(exitFailed, fmt.Errorf("take-over-images-dir: %w", err))
	}
	unrecorded, err := st.Unrecorded(c.Context)
	if err != nil {
		return withCode(exitFailed, fmt.Errorf("take-over-images-dir: %w", err))
	}
	printTakeOver(c.App.Writer, cfg, st, builds, unrecorded)
	return nil
}

func printTakeOver(w io.Writer, cfg *config.Config, st *store.Store, builds []store.Build, unrecorded []string) {
	fmt.Fprintf(w, "%s is this builder's now, as builder %s (its builder_id.txt).\n", cfg.ImagesDir, st.BuilderID())
	images := cfg.ImageNames()
	var ours, dropped []store.Build
	for _, b := range builds {
		if b.BuilderID != st.BuilderID() {
			continue
		}
		ours = append(ours, b)
		if !slices.Contains(images, b.Image) {
			dropped = append(dropped, b)
		}
	}
	if len(ours) > 0 {
		fmt.Fprintf(w, "Builds recorded under that id, which this builder now uploads, rotates and deletes: %d.\n", len(ours))
	}
	if len(dropped) > 0 {
		fmt.Fprintf(w, "Of them, these are of images not in %s; their uploads and files are deleted on the builder's next "+
			"pass (add the images to the config first to keep them):\n", cfg.Path)
		for _, b := range dropped {
			fmt.Fprintf(w, "  %s (%s)\n", escape.Controls(b.Name()), b.State)
		}
	}
	if len(unrecorded) > 0 {
		fmt.Fprintf(w, "These files belong to no build of this builder and are left as they are (remove them by hand "+
			"when they are not needed):\n")
		for _, name := range unrecorded {
			// Whoever can write in the images-dir names these files.
			fmt.Fprintf(w, "  %s\n", escape.Controls(name))
		}
	}
}
