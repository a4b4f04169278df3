package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"time"
)

// ownedDirName holds a marker for each build this builder made and no builder
// of its kind has released: <image>-<build id>, holding how many uploads of the
// build this builder began in each provider (an empty file: none yet). In a state shared with
// other programs (ZooKeeper), a record can go without this builder deleting
// it: a Python nodepool-builder whose nodepool.yaml lacks the image deletes its
// uploads and builds, and so does nodepool's dib-image-delete. The marker is
// what tells, then, that the files left are this builder's own, and that the
// build was lost rather than deleted here.
const ownedDirName = ".builds"

// ownedName is a marker's name: <image>-<32 hex>.
var ownedName = regexp.MustCompile(`^(.+)-([0-9a-f]{32})$`)

func (s *Store) ownedPath(image, buildID string) string {
	return filepath.Join(s.dir, ownedDirName, BuildName(image, buildID))
}

// markOwned records that this builder made a build, once its record exists.
func (s *Store) markOwned(image, buildID string) error {
	if err := os.MkdirAll(filepath.Join(s.dir, ownedDirName), 0o750); err != nil {
		return fmt.Errorf("mark build %s as this builder's: %w", BuildName(image, buildID), err)
	}
	f, err := os.OpenFile(s.ownedPath(image, buildID), os.O_CREATE|os.O_WRONLY, 0o640)
	if err != nil {
		return fmt.Errorf("mark build %s as this builder's: %w", BuildName(image, buildID), err)
	}
	return f.Close()
}

// unmarkOwned drops a build's marker: this builder released or failed it.
func (s *Store) unmarkOwned(image, buildID string) error {
	if err := os.Remove(s.ownedPath(image, buildID)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("unmark build %s: %w", BuildName(image, buildID), err)
	}
	return nil
}

// marks is what a build's marker holds.
type marks struct {
	// Uploads counts, by provider, the uploads of the build this builder
	// began: one, unless an upload it made was deleted since.
	Uploads map[string]int `json:"uploads,omitempty"`
}

// readMarks reads a build's marker; false when there is none.
func (s *Store) readMarks(image, buildID string) (marks, bool, error) {
	var m marks
	data, err := os.ReadFile(s.ownedPath(image, buildID))
	if errors.Is(err, os.ErrNotExist) {
		return m, false, nil
	}
	if err != nil {
		return m, false, fmt.Errorf("read the marks of build %s: %w", BuildName(image, buildID), err)
	}
	if len(data) > 0 {
		if err := json.Unmarshal(data, &m); err != nil {
			return m, true, fmt.Errorf("read the marks of build %s: %w", BuildName(image, buildID), err)
		}
	}
	return m, true, nil
}

// CountUpload records that this builder began a new upload of its build b to
// provider (not a retry of a failed one), and returns how many it has begun
// there: more than one means an upload it made there is gone, deleted by an
// operator (image-delete) or by another program. 0 for a build of another
// builder.
func (s *Store) CountUpload(b Build, provider string) (int, error) {
	s.ownedMu.Lock()
	defer s.ownedMu.Unlock()
	m, ok, err := s.readMarks(b.Image, b.ID)
	if !ok || err != nil {
		return 0, err
	}
	if m.Uploads == nil {
		m.Uploads = map[string]int{}
	}
	m.Uploads[provider]++
	data, err := json.Marshal(m)
	if err != nil {
		return 0, err
	}
	if err := writeFileAtomic(s.ownedPath(b.Image, b.ID), data); err != nil {
		return 0, fmt.Errorf("count an upload of build %s to %s: %w", b.Name(), provider, err)
	}
	return m.Uploads[provider], nil
}

// UploadsBegun is how many uploads of this builder's build b to provider it
// has begun (see CountUpload).
func (s *Store) UploadsBegun(b Build, provider string) (int, error) {
	m, _, err := s.readMarks(b.Image, b.ID)
	return m.Uploads[provider], err
}

// Owns tells whether this builder made a build that no builder of its kind has
// released or failed since: whether its record going is a loss.
func (s *Store) Owns(image, buildID string) bool {
	_, err := os.Stat(s.ownedPath(image, buildID))
	return err == nil
}

// ForgetBuild is the end of a build this builder deletes: its files and its
// marker go, once its record has. A build released by no builder of this kind
// (Released false: another program marked it deleting) keeps its marker, so
// that SettleLost reports it as lost once its record is gone.
func (s *Store) ForgetBuild(b Build) error {
	if err := s.removeBuildFiles(b.Image, b.ID); err != nil {
		return err
	}
	if !b.Released() {
		return nil
	}
	return s.unmarkOwned(b.Image, b.ID)
}

