package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// ErrForeignImagesDir: the images-dir holds what another builder left (a
// builder_id.txt, build files) and no state of this builder; using it would
// take that builder's id, and in a shared state its builds, for this one's.
var ErrForeignImagesDir = errors.New("images-dir was used by another builder")

// ownerFileName records the builder id this program runs the images-dir as:
// written on its first start there, or by an explicit take-over. A
// builder_id.txt it did not write (a Python nodepool-builder's) has none.
const ownerFileName = "builder.owner"

// claim says whether this builder may use an images-dir as its own, before
// anything is created there. stateExisted tells whether the builder's own
// state of the images-dir existed (the SQLite file; nil for a shared state,
// whose records hold no mark of the images-dir). It refuses, wrapping
// ErrForeignImagesDir, an images-dir with a builder_id.txt this program did not
// write, or with build files while there is no state of this builder, unless
// takeOver.
func claim(dir, id string, stateExisted *bool, takeOver bool) error {
	owner, err := readOwner(dir)
	if err != nil {
		return err
	}
	// Every earlier start of this program made .partial; nodepool does not.
	if owner == "" && isDir(filepath.Join(dir, partialDirName)) {
		owner = id
	}
	ours := owner != ""
	if stateExisted != nil {
		ours = *stateExisted
	}
	var why []string
	switch {
	case id != "" && owner == "":
		why = append(why, fmt.Sprintf("a builder_id.txt (builder %s) that this builder did not write", id))
	case id != "" && owner != id:
		why = append(why, fmt.Sprintf("a builder_id.txt that says builder %s, where this builder ran as %s", id, owner))
	}
	var files []string
	if !ours {
		if files, err = buildFiles(dir); err != nil {
			return err
		}
		if len(files) > 0 {
			why = append(why, fmt.Sprintf("files of builds this builder has no record of: %s", listSome(files, 8)))
		}
	}
	if len(why) == 0 || takeOver {
		return nil
	}
	return fmt.Errorf("%w: %s holds %s. Another builder used it (a Python nodepool-builder, say), or this builder's "+
		"state was lost. Nothing there is removed: this builder removes only what it made. But using the directory "+
		"makes this builder that builder (its builder id, and in ZooKeeper the builds recorded under it, whose "+
		"uploads and files it would then rotate and delete). Give this builder an images-dir of its own; or, to take "+
		"this one over, stop the builder that used it and run take-over-images-dir (it lists what it takes over)",
		ErrForeignImagesDir, dir, strings.Join(why, ", and "))
}

// writeOwner records that this program runs the images-dir as builder id.
func writeOwner(dir, id string) error {
	if err := writeFileAtomic(filepath.Join(dir, ownerFileName), []byte(id+"\n")); err != nil {
		return fmt.Errorf("record the images-dir's builder: %w", err)
	}
	return nil
}

// readOwner reads the builder id this program recorded; "" when none.
func readOwner(dir string) (string, error) {
	data, err := os.ReadFile(filepath.Join(dir, ownerFileName))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read the images-dir's builder: %w", err)
	}
	return strings.TrimSpace(string(data)), nil
}

// buildFiles lists the names in dir that look like a build's files:
// <image>-<32 hex>.<format, sidecar or .d>.
func buildFiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list images-dir: %w", err)
	}
	var out []string
	for _, e := range entries {
		if buildFileName.MatchString(e.Name()) {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out, nil
}

// Unrecorded lists the names in the images-dir that look like a build's files
// but belong to no build this builder recorded as its own: another builder's,
// or an operator's. The builder never removes them.
func (s *Store) Unrecorded(ctx context.Context) ([]string, error) {
	files, err := buildFiles(s.dir)
	if err != nil || len(files) == 0 {
		return nil, err
	}
	builds, err := s.Builds(ctx, BuildFilter{})
	if err != nil {
		return nil, err
	}
	ours := map[string]bool{}
	for _, b := range builds {
		if b.BuilderID == s.builderID {
			ours[b.Name()] = true
		}
	}
	var out []string
	for _, name := range files {
		if m := buildFileName.FindStringSubmatch(name); !ours[BuildName(m[1], m[2])] {
			out = append(out, name)
		}
	}
	return out, nil
}

// listSome joins the first n names, saying how many more there are.
func listSome(names []string, n int) string {
	if len(names) <= n {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s (and %d more)", strings.Join(names[:n], ", "), len(names)-n)
}

func isDir(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}

// CheckClaim tells, creating nothing, whether Open with Create would refuse
// the images-dir as another builder's (ErrForeignImagesDir). dbPath is the
// SQLite state's path; empty when the state is shared (ZooKeeper).
func CheckClaim(dir, dbPath string) error {
	if !isDir(dir) {
		return nil // a new images-dir is this builder's
	}
	id, err := readBuilderID(dir)
	if errors.Is(err, fs.ErrPermission) {
		// An images-dir of another user's, closed to others (perm.Dir):
		// CheckImagesDir says whose it is and what to do.
		return nil
	}
	if err != nil {
		return err
	}
	var stateExisted *bool
	if dbPath != "" {
		_, err := os.Stat(dbPath)
		existed := err == nil
		stateExisted = &existed
	}
	return claim(dir, id, stateExisted, false)
}
