package builder

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/source"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/uploader"
)

// The tests here plug a source that only the tests know into a builder: one
// that makes images from the files of a directory. It writes what a source
// writes (which images, whether one is due, how its files are made, how a
// build it left is abandoned) and nothing else; everything else a build needs
// must come from the core, whatever the source.

// sourceDir is the store.SourceName of the directory source's builds.
const sourceDir store.SourceName = "dir"

// dirSource makes images from a directory: <dir>/<image>.raw is an image as it
// is now. A build is due when no ready build has that file, by checksum, as
// its newest; an operator's request makes one whatever the file.
type dirSource struct {
	dir    string
	st     *store.Store
	images map[string]time.Duration

	mu        sync.Mutex
	looks     []dirLook
	made      []string // the builds Make was called for
	abandoned []store.Build
}

// dirLook is one call of Due.
type dirLook struct {
	image, request string
	asked, locked  bool
}

func (d *dirSource) Images() map[string]time.Duration { return maps.Clone(d.images) }

func (d *dirSource) file(image string) string { return filepath.Join(d.dir, image+".raw") }

func (d *dirSource) Due(ctx context.Context, image string, look source.Look) (source.Work, error) {
	return d.due(ctx, image, look, false)
}

// dirMaker is the directory source's maker: the image's file, by its checksum
// when the look found it.
type dirMaker struct {
	d      *dirSource
	image  string
	look   source.Look
	sha256 string
}

func (j *dirMaker) Recheck(ctx context.Context) (source.Work, error) {
	return j.d.due(ctx, j.image, j.look, true)
}

func (j *dirMaker) Cursor(store.Build, error) *store.Cursor { return nil }

func (j *dirMaker) Done(context.Context, source.End) error { return nil }

func (d *dirSource) due(ctx context.Context, image string, look source.Look, locked bool) (source.Work, error) {
	d.mu.Lock()
	d.looks = append(d.looks, dirLook{image: image, request: look.Request, asked: look.Asked, locked: locked})
	d.mu.Unlock()
	sha, _, _, err := store.HashFile(ctx, d.file(image))
	if errors.Is(err, fs.ErrNotExist) {
		return source.NotDue("no file " + d.file(image)), nil
	}
	if err != nil {
		return source.Work{}, err
	}
	ready, err := d.st.Builds(ctx, store.BuildFilter{Image: image, State: store.Ready})
	if err != nil {
		return source.Work{}, err
	}
	var newest *store.Build
	for i := range ready {
		if newest == nil || ready[i].Created.After(newest.Created) {
			newest = &ready[i]
		}
	}
	reason := "the file of " + image + " changed"
	if look.Asked {
		reason = "an operator asked for a build"
	} else if newest != nil {
		if f, ok := newest.File("raw"); ok && f.SHA256 == sha {
			return source.NotDue("unchanged since " + newest.Name()), nil
		}
	}
	return source.Do(source.Todo{
		Reason: reason,
		Slot:   true,
		New:    store.Build{Image: image, Source: sourceDir},
		Maker:  &dirMaker{d: d, image: image, look: look, sha256: sha},
	}), nil
}

// Make copies the image's file into the build, and checks that what it copied
// is what Due saw.
func (j *dirMaker) Make(ctx context.Context, w *store.BuildWriter) error {
	d, rec := j.d, w.Build()
	d.mu.Lock()
	d.made = append(d.made, rec.ID)
	d.mu.Unlock()
	in, err := os.Open(d.file(rec.Image))
	if err != nil {
		return err
	}
	defer in.Close()
	tmp, err := w.Temp("raw")
	if err != nil {
		return err
	}
	out, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	sha, md, size, err := store.HashFile(ctx, tmp)
	if err != nil {
		return err
	}
	if want := j.sha256; sha != want {
		return fmt.Errorf("%s changed while it was copied: sha256 %s, want %s", d.file(rec.Image), sha, want)
	}
	return w.Add(store.File{Format: "raw", SHA256: sha, MD5: md, Size: size})
}

func (d *dirSource) Abandon(_ context.Context, b store.Build) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.abandoned = append(d.abandoned, b)
	return nil
}

// put replaces the image's file with data, in one rename: a step never reads
// half of it.
func (d *dirSource) put(t *testing.T, image, data string) string {
	t.Helper()
	tmp := filepath.Join(d.dir, "."+image+".tmp")
	if err := os.WriteFile(tmp, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, d.file(image)); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(data))
	return hex.EncodeToString(sum[:])
}

