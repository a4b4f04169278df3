package store

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/redact"
)

// Errors of the state, wrapped by what a Backend returns.
var (
	// ErrNotFound: the build or upload does not exist.
	ErrNotFound = errors.New("not found")
	// ErrConflict: a record changed (or went) since it was read, or a record to
	// create exists already. Nothing of the write happened; re-read and decide again.
	ErrConflict = errors.New("changed meanwhile")
	// ErrNotInitialized: the images-dir or its state does not exist, and the
	// store was opened without creating them.
	ErrNotInitialized = errors.New("not initialized")
	// ErrOtherBuilder: the state belongs to another builder id than the
	// images-dir's builder_id.txt.
	ErrOtherBuilder = errors.New("state of another builder")
	// ErrHeld: a lock is held by another holder.
	ErrHeld = errors.New("lock held by another")
)

// SourceName names the source a build came from, as its record keeps it: a
// source is one package (a source.Source), and the store lists none of them.
type SourceName string

// Build sources.
const (
	SourceDIB  SourceName = "dib"
	SourceZuul SourceName = "zuul"
)

// State is the state of a build or an upload.
type State string

// States of builds and uploads.
const (
	Building  State = "building"
	Uploading State = "uploading"
	Ready     State = "ready"
	Deleting  State = "deleting"
	Failed    State = "failed"
)

// Build is an image build: files in the images-dir and their record.
type Build struct {
	ID        string
	Image     string
	Source    SourceName
	State     State
	StateTime time.Time
	Created   time.Time
	BuilderID string
	Hostname  string // of the builder that made it (nodepool's "builder")
	PID       int    // the building process, for crash recovery
	Reason    string // why it failed
	Files     []File // sorted by format
	// Refused holds, by format, why a file of this build was refused for good (a
	// checksum that does not match, an unsafe image): it is not fetched again.
	Refused map[string]string
	Zuul    ZuulRef
	// Username, PythonPath and ShellType are the diskimage's, as nodepool
	// records them for the launcher; empty means nodepool's default.
	Username, PythonPath, ShellType string
	// Request names the request that asked for this build (a gearman job's
	// unique id), so that the same request made again finds it.
	Request string
	// Version is the record's version as read: a write names it and fails with
	// ErrConflict when the record changed meanwhile. 0: not stored yet.
	Version int64
}

// ZuulRef identifies the Zuul build a build was fetched from.
type ZuulRef struct {
	UUID    string
	ID      int64
	EndTime time.Time
	LogURL  string
}

// File is one format of a build.
type File struct {
	Format string
	SHA256 string
	MD5    string
	Size   int64
	URL    string // the artifact it came from, for Zuul builds
	// Present: on disk. False once removed after upload, and for a Zuul
	// build's format never downloaded, which the clouds that need it fetch
	// at URL themselves (BuildWriter.AddAtURL).
	Present bool
}

// Name is the build's nodepool-style name, <image>-<build_id>.
func (b Build) Name() string { return BuildName(b.Image, b.ID) }

// File returns the build's file of a format.
func (b Build) File(format string) (File, bool) {
	for _, f := range b.Files {
		if f.Format == format {
			return f, true
		}
	}
	return File{}, false
}

// Formats lists the formats the build has on disk.
func (b Build) Formats() []string {
	var out []string
	for _, f := range b.Files {
		if f.Present {
			out = append(out, f.Format)
		}
	}
	return out
}

// SetFile adds or replaces a file of the build, keeping Files sorted by format.
func (b *Build) SetFile(f File) {
	for i := range b.Files {
		if b.Files[i].Format == f.Format {
			b.Files[i] = f
			return
		}
	}
	i := 0
	for i < len(b.Files) && b.Files[i].Format < f.Format {
		i++
	}
	b.Files = append(b.Files[:i], append([]File{f}, b.Files[i:]...)...)
}

