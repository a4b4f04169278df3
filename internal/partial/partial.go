// Package partial names the files a download keeps beside its key in the
// partial directory while it runs: the download code writes them, and the
// store's tidy-up removes those of downloads nobody will resume. It is a leaf,
// so that the store does not link the download code for a few names.
package partial

const (
	// Download is the data fetched so far.
	Download = ".download"
	// Ranges is the saved state of a download in ranges.
	Ranges = ".ranges"
	// RangesTemp is that state while it is written, before its rename.
	RangesTemp = Ranges + ".tmp"
)

// Suffixes are the suffixes, after the key, of the files of a download in
// progress; the key alone names the verified file.
var Suffixes = []string{Download, Ranges, RangesTemp}