func (d *dirSource) seen() (looks []dirLook, made []string, abandoned []store.Build) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]dirLook(nil), d.looks...), append([]string(nil), d.made...), append([]store.Build(nil), d.abandoned...)
}

// dirImage is one image, dir-a, uploaded to pa. It is a diskimage of the
// config, so that the provider takes it; the builder's only source is the
// directory source, so nothing else makes it.
const dirImage = `images-dir: %s
diskimages:
  - name: dir-a
    elements: [e]
providers:
  - name: pa
    cloud: a
    image-format: raw
    diskimages: [{name: dir-a}]
`

// newDirRig makes a rig of a config whose only source is a directory source
// making dir-a, looked at every interval. The rig does not reload its config:
// a reload would assemble the config's own sources again.
func newDirRig(t *testing.T, text string, interval time.Duration) (*rig, *dirSource) {
	t.Helper()
	r := newRig(t, text, func(o *Options) { o.Read = nil })
	ds := &dirSource{dir: t.TempDir(), st: r.st, images: map[string]time.Duration{"dir-a": interval}}
	p := *r.b.cur.Load()
	p.sources = map[store.SourceName]source.Source{sourceDir: ds}
	r.b.cur.Store(&p)
	return r, ds
}

// dirBuilds are the builds of dir-a.
func (r *rig) dirBuilds() []store.Build {
	r.t.Helper()
	builds, err := r.st.Builds(context.Background(), store.BuildFilter{Image: "dir-a"})
	if err != nil {
		r.t.Fatal(err)
	}
	return builds
}

// wantDirBuild fails the test unless b is a ready build of the directory
// source whose raw file, in the images-dir, has the checksum sha.
func wantDirBuild(t *testing.T, r *rig, b store.Build, sha string) {
	t.Helper()
	f, ok := b.File("raw")
	if b.State != store.Ready || b.Source != sourceDir || !ok || !f.Present || f.SHA256 != sha {
		t.Fatalf("build %+v: want it ready, of source %q, with a raw file of sha256 %s", b, sourceDir, sha)
	}
	got, _, _, err := store.HashFile(context.Background(), mustPath(r.st.FilePath(b.Image, b.ID, "raw")))
	if err != nil || got != sha {
		t.Fatalf("the raw file of %s: sha256 %s, %v; want %s", b.Name(), got, err, sha)
	}
}

// TestDirSourceBuildsAndUploads: --once steps a source it knows only as a
// Source, asks it twice (before the image's lock and under it), makes the
// build it says is due, and uploads it; an unchanged file makes nothing new.
func TestDirSourceBuildsAndUploads(t *testing.T) {
	ctx := context.Background()
	r, ds := newDirRig(t, dirImage, time.Hour)
	sha := ds.put(t, "dir-a", "the image, version 1")
	if err := r.b.Once(ctx); err != nil {
		t.Fatal(err)
	}
	builds := r.dirBuilds()
	if len(builds) != 1 {
		t.Fatalf("builds of dir-a after --once: %+v, want one", builds)
	}
	wantDirBuild(t, r, builds[0], sha)
	ups := r.uploads(store.UploadFilter{BuildID: builds[0].ID})
	if len(ups) != 1 || ups[0].State != store.Ready || ups[0].Provider != "pa" {
		t.Fatalf("uploads of %s: %+v, want one ready to pa", builds[0].Name(), ups)
	}
	if img, err := r.clouds["pa"].Get(ctx, ups[0].ExternalID); err != nil || img.Status != "active" {
		t.Fatalf("pa's image %s: %+v, %v; want it active", ups[0].ExternalID, img, err)
	}
	looks, made, _ := ds.seen()
	want := []dirLook{{image: "dir-a"}, {image: "dir-a", locked: true}}
	if fmt.Sprint(looks) != fmt.Sprint(want) || len(made) != 1 || made[0] != builds[0].ID {
		t.Fatalf("the source was asked %+v and made %v; want %+v, then %s made", looks, made, want, builds[0].ID)
	}

	// Nothing changed: nothing is made, nothing uploaded again.
	if err := r.b.Once(ctx); err != nil {
		t.Fatal(err)
	}
	if builds := r.dirBuilds(); len(builds) != 1 {
		t.Fatalf("builds of dir-a after a second --once on the same file: %+v", builds)
	}
	if _, creates := r.clouds["pa"].count(); creates != 1 {
		t.Fatalf("pa saw %d image creates, want 1", creates)
	}
}