// Refuse records that a format of the build was refused for good, and why.
func (b *Build) Refuse(format, reason string) {
	if b.Refused == nil {
		b.Refused = map[string]string{}
	}
	b.Refused[format] = reason
}

// SetState moves the build to a state; the state time changes only with the state.
func (b *Build) SetState(st State, now time.Time) {
	if b.State != st {
		b.State, b.StateTime = st, now.UTC()
	}
}

// Why an image is paused.
const (
	PausedByConfig  = "config"      // pause: true in the config
	PausedByCommand = "image-pause" // image-pause at run time
)

// PausedBy says what pauses an image: the config (inConfig: pause: true in
// its diskimages or zuul-images entry), then image-pause (paused: the images paused at run time, as
// Paused reads them). Empty when the image runs.
func PausedBy(paused map[string]time.Time, image string, inConfig bool) []string {
	var by []string
	if inConfig {
		by = append(by, PausedByConfig)
	}
	if _, ok := paused[image]; ok {
		by = append(by, PausedByCommand)
	}
	return by
}

// RequestTaken tells whether a build request of image, made at requested, is
// being answered: a build of the image begun then or later is in progress.
// Until one is, the request is pending.
func RequestTaken(builds []Build, image string, requested time.Time) bool {
	for i := range builds {
		b := &builds[i]
		if b.Image == image && b.State == Building && !b.Created.Before(requested) {
			return true
		}
	}
	return false
}

// NewestReady is the newest ready build of image among builds: the one that
// became ready last, by its StateTime, as nodepool ranks an image's builds
// (its rebuild-age counts from that time too); of two ready at the same time,
// the one listed first. nil when there is none.
func NewestReady(builds []Build, image string) *Build {
	var newest *Build
	for i := range builds {
		b := &builds[i]
		if b.Image == image && b.State == Ready && (newest == nil || b.StateTime.After(newest.StateTime)) {
			newest = b
		}
	}
	return newest
}

// Upload is a build's image in one provider's cloud.
type Upload struct {
	BuildID      string
	Image        string // the build's image (from the build)
	Provider     string
	ID           string // 10-digit sequence per build and provider
	State        State
	StateTime    time.Time
	ExternalID   string
	ExternalName string
	Format       string
	Attempts     int
	LastError    string
	NextAttempt  time.Time // earliest retry after a failure
	// Username, PythonPath and ShellType are the build's, as nodepool records
	// them on an upload for the launcher.
	Username, PythonPath, ShellType string
	// Version is the record's version as read, as for Build.
	Version int64
}

// String names an upload for messages.
func (u Upload) String() string {
	return fmt.Sprintf("%s/%s/%s", BuildName(u.Image, u.BuildID), u.Provider, u.ID)
}

// SetState moves the upload to a state; the state time changes only with the state.
func (u *Upload) SetState(st State, now time.Time) {
	if u.State != st {
		u.State, u.StateTime = st, now.UTC()
	}
}

// Cursor is how far the poller has got with one zuul-image.
type Cursor struct {
	Image    string
	ZuulID   int64  // the newest Zuul build settled (ingested or refused)
	ZuulUUID string // its uuid
	// ZuulEndTime is when that build ended, as Zuul said, but never later than
	// Time; zero in a cursor recorded before end times were kept.
	ZuulEndTime time.Time
	Outcome     string // "ready" or "failed"; empty when reset
	Reason      string
	Time        time.Time
	// BehindID is the id of Zuul's newest build when, at the last poll, it was
	// below ZuulID and not newer by its end time: Zuul's ids restarted (its
	// database was rebuilt) or the cursor came from a hostile answer. 0 otherwise.
	BehindID int64
	// Build is the id of the build a ready outcome became ("" otherwise, and
	// in a cursor recorded before it was kept): whether that build is still
	// there is read from the state itself, not from what a cache has seen.
	Build string
	// Waiting says why Zuul's newest build, due, is not fetched: a host its
	// artifacts are on is not one the zuul-image allows (artifact-hosts). It
	// waits for the operator, and goes once that build is fetched or another
	// is due. "" otherwise.
	Waiting string
}

