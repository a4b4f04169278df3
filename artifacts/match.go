// Package artifacts picks the image files a Zuul build publishes for the wanted formats,
// and downloads, decompresses and verifies them into the files the store names;
// qemuimg then checks that they are the images they claim to be, and the store
// moves them into place.
package artifacts

import (
	"fmt"
	"net/url"
	"slices"
	"strings"

	"github.com/nodepool-builder/nodepool-builder/internal/untrusted"
)

// zuulImageType is the metadata.type that Zuul's own image jobs give their image artifacts.
const zuulImageType = "zuul_image"

// Candidate is one artifact of a Zuul build, as the caller got it from the builds API.
type Candidate struct {
	Name     string
	URL      string
	Metadata map[string]any
}

// Mapping says which artifacts hold a format: those whose metadata.type equals Type and,
// when Name is set, whose name equals Name.
type Mapping struct {
	Format string
	Type   string
	Name   string
}

// MissingError reports the wanted formats a build does not publish.
type MissingError struct {
	// Missing lists the wanted formats no artifact holds.
	Missing []string
	// Available lists the formats the build does publish.
	Available []string
}

// FailureClass tells the metrics that a build without a wanted format is
// refused (see metrics.Classify).
func (e *MissingError) FailureClass() string { return "refused" }

// Error says which formats are missing and which the build publishes instead.
func (e *MissingError) Error() string {
	if len(e.Available) == 0 {
		return fmt.Sprintf("no artifact for format %s: the build publishes no image format",
			strings.Join(e.Missing, ", "))
	}
	return fmt.Sprintf("no artifact for format %s: the build publishes only %s",
		strings.Join(e.Missing, ", "), strings.Join(e.Available, ", "))
}

// Match returns, for each wanted format, the artifact that holds it, keyed by the format's
// canonical name ("qcow" is "qcow2"). When several artifacts hold a format the first wins.
// When some formats are missing it returns the ones it found together with a *MissingError.
func Match(cands []Candidate, mappings []Mapping, formats []string) (map[string]Candidate, error) {
	found := make(map[string]Candidate, len(formats))
	var missing []string
	for _, f := range formats {
		f = untrusted.CanonicalFormat(f)
		if _, ok := found[f]; ok || slices.Contains(missing, f) {
			continue
		}
		if c, ok := find(cands, mappings, f); ok {
			found[f] = c
		} else {
			missing = append(missing, f)
		}
	}
	if len(missing) > 0 {
		return found, &MissingError{Missing: missing, Available: Available(cands, mappings)}
	}
	return found, nil
}

// Available lists, sorted, the formats the artifacts hold under the given mappings (or under
// Zuul's image-job convention when there are none).
func Available(cands []Candidate, mappings []Mapping) []string {
	var out []string
	add := func(f string) {
		if f != "" && !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	if len(mappings) > 0 {
		for _, m := range mappings {
			f := untrusted.CanonicalFormat(m.Format)
			if _, ok := find(cands, mappings, f); ok {
				add(f)
			}
		}
	} else {
		for _, c := range cands {
			if metaString(c, "type") == zuulImageType {
				add(untrusted.CanonicalFormat(metaString(c, "format")))
			}
		}
	}
	slices.Sort(out)
	return out
}

// find returns the first artifact that holds format (already canonical).
func find(cands []Candidate, mappings []Mapping, format string) (Candidate, bool) {
	for _, c := range cands {
		if holds(c, mappings, format) {
			return c, true
		}
	}
	return Candidate{}, false
}

func holds(c Candidate, mappings []Mapping, format string) bool {
	if len(mappings) == 0 {
		return metaString(c, "type") == zuulImageType &&
			untrusted.CanonicalFormat(metaString(c, "format")) == format
	}
	typ := metaString(c, "type")
	for _, m := range mappings {
		if untrusted.CanonicalFormat(m.Format) != format || m.Type != typ {
			continue
		}
		if m.Name == "" || m.Name == c.Name {
			return true
		}
	}
	return false
}

// Checksums returns the lower-case hex sha256 and md5 an artifact's metadata declares for
// the uncompressed file; either is empty when not declared.
func Checksums(c Candidate) (sha256, md5 string) {
	return strings.ToLower(metaString(c, "sha256")), strings.ToLower(metaString(c, "md5sum"))
}

// Compression returns "zst" or "gz" when the URL's path ends in .zst or .gz, else "".
func Compression(rawURL string) string {
	p := rawURL
	if u, err := url.Parse(rawURL); err == nil {
		p = u.Path
	} else if i := strings.IndexAny(p, "?#"); i >= 0 {
		p = p[:i]
	}
	p = strings.ToLower(p)
	switch {
	case strings.HasSuffix(p, ".zst"):
		return "zst"
	case strings.HasSuffix(p, ".gz"):
		return "gz"
	}
	return ""
}

func metaString(c Candidate, key string) string {
	s, _ := c.Metadata[key].(string)
	return strings.TrimSpace(s)
}
