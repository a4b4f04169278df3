package store

import (
	"context"
	"crypto/md5"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/nodepool-builder/nodepool-builder/internal/fanout"
	"github.com/nodepool-builder/nodepool-builder/internal/fsync"
)

const partialDirName = ".partial"

// The suffixes, after a build's file, of its checksum sidecars (as sha256sum
// and md5sum write them), and after the build's name, of DIB's manifest
// directory.
const (
	sha256Ext   = ".sha256"
	md5Ext      = ".md5"
	manifestExt = ".d"
)

// A build's files are named <image>-<build_id>.<tail>, and matched whole: the
// name of another build can begin with this one's followed by a dot (image
// "img1-22.04" and build "img1-22"), but its tail then holds a '-', which no
// tail of these does, since neither formats nor suffixes hold one.
var (
	// fileTail is a tail in the images-dir: a format's file (DIB's suffix of
	// it, as "squash" for squashfs), its sidecars, or DIB's manifest "d".
	fileTail = formatWord + `(?:` + regexp.QuoteMeta(sha256Ext) + `|` + regexp.QuoteMeta(md5Ext) + `)?`
	// partialTail is a tail in the partial directory: a format's file made
	// there, or a file of its download in progress.
	partialTail = formatWord + `(?:` + partialSuffixes() + `)?`

	fileTailName    = regexp.MustCompile(`^` + fileTail + `$`)
	partialTailName = regexp.MustCompile(`^` + partialTail + `$`)
)

// isBuildFile tells whether name, in the images-dir (or the partial directory
// when inPartial), is one of the files of build <image>-<build_id>.
func isBuildFile(name, build string, inPartial bool) bool {
	tail, ok := strings.CutPrefix(name, build+".")
	if !ok {
		return false
	}
	if inPartial {
		return partialTailName.MatchString(tail)
	}
	// "<part>-status.json" has the shape of build <part>-status's file.
	return fileTailName.MatchString(tail) && !ownFile(name)
}

// FilePath is where a build's file of a format lives: <images-dir>/<image>-<build_id>.<format>.
// Names come from records, which other programs write: one that would lead
// out of the images-dir is an error.
func (s *Store) FilePath(image, buildID, format string) (string, error) {
	if !safePart(format) {
		return "", fmt.Errorf("format %q of build %s names no file of the images-dir: the record is refused", format, BuildName(image, buildID))
	}
	return s.inDir(image, buildID, "."+format)
}

// BuildPath is a build's path without the format suffix, as DIB's -o takes it.
func (s *Store) BuildPath(image, buildID string) (string, error) {
	return s.inDir(image, buildID, "")
}

// inDir is <images-dir>/<image>-<build_id><suffix>, or an error when the
// image or id is no safe part of a name, or the name is no file right in the
// images-dir.
func (s *Store) inDir(image, buildID, suffix string) (string, error) {
	name := BuildName(image, buildID) + suffix
	p := filepath.Join(s.dir, name)
	if !safePart(image) || !safePart(buildID) || !filepath.IsLocal(name) || filepath.Dir(p) != filepath.Clean(s.dir) {
		return "", fmt.Errorf("build %q of image %q names no file of the images-dir: the record is refused", buildID, image)
	}
	return p, nil
}

