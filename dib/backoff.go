package dib

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/source"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// Failure is the failed build that holds an image's next build back.
type Failure struct {
	Build store.Build // the failed build; Build.Reason says why it failed
	// Log is its build log, <build-log-dir>/<image>-<build_id>.log; empty when
	// there is none (the build failed before DIB started, or the log was pruned).
	Log string
	// NextAttempt is when the image is due again, the backoff after the
	// failure, unless an operator asks for a build sooner.
	NextAttempt time.Time
}

// LastFailure returns the failure since a diskimage's newest ready build that
// holds its next build back: its newest failed build that the builder did not
// stop. builds are the image's builds, newest first (others are passed over);
// backoff is how long a failure holds the next build back. NextAttempt is when
// the image is next due: once the backoff has passed, and, when its newest
// ready build is whole and younger than rebuild-age then (the failed build was
// asked for by an operator), once that build is rebuild-age old. Nil when
// there is no such failure, or the image is not a diskimage of cfg.
func LastFailure(cfg *config.Config, image string, builds []store.Build, backoff time.Duration) *Failure {
	img := cfg.DiskImage(image)
	if img == nil {
		return nil
	}
	var f *Failure
	var ready *store.Build // the newest ready build, older than the failure
	for i, b := range builds {
		if b.Image != image {
			continue
		}
		if b.State == store.Ready {
			if f == nil {
				return nil
			}
			ready = &builds[i]
			break
		}
		if f == nil && b.State == store.Failed && !source.Interrupted(b) {
			f = &Failure{Build: b, NextAttempt: b.StateTime.Add(backoff)}
			if p := logPath(cfg.BuildLogDir, image, b.ID); fileExists(p) {
				f.Log = p
			}
		}
	}
	if f == nil {
		return nil
	}
	if ready != nil && dueReason(cfg, img, builds, f.NextAttempt) == "" {
		f.NextAttempt = ready.StateTime.Add(img.RebuildAge)
	}
	return f
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// HeldBack is the error of Step for an image that is due but was not built:
// its last build failed, and the next waits out the backoff. It is due work
// not done, not a failure of the step.
type HeldBack struct {
	Image   string
	Failure Failure
	Backoff time.Duration
}

func (h *HeldBack) Error() string {
	f := h.Failure
	var s strings.Builder
	fmt.Fprintf(&s, "%s: not built: its last build %s failed at %s", h.Image, f.Build.Name(), f.Build.StateTime.Format(time.RFC3339))
	if f.Build.Reason != "" {
		s.WriteString(" (" + f.Build.Reason + ")")
	}
	if f.Log != "" && !strings.Contains(f.Build.Reason, f.Log) {
		s.WriteString("; log: " + f.Log)
	}
	fmt.Fprintf(&s, "; after a failed build the next waits %s (backoff): next attempt after %s, "+
		"or once the cause is fixed, nodepool-builder image-build %s builds it at once",
		h.Backoff, f.NextAttempt.Format(time.RFC3339), h.Image)
	return s.String()
}

// NotDone marks the error as due work left undone, for the builder's summary.
func (h *HeldBack) NotDone() {}
