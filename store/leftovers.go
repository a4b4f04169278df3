package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/partial"
)

// Leftovers says which of the builder's own files a tidy-up may remove.
type Leftovers struct {
	// Before: only files last changed before this time are touched, so work in
	// progress, which keeps writing, is left alone.
	Before time.Time
	// ZuulImages are the zuul-images of the config: partial downloads of other
	// images will never be resumed.
	ZuulImages map[string]bool
	// Busy reports work of this process on an image (buildID empty: a fetch of it)
	// or on one build; its files are never touched. Nil: nothing is busy.
	Busy func(image, buildID string) bool
}

// The suffixes of the temporary files of writes beside their final name:
// .<name><suffix><n>.
const (
	tempWrite = ".tmp" // writeFileAtomic's
	// A conversion's in an earlier version, which wrote them beside the
	// build's file: a builder upgraded after a crash still finds them.
	tempConvert = ".converting-"
)

var (
	// buildFileName is a build's file: <image>-<32 hex>.<format, sidecar or .d>.
	buildFileName = regexp.MustCompile(`^(.+)-([0-9a-f]{32})\.` + fileTail + `$`)
	// tempName is a file createTemp made, being written before a rename.
	tempName = regexp.MustCompile(`^\.(.+)(` + regexp.QuoteMeta(tempWrite) + `|` + regexp.QuoteMeta(tempConvert) + `)[0-9]+$`)
	// partialName is a file made of a Zuul build in .partial: <image>-zuul-<uuid>.<format>,
	// alone (verified, converted) or with the suffix of a download in progress.
	partialName = regexp.MustCompile(`^(.+)-zuul-([0-9a-fA-F]+)\.` + partialTail + `$`)
)

// createTemp creates a new file beside path, for a write that ends in its rename to
// path: named .<path's name><suffix><random digits>, which tempName knows, so that
// RemoveLeftovers finds it should the builder stop before the rename.
func createTemp(path, suffix string) (*os.File, error) {
	return os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+suffix+"*")
}

// partialSuffixes is a regexp alternation of partial.Suffixes.
func partialSuffixes() string {
	var alt []string
	for _, s := range partial.Suffixes {
		alt = append(alt, regexp.QuoteMeta(s))
	}
	return strings.Join(alt, "|")
}

// ownFile tells whether a name in the images-dir is one of this program's own
// files that it writes through a temporary file, builds' files aside.
func ownFile(name string) bool {
	return name == "builder_id.txt" || name == ownerFileName || strings.HasSuffix(name, "-status.json")
}

// RemoveLeftovers removes what this builder left in the images-dir when it
// stopped at a bad moment: temporary files of its writes and conversions, and
// partial downloads of Zuul builds that are settled or of images no longer
// configured. A partial download of a Zuul build made ready (here or by
// another builder sharing the state) goes whatever its age, unless a fetch of
// its image is under way. It removes only what it made: names it writes, of its own files
// or of builds it recorded as its own, last changed before l.Before. Files of
// builds it has no record of (another builder's, an operator's) are never
// removed, whatever their names. It returns the paths it removed.
func (s *Store) RemoveLeftovers(ctx context.Context, l Leftovers) ([]string, error) {
	busy := l.Busy
	if busy == nil {
		busy = func(string, string) bool { return false }
	}
	// The directories are listed before the state is read: a file listed then
	// belongs to a build recorded before it, which the read then sees.
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("list images-dir: %w", err)
	}
	partials, err := os.ReadDir(s.partialDir())
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("list partial downloads: %w", err)
	}
	builds, err := s.Builds(ctx, BuildFilter{})
	if err != nil {
		return nil, err
	}
	ours := map[string]bool{}    // <image>-<build id> of this builder's builds
	settled := map[string]bool{} // <image>/<zuul uuid> fetched or refused for good
	for _, b := range builds {
		if b.BuilderID == s.builderID {
			ours[b.Name()] = true
		}
		if b.Zuul.UUID != "" && (b.State == Ready || b.State == Deleting) {
			settled[b.Image+"/"+strings.ToLower(b.Zuul.UUID)] = true
		}
	}
	var removed []string
	var errs []error
	remove := func(path string, e os.DirEntry, anyAge bool) {
		info, err := e.Info()
		if err != nil || (!anyAge && !info.ModTime().Before(l.Before)) {
			return // gone meanwhile, or still being written
		}
		if err := os.RemoveAll(path); err != nil {
			errs = append(errs, fmt.Errorf("remove leftover %s: %w", path, err))
			return
		}
		removed = append(removed, path)
	}
	for _, e := range entries {
		m := tempName.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		if bm := buildFileName.FindStringSubmatch(m[1]); bm != nil {
			if ours[BuildName(bm[1], bm[2])] && !busy(bm[1], bm[2]) {
				remove(filepath.Join(s.dir, e.Name()), e, false)
			}
		} else if ownFile(m[1]) {
			remove(filepath.Join(s.dir, e.Name()), e, false)
		}
	}
	for _, e := range partials {
		m := partialName.FindStringSubmatch(e.Name())
		if m == nil || busy(m[1], "") {
			continue
		}
		image, uuid := m[1], strings.ToLower(m[2])
		if settled[image+"/"+uuid] {
			// Fetched, by this builder or another: with no fetch of the image
			// under way here, nothing writes it any more, however new it is.
			remove(filepath.Join(s.partialDir(), e.Name()), e, true)
			continue
		}
		if l.ZuulImages[image] {
			cur, err := s.Cursor(ctx, image)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if strings.ToLower(cur.ZuulUUID) != uuid {
				continue // a download to resume
			}
		}
		remove(filepath.Join(s.partialDir(), e.Name()), e, false)
	}
	return removed, errors.Join(errs...)
}
