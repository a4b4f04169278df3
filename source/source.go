// Package source is the one path every build takes, whatever makes its image.
// The core marks the image busy, checks that it is not paused and that its
// images-dir has room, asks the source whether the image is due, takes a build
// slot and the image's build lock, has the work's maker look again under the
// lock, begins the build in the store, lets the maker make its files, and
// commits or aborts it.
//
// A source (diskimage-builder, a Zuul job) says only what it alone knows: which
// images it makes, whether one is due and what its build is (a maker of its own
// type), how to make the files into a build writer, and how to abandon a build
// it was making when a builder stopped.
package source

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nodepool-builder/nodepool-builder/store"
)

// Source makes images.
type Source interface {
	// Images lists the images this source makes under its config, each with
	// how often it is looked at.
	Images() map[string]time.Duration
	// Due looks at an image, before its build lock, and says what work it
	// needs now. The core has checked that the image is not paused. Work to
	// make carries the source's Maker, which the core asks again under the lock.
	//
	// An error that says due work was held back (a failed build's backoff)
	// implements NotDone().
	Due(ctx context.Context, image string, look Look) (Work, error)
	// Abandon stops whatever a builder that is gone left running for a
	// build it recorded as building, before the core removes its files.
	Abandon(ctx context.Context, b store.Build) error
}

// Maker is a source's own account of one build to make: what its look found,
// in the source's types, and what it does with it.
type Maker interface {
	// Recheck looks again, under the image's build lock, at what the look
	// before the lock found, reading afresh whatever another builder may have
	// changed in between (the lock's last holder may have just made the
	// build), and says what work is due now.
	Recheck(ctx context.Context) (Work, error)
	// Make makes the work's files into w, under the image's build lock:
	// each file where w says, verified, and added with w.Add. The core
	// commits the build, its files with it, when it returns nil and aborts
	// it otherwise; the files added to a ready build are committed either way.
	Make(ctx context.Context, w *store.BuildWriter) error
	// Cursor is the poll cursor that lands in the write recording the
	// build's outcome (err nil: ready); nil when none does.
	Cursor(b store.Build, err error) *store.Cursor
	// Done is told how the work ended once that is recorded, or once it is
	// known that it cannot be: for the source's housekeeping (build logs,
	// requests, partial files, metrics). Its error is reported with the
	// build's and undoes nothing.
	Done(ctx context.Context, end End) error
}

// Look is what Due is asked.
type Look struct {
	// Asked: an operator asked for a build (a gearman image-build job), which
	// is made whatever the schedule says; or, for a source that fetches,
	// answered with the build that is there already (Answer). Request,
	// when not empty, names the asking; the core records it on a new build,
	// so that the same request made again finds it.
	Asked   bool
	Request string
}

// Work is what a look found, one of three: nothing is due, and why (Skip,
// made by NotDue); an operator's request is answered with a build that is
// there (Have, made by Answer); or a build is to be made (Todo, made by Do).
type Work struct {
	Skip string
	Have *store.Build
	Todo *Todo
}

// Todo is a build to make: a new one (New), or files to add to one that is
// there (Into), by Maker.
type Todo struct {
	// Reason says why the work is due, for the log.
	Reason string
	// New is the record a new build begins with: its image, source and what
	// the source knows of it.
	New store.Build
	// Into, when set, is a ready build the work adds files to instead: no
	// new build is begun, and it is neither committed nor aborted.
	Into *store.Build
	// Slot: the work takes one of the build slots (builder.build-workers)
	// while it runs, as a local build does.
	Slot bool
	// Maker makes the work.
	Maker Maker
}

// NotDue is the work of an image that needs none, and why.
func NotDue(why string) Work { return Work{Skip: why} }

// Answer is the work of an operator's request that build b, which is there,
// answers.
func Answer(b store.Build) Work { return Work{Have: &b} }

// Do is the work of making a build as t says.
func Do(t Todo) Work { return Work{Todo: &t} }

// End is how a piece of work ended.
type End struct {
	// Build is the build as last recorded: ready, failed, or, when its
	// outcome could not be recorded, building.
	Build store.Build
	// Err says why the work failed; nil when it did not.
	Err error
	// Recorded is false when the outcome could not be written: the build
	// stays building for recovery, which takes the image's lock again.
	Recorded bool
}

// InterruptedReason begins the reason of a build that the builder stopped (it
// was stopping, or lost the image's lock) rather than one that failed: such a
// build holds no next build back.
const InterruptedReason = "interrupted: the builder stopped during this build"

// Interrupted tells whether a failed build was stopped by the builder rather
// than failed by itself.
func Interrupted(b store.Build) bool {
	return b.State == store.Failed && strings.HasPrefix(b.Reason, InterruptedReason)
}

// ErrPaused is wrapped by the error of an operator's request for a paused image.
var ErrPaused = errors.New("paused")

// errSkipped turns why nothing was made into the error of an operator's request.
func errSkipped(image, why string) error {
	return fmt.Errorf("%s: nothing to make: %s", image, why)
}
