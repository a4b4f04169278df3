package uploader

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// otherBuilders writes another builder's records, as a shared state holds them:
// a ready build of an image this config does not have, with uploads to a
// provider of this config ("a") and to one it does not have ("x") in every
// state, and a deleting build of such an image with a ready upload to "a".
// It returns every record written, read back.
func (f *fixture) otherBuilders(ctx context.Context) ([]store.Build, []store.Upload) {
	f.t.Helper()
	var builds []store.Build
	for _, bd := range []struct {
		image string
		state store.State
	}{{"centos", store.Ready}, {"fedora", store.Deleting}} {
		b := store.Build{ID: store.NewBuildID(), Image: bd.image, Source: store.SourceDIB, State: bd.state,
			StateTime: f.st.Now(), Created: f.st.Now(), BuilderID: "python-builder", Hostname: "elsewhere",
			Files: []store.File{{Format: "qcow2", Present: true}}}
		if err := f.raw.Write(ctx, store.PutBuild(&b)); err != nil {
			f.t.Fatal(err)
		}
		builds = append(builds, b)
	}
	put := func(b store.Build, provider string, state store.State) {
		up := store.Upload{BuildID: b.ID, Image: b.Image, Provider: provider, State: state, StateTime: f.st.Now(), Format: "qcow2"}
		// A failed upload may hold its half-made image too.
		if cloud, ok := f.clouds[provider]; ok {
			id, err := cloud.Create(ctx, ImageSpec{Name: b.Image + "-python", DiskFormat: "qcow2",
				Properties: map[string]string{PropBuildID: b.ID, PropProvider: provider}})
			if err != nil {
				f.t.Fatal(err)
			}
			up.ExternalID, up.ExternalName = id, b.Image+"-python"
		}
		if err := f.raw.Write(ctx, store.PutUpload(&up)); err != nil {
			f.t.Fatal(err)
		}
	}
	for _, provider := range []string{"a", "x"} {
		for _, state := range []store.State{store.Ready, store.Deleting, store.Uploading, store.Failed} {
			put(builds[0], provider, state)
		}
	}
	put(builds[1], "a", store.Ready)
	ups, err := f.st.Uploads(ctx, store.UploadFilter{})
	if err != nil {
		f.t.Fatal(err)
	}
	return builds, ups
}

