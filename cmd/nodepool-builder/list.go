package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/nodepool-builder/nodepool-builder/listing"
	"github.com/nodepool-builder/nodepool-builder/store"
)

func imageList(c *cli.Context) error {
	return list(c, listing.Uploads, listing.WriteUploads)
}

// dibImageList lists every build. Like nodepool's, it takes no image to list
// the builds of: an argument is refused rather than ignored.
func dibImageList(c *cli.Context) error {
	return list(c, listing.Builds, listing.WriteBuilds)
}

// list prints the rows a listing reads from the state: as a table, or with
// --json as JSON.
func list[R any](c *cli.Context, read func(context.Context, *store.Store) ([]R, error), write func(io.Writer, []R)) error {
	a, err := openListing(c)
	if err != nil {
		return err
	}
	defer a.close()
	rows, err := read(c.Context, a.st)
	if err != nil {
		return withCode(exitFailed, err)
	}
	if c.Bool("json") {
		return writeJSON(c.App.Writer, rows)
	}
	write(c.App.Writer, rows)
	return nil
}

func writeJSON(w io.Writer, v any) error {
	if err := listing.WriteJSON(w, v); err != nil {
		return withCode(exitFailed, err)
	}
	return nil
}

// noArgs refuses arguments to a command that takes none: urfave/cli hands them
// over without a word, and a listing that ignored them would look like an
// answer (an empty one, for a filter that does not exist). urfave/cli stops
// reading flags at the first argument, so a flag after one is the usual cause.
func noArgs(c *cli.Context) error {
	if c.NArg() == 0 {
		return nil
	}
	hint := "see " + c.Command.Name + " --help"
	for _, a := range c.Args().Slice() {
		if strings.HasPrefix(a, "-") {
			hint = "put flags such as --json before the first argument"
			break
		}
	}
	return withCode(exitUsage, fmt.Errorf("%s takes no arguments, not %q; %s", c.Command.Name, strings.Join(c.Args().Slice(), " "), hint))
}
