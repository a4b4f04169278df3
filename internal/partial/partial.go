// Package partial names the files a download keeps in the partial directory
// while it runs: the store names them, the download code writes them, and the
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

// Suffixes are the suffixes, after the verified file's name, of the files of
// a download in progress.
var Suffixes = []string{Download, Ranges, RangesTemp}

// Files are the paths of the files of one download, all in one directory.
type Files struct {
	// Dest is the file verified and uncompressed: where the download ends.
	Dest string
	// Download is the data fetched so far, as served (compressed or not),
	// kept across attempts and restarts so that the download resumes.
	Download string
	// Ranges is the saved state of a download in ranges; RangesTemp is that
	// state while it is written.
	Ranges, RangesTemp string
}

// Of names the files of the download that ends at dest, beside it.
func Of(dest string) Files {
	return Files{Dest: dest, Download: dest + Download, Ranges: dest + Ranges, RangesTemp: dest + RangesTemp}
}
