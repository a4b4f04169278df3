package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/nodepool-builder/nodepool-builder/listing"
)

// status returns one image's image-status row.
func (a *adminSession) status(c *cli.Context, name string) (listing.ImageRow, error) {
	images, err := listing.ImageStatus(c.Context, a.st, a.cfg)
	if err != nil {
		return listing.ImageRow{}, withCode(exitFailed, err)
	}
	for _, s := range images {
		if s.Name == name {
			return s, nil
		}
	}
	return listing.ImageRow{}, withCode(exitUsage, fmt.Errorf("no image %q in %s", name, a.cfg.Path))
}

// imageStatus prints nodepool's image-status columns, then ours.
func imageStatus(c *cli.Context) error {
	a, err := openListing(c)
	if err != nil {
		return err
	}
	defer a.close()
	images, err := listing.ImageStatus(c.Context, a.st, a.cfg)
	if err != nil {
		return withCode(exitFailed, err)
	}
	if c.Bool("json") {
		return writeJSON(c.App.Writer, listing.ImagesJSON(images))
	}
	if err := listing.WriteImageStatusText(c.App.Writer, a.st, a.cfg, images); err != nil {
		return withCode(exitFailed, err)
	}
	return nil
}
