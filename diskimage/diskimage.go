// Package diskimage says what a diskimage's builds in the store mean under the
// config: the formats a build is made in, whether the image is due, and the
// failed build that holds its next build back. The dib source builds by it;
// the listings show it.
package diskimage

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/source"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// DefaultFailureBackoff is how long after a failed build an image is not built
// again, unless an operator asks for a build.
const DefaultFailureBackoff = 10 * time.Minute

// defaultFormat is what nodepool builds for an image that no provider lists and
// that names no formats of its own.
const defaultFormat = "qcow2"

// Formats is the formats a build of image is made in: every format the
// config needs, or qcow2 when it needs none. They are sorted; DIB makes them in
// an order of its own (raw last), so the order on the command line does not matter.
func Formats(cfg *config.Config, image string) []string {
	formats := cfg.NeededFormats(image)
	if len(formats) == 0 {
		return []string{defaultFormat}
	}
	return formats
}

// LogPath is where the log of a build goes: <build-log-dir>/<image>-<build_id>.log.
func LogPath(dir, image, buildID string) string {
	return filepath.Join(dir, store.BuildName(image, buildID)+".log")
}

// DueReason says why an image needs a build at a time, from its builds (newest
// first), failures and requests aside; "" when it does not.
func DueReason(cfg *config.Config, img *config.DiskImage, builds []store.Build, now time.Time) string {
	image := img.Name
	newest := store.NewestReady(builds, image)
	if newest == nil {
		return "no ready build"
	}
	if age := now.Sub(newest.StateTime); age >= img.RebuildAge {
		return fmt.Sprintf("newest build %s is %s old (rebuild-age %s)", newest.Name(), age.Round(time.Second), img.RebuildAge)
	}
	// A build's recorded formats count even when a file was removed after
	// upload (keep-formats, delete-after-upload), as in nodepool.
	var have []string
	for _, f := range newest.Files {
		have = append(have, f.Format)
	}
	var missing []string
	for _, f := range Formats(cfg, image) {
		if !slices.Contains(have, f) {
			missing = append(missing, f)
		}
	}
	if len(missing) > 0 {
		return fmt.Sprintf("newest build %s lacks %s", newest.Name(), strings.Join(missing, ", "))
	}
	return ""
}

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
			if p := LogPath(cfg.BuildLogDir, image, b.ID); fileExists(p) {
				f.Log = p
			}
		}
	}
	if f == nil {
		return nil
	}
	if ready != nil && DueReason(cfg, img, builds, f.NextAttempt) == "" {
		f.NextAttempt = ready.StateTime.Add(img.RebuildAge)
	}
	return f
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