// safePart tells whether s can be part of a file name: not empty, not a
// relative step, no separator.
func safePart(s string) bool {
	return s != "" && s != "." && s != ".." && !strings.ContainsAny(s, `/\`)
}

// partialDir is where downloads in progress live until verified.
func (s *Store) partialDir() string { return filepath.Join(s.dir, partialDirName) }

// tempPath is where a build's file of format is made before it is added:
// <partial dir>/<image>-zuul-<zuul uuid>.<format> for a build fetched from
// Zuul, which a download resumed by a later build finds, else
// <partial dir>/<image>-<build_id>.<format>.
func (s *Store) tempPath(b Build, format string) (string, error) {
	if _, err := s.FilePath(b.Image, b.ID, format); err != nil {
		return "", err
	}
	name := b.Name() + "." + format
	if b.Zuul.UUID != "" {
		// Hex, as Zuul writes them: the partial sweep, which matches hex
		// alone, finds every file so named.
		if !isHex(b.Zuul.UUID) {
			return "", fmt.Errorf("Zuul build %q of build %s names no file: the record is refused", b.Zuul.UUID, b.Name())
		}
		name = zuulPartialName(b.Image, b.Zuul.UUID, format)
	}
	return filepath.Join(s.partialDir(), name), nil
}

// zuulPartialName names the files made of one format of a Zuul build of an
// image before they are added; it is stable across restarts so a download can
// resume.
func zuulPartialName(image, zuulUUID, format string) string {
	return image + "-zuul-" + zuulUUID + "." + format
}

// RemovePartials removes the partial downloads of an image's Zuul builds, except
// those of the Zuul build keep (empty: all of them).
func (s *Store) RemovePartials(image, keep string) error {
	entries, err := os.ReadDir(s.partialDir())
	if err != nil {
		return fmt.Errorf("list partial downloads: %w", err)
	}
	for _, e := range entries {
		// The whole name: image "fedora" keeps off "fedora-40"'s files, and
		// off "fedora-zuul-ab.c"'s.
		m := partialName.FindStringSubmatch(e.Name())
		if m == nil || m[1] != image || (keep != "" && m[2] == keep) {
			continue
		}
		if err := os.Remove(filepath.Join(s.partialDir(), e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove partial download: %w", err)
		}
	}
	return nil
}

func isHex(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

// writeSidecars writes <file>.sha256 and <file>.md5 in the format of sha256sum and
// md5sum, as diskimage-builder writes them.
func writeSidecars(path, sha256, md5 string) error {
	base := filepath.Base(path)
	for ext, sum := range map[string]string{sha256Ext: sha256, md5Ext: md5} {
		if sum == "" {
			continue
		}
		if err := writeFileAtomic(path+ext, []byte(sum+"  "+base+"\n")); err != nil {
			return fmt.Errorf("write checksum of %s: %w", path, err)
		}
	}
	return nil
}

// ReadSidecar reads the checksum from a sidecar written by md5sum/sha256sum;
// "" when the file does not exist.
func ReadSidecar(path string) (string, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read checksum %s: %w", path, err)
	}
	fields := strings.Fields(string(data))
	if len(fields) == 0 {
		return "", fmt.Errorf("read checksum %s: file is empty", path)
	}
	return strings.ToLower(fields[0]), nil
}

// removeFormat removes a build's file of one format and its sidecars.
func (s *Store) removeFormat(image, buildID, format string) error {
	p, err := s.FilePath(image, buildID, format)
	if err != nil {
		return fmt.Errorf("remove a file: %w", err)
	}
	for _, name := range []string{p, p + sha256Ext, p + md5Ext} {
		if err := os.Remove(name); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove %s: %w", name, err)
		}
	}
	return nil
}

// removeBuildFiles removes every file of a build, whether its record lists it
// or not: its formats, sidecars and DIB's <image>-<build_id>.d manifest
// directory, and the files made under its name in the partial directory and
// not added. Those made under its Zuul build's name stay for a later build of
// it to resume, until the partial sweep.
func (s *Store) removeBuildFiles(image, buildID string) error {
	if _, err := s.BuildPath(image, buildID); err != nil {
		return fmt.Errorf("remove files: %w", err)
	}
	build := BuildName(image, buildID)
	for _, dir := range []string{s.dir, s.partialDir()} {
		entries, err := os.ReadDir(dir)
		if errors.Is(err, os.ErrNotExist) && dir != s.dir {
			continue
		}
		if err != nil {
			return fmt.Errorf("list %s: %w", dir, err)
		}
		for _, e := range entries {
			if !isBuildFile(e.Name(), build, dir != s.dir) {
				continue
			}
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return fmt.Errorf("remove files of %s: %w", build, err)
			}
		}
	}
	return nil
}

// writeFileAtomic writes data to a temporary file beside path, syncs it and renames
// it into place, so readers never see half a file.
func writeFileAtomic(path string, data []byte) error {
	tmp, err := createTemp(path, tempWrite)
	if err != nil {
		return err
	}
	return fsync.WriteFile(tmp, path, data)
}

// HashFile reads a file once and returns its sha256, md5 and size: for files made
// on this host (a conversion, a DIB build that wrote no checksums). The two hashes run
// in parallel over the one read, so the file takes about as long as md5 alone. A large
// image takes minutes: HashFile stops between two chunks once ctx is done, and returns
// its error.
func HashFile(ctx context.Context, path string) (sha, md string, size int64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return "", "", 0, fmt.Errorf("checksum %s: %w", path, err)
	}
	defer f.Close()
	hs, hm := sha256.New(), md5.New()
	if size, err = fanout.Copy(ctx, f, hs, hm); err != nil {
		return "", "", 0, fmt.Errorf("checksum %s: %w", path, err)
	}
	return hex.EncodeToString(hs.Sum(nil)), hex.EncodeToString(hm.Sum(nil)), size, nil
}

// StatusPath is the file in which the daemon leaves the state of one of its
// parts (e.g. "gearman") for image-status to show: <images-dir>/<part>-status.json.
func (s *Store) StatusPath(part string) string {
	return filepath.Join(s.dir, part+"-status.json")
}

// WriteStatus replaces a part's status file: readers see the old or the new one whole.
func (s *Store) WriteStatus(part string, data []byte) error {
	return writeFileAtomic(s.StatusPath(part), data)
}