// TestOtherBuildersImagesAreLeftAlone: records of images this builder neither
// has in its config nor ever built, and uploads to providers it does not have,
// are never released, deleted, settled or swept, whatever their state, while
// the builder rotates its own image beside them.
func TestOtherBuildersImagesAreLeftAlone(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	builds, ups := f.otherBuilders(ctx)
	// A cloud image tagged with this builder's id, of an image it is not
	// responsible for (a copied images-dir would make such images).
	tagged, err := f.clouds["a"].Create(ctx, ImageSpec{Name: "centos-tagged", Properties: map[string]string{
		PropBuilderID: f.st.BuilderID(), PropProvider: "a", PropImage: "centos"}})
	if err != nil {
		t.Fatal(err)
	}
	images := f.clouds["a"].count()
	for range 3 { // more builds of our own image than are kept: rotation runs
		f.addBuild("debian", "qcow2", "raw")
		if err := f.step(ctx); err != nil {
			t.Fatal(err)
		}
		if err := f.up.Recover(ctx); err != nil {
			t.Fatal(err)
		}
		if err := f.up.Sweep(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range builds {
		got, err := f.st.Build(ctx, b.ID)
		if err != nil || got.State != b.State || got.Version != b.Version {
			t.Errorf("another builder's build %s: %+v, %v; want it untouched (%s, version %d)", b.Name(), got, err, b.State, b.Version)
		}
	}
	for _, want := range ups {
		got := f.uploads(store.UploadFilter{BuildID: want.BuildID, Provider: want.Provider})
		found := false
		for _, g := range got {
			if g.ID == want.ID {
				found = true
				if g.State != want.State || g.Version != want.Version {
					t.Errorf("another builder's upload %s is %s (version %d); want it untouched (%s, version %d)",
						want, g.State, g.Version, want.State, want.Version)
				}
			}
		}
		if !found {
			t.Errorf("another builder's upload %s (%s) was deleted", want, want.State)
		}
		if want.ExternalID != "" && want.Provider == "a" {
			if _, err := f.clouds["a"].Get(ctx, want.ExternalID); err != nil {
				t.Errorf("the cloud image %s of another builder's upload %s was deleted: %v", want.ExternalID, want, err)
			}
		}
	}
	if _, err := f.clouds["a"].Get(ctx, tagged); err != nil {
		t.Errorf("a cloud image of an image this builder is not responsible for was swept: %v", err)
	}
	if ours := len(f.uploads(store.UploadFilter{Image: "debian", Provider: "a", State: store.Ready})); ours != 2 {
		t.Errorf("our own image has %d ready uploads in a, want keep-uploads (2): rotation stopped", ours)
	}
	if n := f.clouds["a"].count(); n != images+2 {
		t.Errorf("cloud a holds %d images, want the %d others' and our 2", n, images)
	}
}

// TestImageLeftTheConfigOnlyOwnBuildsGo: of an image this builder built but
// that left its config, its own builds and their uploads go; another builder's
// build of the same image, which that builder still makes, and its uploads stay.
func TestImageLeftTheConfigOnlyOwnBuildsGo(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	ours := f.addBuild("debian", "qcow2", "raw")
	if err := f.step(ctx); err != nil {
		t.Fatal(err)
	}
	theirs := store.Build{ID: store.NewBuildID(), Image: "debian", Source: store.SourceZuul, State: store.Ready,
		StateTime: f.st.Now(), Created: f.st.Now(), BuilderID: "another-builder", Files: []store.File{{Format: "qcow2", Present: true}}}
	if err := f.raw.Write(ctx, store.PutBuild(&theirs)); err != nil {
		t.Fatal(err)
	}
	id, err := f.clouds["a"].Create(ctx, ImageSpec{Name: "theirs"})
	if err != nil {
		t.Fatal(err)
	}
	up := store.Upload{BuildID: theirs.ID, Image: "debian", Provider: "a", State: store.Ready, StateTime: f.st.Now(),
		Format: "qcow2", ExternalID: id}
	if err := f.raw.Write(ctx, store.PutUpload(&up)); err != nil {
		t.Fatal(err)
	}
	f.cfg.ZuulImages = nil
	f.cfg.Providers[0].DiskImages, f.cfg.Providers[1].DiskImages = nil, nil
	for range 2 {
		if err := f.step(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.st.Build(ctx, ours.ID); err == nil {
		t.Error("our build of an image that left the config was kept")
	}
	if _, err := os.Stat(mustPath(f.st.FilePath("debian", ours.ID, "raw"))); !os.IsNotExist(err) {
		t.Error("our build's files were kept")
	}
	got, err := f.st.Build(ctx, theirs.ID)
	if err != nil || got.State != store.Ready {
		t.Errorf("another builder's build of the image = %+v, %v; want it ready", got, err)
	}
	if ups := f.uploads(store.UploadFilter{BuildID: theirs.ID}); len(ups) != 1 || ups[0].State != store.Ready {
		t.Errorf("another builder's upload = %+v; want it ready", ups)
	}
	if _, err := f.clouds["a"].Get(ctx, id); err != nil {
		t.Errorf("another builder's cloud image was deleted: %v", err)
	}
	if n := f.clouds["b"].count(); n != 0 {
		t.Errorf("our upload in b was kept: %d images", n)
	}
}

// TestReleaseMoreThanKeptWarns: a pass that releases more uploads of an image
// in a provider than it keeps there (the image dropped from the provider's list
// by a config change) says so at warning level, per image and provider with
// the reason; ordinary rotation does not.
func TestReleaseMoreThanKeptWarns(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	var logs testenv.Buffer
	f.up.log = slog.New(slog.NewTextHandler(&logs, nil))
	for range 3 {
		f.addBuild("debian", "qcow2", "raw")
		if err := f.step(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if strings.Contains(logs.String(), "level=WARN") {
		t.Fatalf("rotation warned:\n%s", logs.String())
	}
	f.cfg.Providers[1].DiskImages = nil
	if err := f.up.Retain(ctx); err != nil {
		t.Fatal(err)
	}
	var warned []string
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "level=WARN") {
			warned = append(warned, line)
		}
	}
	if len(warned) != 1 || !strings.Contains(warned[0], "image=debian provider=b released=2 kept=0") ||
		!strings.Contains(warned[0], "image no longer listed for this provider") {
		t.Fatalf("warnings = %q; want one for debian in b: 2 released, 0 kept, and why", warned)
	}
}
