package dib

import (
	"fmt"
	"strings"
	"time"

	"github.com/nodepool-builder/nodepool-builder/diskimage"
)

// HeldBack is the error of Step for an image that is due but was not built:
// its last build failed, and the next waits out the backoff. It is due work
// not done, not a failure of the step.
type HeldBack struct {
	Image   string
	Failure diskimage.Failure
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
