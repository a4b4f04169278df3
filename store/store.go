// Package store owns the images-dir and the state: the layout of image files and
// their checksum sidecars, and the records of builds, uploads and poll cursors,
// which change only through the store's named operations.
package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/perm"
	"github.com/nodepool-builder/nodepool-builder/internal/redact"
)

// Access says what opening a store may do.
type Access int

const (
	// Create makes the images-dir, the state and the builder id when missing:
	// the builder itself opens its store so.
	Create Access = iota
	// Existing reads and writes existing state only (admin commands): a missing
	// images-dir or state is ErrNotInitialized, and nothing is created.
	Existing
	// ReadOnly reads existing state only (listings): nothing is written.
	ReadOnly
)

// Store is an opened images-dir and its state. The backend holds the records
// and stays inside the store, so that every way a record changes is one of the
// store's named operations; Store adds the file layout and the steps every
// backend shares.
type Store struct {
	backend   Backend
	dir       string
	builderID string
	hostname  string
	now       func() time.Time
	// ownedMu orders the changes of the marks of this builder's builds.
	ownedMu sync.Mutex
}

// Options say where the images-dir and its state are.
type Options struct {
	ImagesDir string
	DBPath    string           // the SQLite state; default <ImagesDir>/builder.db
	Now       func() time.Time // default time.Now
	Access    Access
	// Backend holds the state instead of SQLite at DBPath when set; the store
	// closes it.
	Backend Backend
	// Hostname is recorded on the builds this builder makes; default the host's.
	Hostname string
	// Logger tells of the copy a SQLite state's schema upgrade keeps and of
	// its records refused on read; default slog's default logger.
	Logger *slog.Logger
	// TakeOver lets Create use an images-dir that another builder used (its
	// builder_id.txt and files), becoming that builder; without it such a
	// directory is refused with ErrForeignImagesDir.
	TakeOver bool
}

// Open opens the images-dir and its state.
func Open(ctx context.Context, opts Options) (*Store, error) {
	if opts.ImagesDir == "" {
		return nil, errors.New("open store: images-dir is not set")
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	dbPath := opts.DBPath
	if dbPath == "" {
		dbPath = filepath.Join(opts.ImagesDir, "builder.db")
	}
	id, err := readBuilderID(opts.ImagesDir)
	if err != nil {
		return nil, err
	}
	if opts.Access == Create {
		// Before anything is created: what is there tells whose the directory is.
		var stateExisted *bool
		if opts.Backend == nil {
			_, err := os.Stat(dbPath)
			existed := err == nil
			stateExisted = &existed
		}
		if err := claim(opts.ImagesDir, id, stateExisted, opts.TakeOver); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(filepath.Join(opts.ImagesDir, partialDirName), perm.Dir); err != nil {
			return nil, fmt.Errorf("create images-dir: %w", err)
		}
		// An images-dir an older builder made is open to every user of the
		// host: its images, their manifests and the state are not for them.
		if err := perm.Tighten(opts.ImagesDir); err != nil {
			return nil, fmt.Errorf("images-dir: %w", err)
		}
	} else if opts.Backend != nil {
		// The state is elsewhere: whether the images-dir must exist is the
		// caller's to say (a listing of ZooKeeper's records needs none).
	} else if fi, err := os.Stat(opts.ImagesDir); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("images-dir %s does not exist or is not a directory: %w", opts.ImagesDir, ErrNotInitialized)
	}
	backend := opts.Backend
	where := "the state"
	if backend == nil {
		sq, err := openSQLite(ctx, dbPath, opts.Access, opts.Now, opts.Logger)
		if err != nil {
			return nil, err
		}
		backend = sq
		where = "state database " + dbPath
	}
	if opts.Access == Create {
		if id, err = bindBuilder(ctx, backend, opts.ImagesDir, id, where); err != nil {
			backend.Close()
			return nil, err
		}
		if err := writeOwner(opts.ImagesDir, id); err != nil {
			backend.Close()
			return nil, err
		}
	}
	if opts.Hostname == "" {
		opts.Hostname, _ = os.Hostname()
	}
	return &Store{backend: backend, dir: opts.ImagesDir, builderID: id, hostname: opts.Hostname, now: opts.Now}, nil
}