// Released tells whether a deleting build was released by a builder of this
// kind, which always says why; a build another program marked deleting keeps
// the reason it had while ready, which is none.
func (b Build) Released() bool { return b.State == Deleting && b.Reason != "" }

// LostBuild is a build of this builder whose record went without a builder of
// its kind releasing it.
type LostBuild struct {
	Image, ID string
	// ZuulUUID is the Zuul build it was fetched from, when its image's poll
	// cursor named it: the cursor now says it was lost, so that the poller does
	// not fetch that Zuul build again on its own.
	ZuulUUID string
}

// MarkOwnedBuilds marks every ready build of this builder, as BeginBuild marks
// the new ones: builds made before markers were kept, or taken over with an
// images-dir. A build released meanwhile is left unmarked.
func (s *Store) MarkOwnedBuilds(ctx context.Context) error {
	builds, err := s.Builds(ctx, BuildFilter{State: Ready})
	if err != nil {
		return err
	}
	for _, b := range builds {
		if b.BuilderID != s.builderID || s.Owns(b.Image, b.ID) {
			continue
		}
		if err := s.markOwned(b.Image, b.ID); err != nil {
			return err
		}
		// Read afresh: a release between the listing and the mark would
		// otherwise leave a marker that reports the build lost.
		now, err := s.Build(ctx, b.ID)
		if errors.Is(err, ErrNotFound) || err == nil && now.State != Ready {
			if err := s.unmarkOwned(b.Image, b.ID); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// SettleLost finds the builds of this builder whose records are gone though
// no builder of its kind released them, and settles each under its image's
// lock: the poll cursor that names it says it was lost, its files and its
// marker go. busy tells of work of this process on an image or a build, which
// is left alone (nil: none); so is an image whose lock another holds, until a
// later call. A change of a marker that a stop cut short, last changed before
// the time given, goes too.
func (s *Store) SettleLost(ctx context.Context, before time.Time, busy func(image, buildID string) bool) ([]LostBuild, error) {
	// The markers are listed before the state is read: a marker listed then
	// belongs to a build recorded before it, which the read then sees.
	entries, err := os.ReadDir(filepath.Join(s.dir, ownedDirName))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list this builder's builds: %w", err)
	}
	builds, err := s.Builds(ctx, BuildFilter{})
	if err != nil {
		return nil, err
	}
	recorded := map[string]bool{}
	for _, b := range builds {
		recorded[b.Name()] = true
	}
	var lost []LostBuild
	var errs []error
	for _, e := range entries {
		if tempName.MatchString(e.Name()) {
			if info, err := e.Info(); err == nil && info.ModTime().Before(before) {
				os.Remove(filepath.Join(s.dir, ownedDirName, e.Name()))
			}
			continue
		}
		m := ownedName.FindStringSubmatch(e.Name())
		if m == nil || recorded[e.Name()] || (busy != nil && (busy(m[1], "") || busy(m[1], m[2]))) {
			continue
		}
		l, err := s.settleLost(ctx, m[1], m[2])
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if l != nil {
			lost = append(lost, *l)
		}
	}
	return lost, errors.Join(errs...)
}

// settleLost settles one build whose record the cache no longer holds: nil
// when its image's lock is held elsewhere or the state itself still has it.
func (s *Store) settleLost(ctx context.Context, image, id string) (*LostBuild, error) {
	lctx, unlock, err := s.Hold(ctx, LockKey{Image: image})
	if errors.Is(err, ErrHeld) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer unlock()
	switch _, err := s.Build(lctx, id); {
	case err == nil:
		return nil, nil // the cache had not seen it yet
	case !errors.Is(err, ErrNotFound):
		return nil, err
	}
	l := &LostBuild{Image: image, ID: id}
	cur, err := s.Cursor(lctx, image)
	switch {
	case err != nil:
		return nil, err
	case cur.Build == id && cur.Outcome == string(Ready):
		cur.Outcome = OutcomeLost
		cur.Reason = fmt.Sprintf("its build %s was deleted by another program, not by this builder", id)
		cur.Time = s.now()
		if err := s.backend.Write(lctx, PutCursor(cur)); err != nil {
			return nil, fmt.Errorf("record build %s lost on the poll cursor: %w", BuildName(image, id), err)
		}
		l.ZuulUUID = cur.ZuulUUID
	}
	if err := s.removeBuildFiles(image, id); err != nil {
		return nil, err
	}
	if err := s.unmarkOwned(image, id); err != nil {
		return nil, err
	}
	return l, nil
}

// OutcomeLost is a poll cursor's outcome once the build its Zuul build became
// was deleted by another program: that Zuul build is not fetched again unless
// an operator asks.
const OutcomeLost = "lost"

// OutcomeReset is the outcome of a cursor an operator reset: the next poll
// fetches Zuul's newest build.
const OutcomeReset = "reset"
