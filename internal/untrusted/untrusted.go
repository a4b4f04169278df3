// Package untrusted holds what the download of an image and qemu-img's checks of it
// share about an image that comes from outside: the errors that refuse it for good,
// the bound on its size, and the names of its formats. It imports neither of them.
package untrusted

import "strings"

// DefaultMaxSize bounds an image, as downloaded and as the disk it holds, when no
// limit is set (builder.max-image-size).
const DefaultMaxSize = 128 << 30

var (
	// ErrUnsafe is wrapped by the errors for an artifact that must not be used at
	// all: an image that is not the format it claims or that references other files
	// (which would make qemu-img or the cloud read host files), a raw image no disk
	// could be, or a download that would reach a host or address it may not.
	ErrUnsafe error = &refusal{"unsafe artifact"}
	// ErrTooLarge is wrapped by the errors for an image larger than its limit: a
	// download that is, or announces itself, larger than its declared size or the
	// maximum, or a disk whose virtual size is above the maximum.
	ErrTooLarge error = &refusal{"image too large"}
)

// refusal is an error that refuses an image for good. The metrics count it as
// "refused" without knowing this package (see metrics.Classify).
type refusal struct{ msg string }

func (e *refusal) Error() string { return e.msg }

// FailureClass is the metrics' reason for the failure.
func (e *refusal) FailureClass() string { return "refused" }

// CanonicalFormat maps the spellings of an image format onto the names files and
// providers use ("qcow" is qcow2).
func CanonicalFormat(f string) string {
	f = strings.ToLower(strings.TrimSpace(f))
	if f == "qcow" {
		return "qcow2"
	}
	return f
}
