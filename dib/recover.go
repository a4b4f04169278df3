package dib

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"

	"github.com/nodepool-builder/nodepool-builder/store"
)

// Recover stops what a builder that is gone left running: a DIB process of a build
// still recorded as building runs on in its own process group after the builder
// dies, writing into files that recovery is about to remove. Each such group is
// ended. A pid is only trusted when the process's command line names the build's
// output, so a reused pid is never killed.
func (b *Builder) Recover(ctx context.Context) error {
	builds, err := b.opts.Store.Builds(ctx, store.BuildFilter{State: store.Building, Source: store.SourceDIB})
	if err != nil {
		return err
	}
	var errs []error
	for _, rec := range builds {
		if rec.PID <= 0 || rec.PID == os.Getpid() {
			continue
		}
		out := b.opts.Store.BuildPath(rec.Image, rec.ID)
		if !runsFor(rec.PID, out) {
			continue
		}
		b.log.Warn("stopping a DIB process left by a builder that is gone", "build", rec.Name(), "pid", rec.PID)
		if err := stopGroup(rec.PID, b.opts.KillGrace); err != nil {
			errs = append(errs, fmt.Errorf("stop DIB of %s: %w", rec.Name(), err))
		}
	}
	return errors.Join(errs...)
}

// runsFor tells whether process pid is alive and has arg among its arguments.
func runsFor(pid int, arg string) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return false
	}
	for _, a := range bytes.Split(data, []byte{0}) {
		if string(a) == arg {
			return true
		}
	}
	return false
}
