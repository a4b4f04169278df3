package main

import (
	"io"

	"github.com/urfave/cli/v2"

	"github.com/nodepool-builder/nodepool-builder/listing"
	"github.com/nodepool-builder/nodepool-builder/store"
)

func imageList(c *cli.Context) error {
	a, err := openAdmin(c, store.ReadOnly)
	if err != nil {
		return err
	}
	defer a.close()
	rows, err := listing.Uploads(c.Context, a.st)
	if err != nil {
		return withCode(exitFailed, err)
	}
	if c.Bool("json") {
		return writeJSON(c.App.Writer, rows)
	}
	listing.WriteUploads(c.App.Writer, rows)
	return nil
}

func dibImageList(c *cli.Context) error {
	a, err := openAdmin(c, store.ReadOnly)
	if err != nil {
		return err
	}
	defer a.close()
	rows, err := listing.Builds(c.Context, a.st)
	if err != nil {
		return withCode(exitFailed, err)
	}
	if c.Bool("json") {
		return writeJSON(c.App.Writer, rows)
	}
	listing.WriteBuilds(c.App.Writer, rows)
	return nil
}

func writeJSON(w io.Writer, v any) error {
	if err := listing.WriteJSON(w, v); err != nil {
		return withCode(exitFailed, err)
	}
	return nil
}
