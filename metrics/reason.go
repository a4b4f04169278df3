package metrics

import (
	"context"
	"errors"
	"net"
	"net/url"
	"os"
	"syscall"
)

// Step is the part of the work that failed.
type Step string

// Steps of the work.
const (
	StepBuild    Step = "build"    // a DIB build
	StepDownload Step = "download" // fetching a Zuul-built image file
	StepUpload   Step = "upload"   // an upload attempt
	StepDelete   Step = "delete"   // deleting a cloud image of a released upload
	StepPoll     Step = "poll"     // asking Zuul for builds
	StepSweep    Step = "sweep"    // the leak sweep listing or deleting cloud images
)

// Reason is a failure's class: a small fixed set, so that labels stay few.
type Reason string

// Reasons of failures.
const (
	ReasonCancelled Reason = "cancelled" // the builder was stopping
	ReasonTimeout   Reason = "timeout"   // a deadline passed: build-timeout, image-upload-timeout, a stalled transfer
	ReasonChecksum  Reason = "checksum"  // a download's checksum did not match
	ReasonSpace     Reason = "space"     // the images-dir ran out of space
	ReasonRefused   Reason = "refused"   // an artifact refused for good: unsafe, too large, a format missing
	ReasonHTTP      Reason = "http"      // Zuul or an artifact server failed or could not be reached
	ReasonCloud     Reason = "cloud"     // the cloud failed or could not be reached
	ReasonExit      Reason = "exit"      // DIB exited with a code other than 0
	ReasonOther     Reason = "other"
)

// Classify puts a step's error in its class. Network and HTTP failures count as
// "cloud" for the steps that talk to clouds, "http" for the others.
//
// The errors of the packages that fetch and ask Zuul say their class
// themselves, with a FailureClass method: one of the reasons above, or
// "remote" for a service that failed or could not be reached. So the metrics
// need not link those packages to classify them.
func Classify(step Step, err error) Reason {
	var netErr net.Error
	var classed interface{ FailureClass() string }
	switch {
	case errors.Is(err, context.Canceled):
		return ReasonCancelled
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded),
		errors.As(err, &netErr) && netErr.Timeout():
		return ReasonTimeout
	case errors.Is(err, syscall.ENOSPC):
		return ReasonSpace
	}
	remote := false
	if errors.As(err, &classed) {
		switch c := Reason(classed.FailureClass()); c {
		case ReasonChecksum, ReasonSpace, ReasonRefused:
			return c
		case "remote":
			remote = true
		}
	}
	var status interface{ GetStatusCode() int } // gophercloud's errors of an HTTP status
	remote = remote || errors.As(err, new(*url.Error)) || errors.As(err, &netErr) || errors.As(err, &status)
	switch {
	case remote && (step == StepUpload || step == StepDelete || step == StepSweep):
		return ReasonCloud
	case remote:
		return ReasonHTTP
	}
	return ReasonOther
}
