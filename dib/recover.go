package dib

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"syscall"

	"github.com/nodepool-builder/nodepool-builder/store"
)

// Abandon stops what a builder that is gone left running for a build still
// recorded as building: its DIB process runs on in its own process group after
// the builder dies, writing into files that recovery is about to remove. A pid is
// only trusted when the process's command line names the build's output, so a
// reused pid is never killed. A builder killed between starting DIB and
// recording its pid left none: then every process group whose leader names the
// build's output is stopped.
func (b *Source) Abandon(ctx context.Context, rec store.Build) error {
	if rec.Source != store.SourceDIB || rec.PID == os.Getpid() {
		return nil
	}
	base, err := b.opts.Store.BuildPath(rec.Image, rec.ID)
	if err != nil {
		return nil
	}
	var groups []int
	switch {
	case rec.PID > 0 && runsFor(rec.PID, base):
		groups = []int{rec.PID}
	case rec.PID <= 0:
		groups = leadersFor(base)
	}
	for _, pgid := range groups {
		b.log.Warn("stopping a DIB process left by a builder that is gone", "build", rec.Name(), "pid", pgid)
		if err := stopGroup(pgid, b.opts.KillGrace); err != nil {
			return fmt.Errorf("stop DIB of %s: %w", rec.Name(), err)
		}
	}
	return nil
}

// leadersFor returns the process groups, other than this process's, whose
// leader has arg among its arguments: DIB runs lead groups of their own.
func leadersFor(arg string) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	own := syscall.Getpgrp()
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == own {
			continue
		}
		if pgid, err := syscall.Getpgid(pid); err == nil && pgid == pid && runsFor(pid, arg) {
			out = append(out, pid)
		}
	}
	return out
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