// TestDirSourcePaused: the core asks a paused image's source nothing.
func TestDirSourcePaused(t *testing.T) {
	ctx := context.Background()
	r, ds := newDirRig(t, dirImage, time.Hour)
	ds.put(t, "dir-a", "the image")
	if err := r.st.SetPaused(ctx, "dir-a", true); err != nil {
		t.Fatal(err)
	}
	if err := r.b.Once(ctx); err != nil {
		t.Fatal(err)
	}
	if looks, _, _ := ds.seen(); len(looks) != 0 || len(r.dirBuilds()) != 0 {
		t.Fatalf("a paused image: the source was asked %+v, builds %+v; want neither", looks, r.dirBuilds())
	}
	if err := r.st.SetPaused(ctx, "dir-a", false); err != nil {
		t.Fatal(err)
	}
	if err := r.b.Once(ctx); err != nil {
		t.Fatal(err)
	}
	if builds := r.dirBuilds(); len(builds) != 1 || builds[0].State != store.Ready {
		t.Fatalf("builds once unpaused: %+v, want one ready", builds)
	}
}

// TestDirSourceRotation: the daemon's loop for the source's image makes a new
// build each time the file changes, uploads it, and keep-builds (the default,
// 2) rotates the older builds out: their records, files and cloud images go.
func TestDirSourceRotation(t *testing.T) {
	ctx := context.Background()
	r, ds := newDirRig(t, dirImage, 20*time.Millisecond)
	r.run()
	type made struct {
		build store.Build
		ext   string
	}
	var versions []made
	for v := 1; v <= 4; v++ {
		sha := ds.put(t, "dir-a", fmt.Sprintf("the image, version %d", v))
		var got made
		testenv.WaitFor(t, 20*time.Second, fmt.Sprintf("version %d built and uploaded to pa", v), func() bool {
			for _, b := range r.dirBuilds() {
				if f, _ := b.File("raw"); b.State == store.Ready && f.SHA256 == sha {
					ups := r.uploads(store.UploadFilter{BuildID: b.ID, State: store.Ready})
					if len(ups) == 1 {
						got = made{b, ups[0].ExternalID}
						return true
					}
				}
			}
			return false
		}, func() string { return fmt.Sprintf("builds: %+v", r.dirBuilds()) })
		wantDirBuild(t, r, got.build, sha)
		versions = append(versions, got)
	}
	gone := func(m made) bool {
		_, err := r.st.Build(ctx, m.build.ID)
		_, cerr := r.clouds["pa"].Get(ctx, m.ext)
		return errors.Is(err, store.ErrNotFound) && errors.Is(cerr, uploader.ErrNotFound)
	}
	testenv.WaitFor(t, 20*time.Second, "versions 1 and 2 rotated out", func() bool {
		return gone(versions[0]) && gone(versions[1])
	}, func() string {
		return fmt.Sprintf("builds: %+v\nuploads: %+v", r.dirBuilds(), r.uploads(store.UploadFilter{}))
	})
	for _, m := range versions[:2] {
		matches, _ := filepath.Glob(mustPath(r.st.BuildPath(m.build.Image, m.build.ID)) + "*")
		if len(matches) != 0 {
			t.Errorf("files of the rotated build %s left: %v", m.build.Name(), matches)
		}
	}
	for _, m := range versions[2:] {
		if b, err := r.st.Build(ctx, m.build.ID); err != nil || b.State != store.Ready {
			t.Errorf("build %s of the two newest: %+v, %v; want it kept, ready", m.build.Name(), b, err)
		}
		if _, err := r.clouds["pa"].Get(ctx, m.ext); err != nil {
			t.Errorf("pa's image %s of %s: %v; want it kept", m.ext, m.build.Name(), err)
		}
	}
	// The loop went on looking at the unchanged file all along: one build
	// for each version, no more.
	if _, made, _ := ds.seen(); len(made) != len(versions) {
		t.Errorf("the source made %d builds of %d versions", len(made), len(versions))
	}
}

// gearmanSubmit submits a job with the gearman command, a client nobody here
// wrote, and returns its answer; it fails the test when the job fails.
func gearmanSubmit(t *testing.T, gd *testenv.Gearmand, function, data string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, testenv.RequireBinary(t, "gearman"),
		"-h", gd.Host, "-p", strconv.Itoa(gd.Port), "-f", function, data)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("gearman -f %s %s: %v; it said %q", function, data, err, out.String()+errb.String())
	}
	answer, _, _ := strings.Cut(out.String(), "\n")
	return strings.TrimSpace(answer)
}