// BuildFilter selects builds; zero fields match everything.
type BuildFilter struct {
	Image  string
	State  State
	Source SourceName
}

// UploadFilter selects uploads; zero fields match everything.
type UploadFilter struct {
	BuildID  string
	Image    string
	Provider string
	State    State
}

// Change is one part of a Write. A Write applies all its changes or none.
type Change struct {
	op     op
	build  *Build
	upload *Upload
	cursor *Cursor
}

type op int

const (
	opPutBuild op = iota + 1
	opDeleteBuild
	opPutUpload
	opDeleteUpload
	opPutCursor
)

// Build is the build a change writes or deletes; nil for other changes. With
// Upload, Cursor and Deletes, it is what a Backend reads of a change.
func (c Change) Build() *Build { return c.build }

// Upload is the upload a change writes or deletes; nil for other changes.
func (c Change) Upload() *Upload { return c.upload }

// Cursor is the cursor a change writes; nil for other changes.
func (c Change) Cursor() *Cursor { return c.cursor }

// Deletes tells whether the change deletes its build or upload.
func (c Change) Deletes() bool { return c.op == opDeleteBuild || c.op == opDeleteUpload }

// PutBuild creates b (Version 0; its ID must be new) or replaces the stored
// record, files included, if it is still at b.Version. After the write,
// b.Version is the new version. What b says is stored without the userinfo of
// any URL in it (see redact.Userinfo), and b holds it so from now.
func PutBuild(b *Build) Change {
	b.redact()
	return Change{op: opPutBuild, build: b}
}

// DeleteBuild removes the build's record if it is still at b.Version. Its
// uploads must be gone.
func DeleteBuild(b Build) Change { return Change{op: opDeleteBuild, build: &b} }

// PutUpload creates u (Version 0: it gets the next id of its build and
// provider, which must be empty) or replaces the stored record if it is still at
// u.Version. After the write, u.ID and u.Version are set. Its LastError is
// stored without the userinfo of any URL, as PutBuild's reason.
func PutUpload(u *Upload) Change {
	u.LastError = redact.Userinfo(u.LastError)
	return Change{op: opPutUpload, upload: u}
}

// DeleteUpload removes the upload's record if it is still at u.Version.
func DeleteUpload(u Upload) Change { return Change{op: opDeleteUpload, upload: &u} }

// PutCursor records an image's poll cursor, whatever it was; its Reason without
// the userinfo of any URL, as PutBuild's. A cursor has no version: it is
// written under its image's build lock, and the last writer wins.
func PutCursor(c Cursor) Change {
	c.Reason = redact.Userinfo(c.Reason)
	return Change{op: opPutCursor, cursor: &c}
}

// redact takes the userinfo of URLs out of what the build says. Failure reasons
// are errors, which may quote a URL with a password in it (an api-url, an
// auth_url), and the state is listed and served on the status pages. Files and
// Refused may be shared with copies of the build that others read: they are
// replaced, not changed, and only when something in them must go.
func (b *Build) redact() {
	b.Reason = redact.Userinfo(b.Reason)
	b.Zuul.LogURL = redact.Userinfo(b.Zuul.LogURL)
	var files []File
	for i, f := range b.Files {
		if clean := redact.Userinfo(f.URL); clean != f.URL {
			if files == nil {
				files = slices.Clone(b.Files)
			}
			files[i].URL = clean
		}
	}
	if files != nil {
		b.Files = files
	}
	var refused map[string]string
	for format, reason := range b.Refused {
		if clean := redact.Userinfo(reason); clean != reason {
			if refused == nil {
				refused = maps.Clone(b.Refused)
			}
			refused[format] = clean
		}
	}
	if refused != nil {
		b.Refused = refused
	}
}