// bindBuilder ties the state to the images-dir's builder id. A builder_id.txt
// that is missing is written: with a new id for new state, with the state's id
// when only the file was lost. Ids that disagree stop the builder: cloud images
// are tagged with the id, so going on would take one builder's images for
// another's, and the leak sweep would delete them.
func bindBuilder(ctx context.Context, backend Backend, dir, id, where string) (string, error) {
	path := filepath.Join(dir, "builder_id.txt")
	if id != "" {
		held, err := backend.BindBuilder(ctx, id)
		if errors.Is(err, ErrOtherBuilder) {
			return "", fmt.Errorf("%s belongs to builder %s, but %s says %s: %w. One of them was replaced (a restore "+
				"from another host?). Cloud images are tagged with the builder id, so running with both would take one "+
				"builder's images for another's. Put this builder's own state back, or, if %s is the file that changed, "+
				"write %s into it", where, held, path, id, ErrOtherBuilder, path, held)
		}
		return id, err
	}
	held, err := backend.BindBuilder(ctx, newUUID4())
	if err != nil && !errors.Is(err, ErrOtherBuilder) {
		return "", err
	}
	// Either a new id the state now holds, or the state's own: the file was lost.
	if err := writeFileAtomic(path, []byte(held)); err != nil {
		return "", fmt.Errorf("write builder id: %w", err)
	}
	return held, nil
}

// BuilderID is this images-dir's builder id (builder_id.txt, as nodepool writes
// it); empty when a store opened without Create has none yet.
func (s *Store) BuilderID() string { return s.builderID }

// Dir is the images-dir.
func (s *Store) Dir() string { return s.dir }

// Now is the store's clock.
func (s *Store) Now() time.Time { return s.now() }

// readBuilderID reads builder_id.txt; "" when it is missing or empty.
func readBuilderID(dir string) (string, error) {
	data, err := os.ReadFile(filepath.Join(dir, "builder_id.txt"))
	if err != nil && !os.IsNotExist(err) {
		return "", fmt.Errorf("read builder id: %w", err)
	}
	return strings.TrimSpace(string(data)), nil
}

// newUUID4 returns a random (version 4) UUID in its dashed form.
func newUUID4() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// NewBuildID returns a build id: a uuid4 in hex, as nodepool uses.
func NewBuildID() string { return strings.ReplaceAll(newUUID4(), "-", "") }

// Build reads a build as the Backend does, with what it says without the
// userinfo of any URL, as PutBuild stores it: a record written before the
// builder took it out, or by another program, shows none either.
func (s *Store) Build(ctx context.Context, id string) (Build, error) {
	b, err := s.backend.Build(ctx, id)
	b.redact()
	return b, err
}

// Builds reads builds as the Backend does, each as Build shows it.
func (s *Store) Builds(ctx context.Context, f BuildFilter) ([]Build, error) {
	builds, err := s.backend.Builds(ctx, f)
	for i := range builds {
		builds[i].redact()
	}
	return builds, err
}

// Uploads reads uploads as the Backend does, their LastError without the
// userinfo of any URL, as Build shows a build's reason.
func (s *Store) Uploads(ctx context.Context, f UploadFilter) ([]Upload, error) {
	uploads, err := s.backend.Uploads(ctx, f)
	for i := range uploads {
		uploads[i].LastError = redact.Userinfo(uploads[i].LastError)
	}
	return uploads, err
}

// Cursor reads a poll cursor as the Backend does, its Reason without the
// userinfo of any URL, as Build shows a build's reason.
func (s *Store) Cursor(ctx context.Context, image string) (Cursor, error) {
	c, err := s.backend.Cursor(ctx, image)
	c.Reason = redact.Userinfo(c.Reason)
	return c, err
}

// CreateBuild records a new build of this builder in state building and returns
// it with its id and version.
func (s *Store) CreateBuild(ctx context.Context, b Build) (Build, error) {
	if b.ID == "" {
		b.ID = NewBuildID()
	}
	now := s.now().UTC()
	b.State, b.StateTime, b.Created, b.BuilderID, b.Hostname, b.Version = Building, now, now, s.builderID, s.hostname, 0
	if err := s.backend.Write(ctx, PutBuild(&b)); err != nil {
		return Build{}, fmt.Errorf("record build %s: %w", b.Name(), err)
	}
	return b, nil
}