// gearmanWorkers returns how many workers gearmand has for a function.
func gearmanWorkers(t *testing.T, gd *testenv.Gearmand, function string) int {
	t.Helper()
	out, err := exec.Command(testenv.RequireBinary(t, "gearadmin"), "-h", gd.Host, "-p", strconv.Itoa(gd.Port), "--status").Output()
	if err != nil {
		t.Fatalf("gearadmin --status: %v", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Split(line, "\t"); len(f) == 4 && f[0] == function {
			n, _ := strconv.Atoi(f[3])
			return n
		}
	}
	return 0
}

// TestDirSourceGearmanImageBuild: the builder registers image-build for the
// source's image with a real gearmand, and a job makes a build now, through
// the core, recorded with the job's request; the same request again gets the
// same build.
func TestDirSourceGearmanImageBuild(t *testing.T) {
	gd := testenv.NewGearmand(t)
	testenv.RequireBinary(t, "gearman")
	// An hour between looks: the daemon's own first look finds no file, and
	// only the job makes a build.
	r, ds := newDirRig(t, dirImage+"builder:\n  gearman-servers: [{host: "+gd.Host+", port: "+strconv.Itoa(gd.Port)+"}]\n", time.Hour)
	r.run()
	testenv.WaitFor(t, 30*time.Second, "the daemon's first look at dir-a", func() bool {
		looks, _, _ := ds.seen()
		return len(looks) > 0
	})
	testenv.WaitFor(t, 30*time.Second, "a worker of image-build:dir-a in gearmand", func() bool {
		return gearmanWorkers(t, gd, FnBuild+"dir-a") == 1
	})
	sha := ds.put(t, "dir-a", "the image asked for")
	id := gearmanSubmit(t, gd, FnBuild+"dir-a", "req-dir-1")
	b, err := r.st.Build(context.Background(), id)
	if err != nil {
		t.Fatalf("the build the job answered, %q: %v", id, err)
	}
	wantDirBuild(t, r, b, sha)
	if b.Request != "req-dir-1" {
		t.Errorf("build %s records request %q, want req-dir-1", b.Name(), b.Request)
	}
	var asked []dirLook
	looks, made, _ := ds.seen()
	for _, l := range looks {
		if l.asked {
			asked = append(asked, l)
		}
	}
	want := []dirLook{{image: "dir-a", request: "req-dir-1", asked: true}, {image: "dir-a", request: "req-dir-1", asked: true, locked: true}}
	if fmt.Sprint(asked) != fmt.Sprint(want) || len(made) != 1 || made[0] != id {
		t.Fatalf("the source was asked %+v and made %v; want %+v, then %s made", asked, made, want, id)
	}
	testenv.WaitFor(t, 20*time.Second, "the job's build uploaded to pa", func() bool {
		return len(r.uploads(store.UploadFilter{BuildID: id, State: store.Ready})) == 1
	})
	if again := gearmanSubmit(t, gd, FnBuild+"dir-a", "req-dir-1"); again != id {
		t.Errorf("the same request again answered %q, want %s", again, id)
	}
	if _, made, _ := ds.seen(); len(made) != 1 {
		t.Errorf("the source made %d builds for one request", len(made))
	}
}

// TestDirSourceRecover: a build of the source that this builder left building
// with nobody on it (a step that crashed after it began the build) is settled
// by recovery: the source abandons it, it is recorded failed as interrupted,
// and its files go.
func TestDirSourceRecover(t *testing.T) {
	ctx := context.Background()
	r, ds := newDirRig(t, dirImage, time.Hour)
	w, err := r.st.BeginBuild(ctx, store.Build{Image: "dir-a", Source: sourceDir})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(mustPath(w.Path("raw")), []byte("half an ima"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := r.b.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	_, _, abandoned := ds.seen()
	if len(abandoned) != 1 || abandoned[0].ID != w.Build().ID || abandoned[0].State != store.Building {
		t.Fatalf("the source abandoned %+v; want the build %s, as it was left, building", abandoned, w.Build().Name())
	}
	b, err := r.st.Build(ctx, w.Build().ID)
	if err != nil || !source.Interrupted(b) {
		t.Fatalf("the build after recovery: %+v, %v; want it failed, %q", b, err, source.InterruptedReason)
	}
	if _, err := os.Stat(mustPath(w.Path("raw"))); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the build's file after recovery: %v; want it removed", err)
	}
}