// Backend holds the records of builds, uploads, poll cursors and admin requests.
// Every change of a build or an upload is compare-and-set on its version: a
// step that read a record and wants to change it names the version it read, and
// the write fails with ErrConflict when the record changed meanwhile. A poll
// cursor is written whatever it was: its writers hold the image's build lock.
type Backend interface {
	// BindBuilder ties the state to a builder id: the first call records it, a
	// later one with another id fails with ErrOtherBuilder and changes nothing.
	// It returns the id the state holds. A state builders share (ZooKeeper)
	// binds to none and returns id.
	BindBuilder(ctx context.Context, id string) (string, error)
	// Write applies changes atomically: all of them, or none and an error.
	Write(ctx context.Context, changes ...Change) error
	// Build returns one build; ErrNotFound when there is none.
	Build(ctx context.Context, id string) (Build, error)
	// Builds returns the builds that match f, newest first.
	Builds(ctx context.Context, f BuildFilter) ([]Build, error)
	// Uploads returns the uploads that match f: by build, newest build first,
	// then by provider, newest upload first.
	Uploads(ctx context.Context, f UploadFilter) ([]Upload, error)
	// Cursor returns an image's poll cursor; a zero Cursor when it has none.
	Cursor(ctx context.Context, image string) (Cursor, error)

	// RequestBuild records a manual build request; requesting twice is once.
	RequestBuild(ctx context.Context, image string) error
	// BuildRequests returns the pending build requests by image.
	BuildRequests(ctx context.Context) (map[string]time.Time, error)
	// ClearBuildRequest removes an image's request if it was made at or before asOf.
	ClearBuildRequest(ctx context.Context, image string, asOf time.Time) error
	// SetPaused pauses or unpauses an image at run time; it is idempotent.
	SetPaused(ctx context.Context, image string, paused bool) error
	// Paused returns the images paused at run time, with when.
	Paused(ctx context.Context) (map[string]time.Time, error)
	// ImageNames lists, sorted, the images the state has a place for: those
	// with builds, a build request or a pause, and, where images have nodes of
	// their own (ZooKeeper), every image node, which nodepool never removes.
	ImageNames(ctx context.Context) ([]string, error)

	// LeakMark records the first sighting of a cloud image that looked leaked
	// and returns when that was.
	LeakMark(ctx context.Context, provider, externalID string) (time.Time, error)
	// ClearLeakMarks forgets a provider's marks except those in keep.
	ClearLeakMarks(ctx context.Context, provider string, keep map[string]bool) error

	// TryLock takes a lock without waiting; ErrHeld when another holder has
	// it, ErrNotFound when the build or upload the key names does not exist.
	// Builders that share the state take the same locks.
	TryLock(ctx context.Context, key LockKey) (Held, error)

	Close() error
}

// LockKey names a lock, as nodepool's builders take them: Image alone locks
// building (or fetching) the image; with BuildID, the build (for deleting it);
// with Provider too, uploading the build there; with UploadID too, that upload
// (for deleting it).
type LockKey struct {
	Image, BuildID, Provider, UploadID string
}

func (k LockKey) String() string {
	s := k.Image
	for _, p := range []string{k.BuildID, k.Provider, k.UploadID} {
		if p != "" {
			s += "/" + p
		}
	}
	return s
}

// Held is a lock taken.
type Held interface {
	// Release gives the lock up; it is safe to call more than once.
	Release()
	// Lost is closed when the lock went without Release (a ZooKeeper session
	// that expired): work done under it must stop before it writes again.
	Lost() <-chan struct{}
}

// BuildName is the nodepool-style name of a build of image: <image>-<build_id>.
// Its files in the images-dir, its marker and its build log are named by it.
func BuildName(image, id string) string { return image + "-" + id }

// ParseBuildName splits a build's name, <image>-<build_id>, into its parts.
func ParseBuildName(name string) (image, id string, ok bool) {
	i := strings.LastIndex(name, "-")
	if i <= 0 || i == len(name)-1 {
		return "", "", false
	}
	return name[:i], name[i+1:], true
}
