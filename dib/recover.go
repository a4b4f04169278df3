package dib

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"

	"github.com/nodepool-builder/nodepool-builder/store"
)

// Abandon stops what a builder that is gone left running for a build still
// recorded as building: its DIB process runs on in its own process group after
// the builder dies, writing into files that recovery is about to remove. A pid is
// only trusted when the process's command line names the build's output, so a
// reused pid is never killed.
func (b *Source) Abandon(ctx context.Context, rec store.Build) error {
	if rec.Source != store.SourceDIB || rec.PID <= 0 || rec.PID == os.Getpid() {
		return nil
	}
	if base, err := b.opts.Store.BuildPath(rec.Image, rec.ID); err != nil || !runsFor(rec.PID, base) {
		return nil
	}
	b.log.Warn("stopping a DIB process left by a builder that is gone", "build", rec.Name(), "pid", rec.PID)
	if err := stopGroup(rec.PID, b.opts.KillGrace); err != nil {
		return fmt.Errorf("stop DIB of %s: %w", rec.Name(), err)
	}
	return nil
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
