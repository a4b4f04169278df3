// Package diskspace checks, before and while the builder writes an image, that its
// filesystem has room for it: downloads and conversions stop with ErrNoSpace rather
// than fill the disk the state and every other image share.
package diskspace

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// ErrNoSpace is wrapped by the error of a download or a conversion whose filesystem
// lacks the free space it needs. The metrics count it as "space" without knowing this
// package (see metrics.Classify).
var ErrNoSpace error = noSpace{}

type noSpace struct{}

func (noSpace) Error() string { return "not enough free space" }

// FailureClass is the metrics' reason for the failure.
func (noSpace) FailureClass() string { return "space" }

// Free returns the bytes an unprivileged process may still write in dir's filesystem.
func Free(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}

// Check returns an error wrapping ErrNoSpace, naming dir and both sizes, when dir's
// filesystem has less than need bytes free as free reports it (nil: Free).
func Check(dir string, need int64, free func(string) (int64, error)) error {
	if free == nil {
		free = Free
	}
	have, err := free(dir)
	if err != nil {
		return fmt.Errorf("check free space in %s: %w", dir, err)
	}
	if have < need {
		return fmt.Errorf("%w in %s: need %d bytes, %d free", ErrNoSpace, dir, need, have)
	}
	return nil
}