// CreateUpload records a new upload of a build, as read, to a provider in state
// uploading, its first attempt under way. It fails with ErrConflict when the build changed since it was read
// (a release, say), and it changes the build's version, so that a release that
// read the build before this upload existed fails in turn.
func (s *Store) CreateUpload(ctx context.Context, b *Build, provider, format string) (Upload, error) {
	u := s.newUpload(*b, provider, format, 1)
	if err := s.claimUpload(ctx, b, &u); err != nil {
		return Upload{}, err
	}
	return u, nil
}

// CreateStreamUpload records a new upload of b to a provider in state
// uploading, its first attempt under way, for an upload that follows the
// download of a build this builder is making: b is building and the caller
// holds the image's build lock, under which nothing but its writer changes the
// build. Unlike CreateUpload it leaves the build's record alone, which the
// build's writer goes on writing.
func (s *Store) CreateStreamUpload(ctx context.Context, b Build, provider, format string) (Upload, error) {
	if b.State != Building || b.BuilderID != s.builderID {
		return Upload{}, fmt.Errorf("record upload of %s to %s: the build is not one this builder is making", b.Name(), provider)
	}
	u := s.newUpload(b, provider, format, 1)
	if err := s.backend.Write(ctx, PutUpload(&u)); err != nil {
		return Upload{}, fmt.Errorf("record upload of %s to %s: %w", b.Name(), provider, err)
	}
	return u, nil
}

// RequestBuild records a manual build request; requesting twice is once.
func (s *Store) RequestBuild(ctx context.Context, image string) error {
	return s.backend.RequestBuild(ctx, image)
}

// BuildRequests returns the pending build requests by image, as the backend
// holds them (see BuildRequest for one read afresh).
func (s *Store) BuildRequests(ctx context.Context) (map[string]time.Time, error) {
	return s.backend.BuildRequests(ctx)
}

// ClearBuildRequest removes an image's request if it was made at or before asOf.
func (s *Store) ClearBuildRequest(ctx context.Context, image string, asOf time.Time) error {
	return s.backend.ClearBuildRequest(ctx, image, asOf)
}

// SetPaused pauses or unpauses an image at run time; it is idempotent.
func (s *Store) SetPaused(ctx context.Context, image string, paused bool) error {
	return s.backend.SetPaused(ctx, image, paused)
}

// Paused returns the images paused at run time, with when.
func (s *Store) Paused(ctx context.Context) (map[string]time.Time, error) {
	return s.backend.Paused(ctx)
}

// ImageNames lists, sorted, every image the state has a place for (see
// Backend.ImageNames): in ZooKeeper, what nodepool's getImageNames lists.
func (s *Store) ImageNames(ctx context.Context) ([]string, error) {
	return s.backend.ImageNames(ctx)
}

// LeakMark records the first sighting of a cloud image that looked leaked and
// returns when that was.
func (s *Store) LeakMark(ctx context.Context, provider, externalID string) (time.Time, error) {
	return s.backend.LeakMark(ctx, provider, externalID)
}

// ClearLeakMarks forgets a provider's marks except those in keep.
func (s *Store) ClearLeakMarks(ctx context.Context, provider string, keep map[string]bool) error {
	return s.backend.ClearLeakMarks(ctx, provider, keep)
}

// TryLock takes a lock without waiting; ErrHeld when another holder has it,
// ErrNotFound when the build or upload the key names does not exist.
func (s *Store) TryLock(ctx context.Context, key LockKey) (Held, error) {
	return s.backend.TryLock(ctx, key)
}

// Close closes the state.
func (s *Store) Close() error { return s.backend.Close() }

// Session is a state held through a session to a server (ZooKeeper's), which
// may be lost and regained while the builder runs.
type Session interface {
	// Connected tells whether the session is connected now.
	Connected() bool
}

// Session returns the state's session, for the metrics to watch; nil when the
// state is not held through one (SQLite).
func (s *Store) Session() Session {
	if sess, ok := s.backend.(Session); ok {
		return sess
	}
	return nil
}

// SQLite returns the SQLite state, for what only it does (its move to
// ZooKeeper); false when the state is elsewhere.
func (s *Store) SQLite() (*SQLite, bool) {
	sq, ok := s.backend.(*SQLite)
	return sq, ok
}
