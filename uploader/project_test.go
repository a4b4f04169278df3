package uploader_test

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/store"
	"github.com/nodepool-builder/nodepool-builder/uploader"
	"github.com/nodepool-builder/nodepool-builder/uploader/openstack"
)

// TestImageOfAnotherProjectIsNotOurs: behind a real Keystone, the builder's
// credentials are an admin's, which reach every project's images. Images of
// another project that carry the properties of the builder's uploads (set by
// anyone who may make an image there) are neither deleted for a deleting
// record, nor adopted or deleted for an uploading one, found by its id or by
// its properties, nor swept as leaks: they belong to another project. The
// builder's own image, with the same properties, still goes.
func TestImageOfAnotherProjectIsNotOurs(t *testing.T) {
	ks := testenv.NewKeystone(t, testenv.KeystoneOptions{})
	g := testenv.NewGlanceBehind(t, ks)
	ours, other := ks.NewAccount(t), ks.NewAccount(t)
	ks.Grant(t, ours, "admin")
	clouds := filepath.Join(t.TempDir(), "clouds.yaml")
	var text strings.Builder
	text.WriteString("clouds:\n")
	for name, a := range map[string]testenv.Account{"ours": ours, "other": other} {
		text.WriteString(ks.CloudEntry(name, g.Endpoint, a))
	}
	if err := os.WriteFile(clouds, []byte(text.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	open := func(name string) *openstack.Cloud {
		c, err := openstack.Open(ctx, openstack.Options{Cloud: name, CloudsFile: clouds})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	cloud, theirs := open("ours"), open("other")

	setup := newGlanceSetup(t, "glance", "ours", time.Minute, 1)
	setup.cfg.Builder.LeakSweep = true
	st := setup.st
	b := setup.readyBuild(t, "", func(path string) error { return os.WriteFile(path, []byte("a disk"), 0o644) })
	record := func(state store.State) store.Upload {
		up, err := st.CreateUpload(ctx, &b, "glance", "raw")
		if err != nil {
			t.Fatal(err)
		}
		up.SetState(state, st.Now())
		if err := setup.raw.Write(ctx, store.PutUpload(&up)); err != nil {
			t.Fatal(err)
		}
		return up
	}
	// name makes an image with the properties of the upload's in c, and
	// records it as the upload's when up is.
	name := func(c *openstack.Cloud, up *store.Upload, props map[string]string) string {
		p := map[string]string{uploader.PropBuildID: b.ID, uploader.PropUploadID: up.ID, uploader.PropProvider: "glance"}
		for k, v := range props {
			p[k] = v
		}
		id, err := c.Create(ctx, uploader.ImageSpec{Name: "made-for-" + up.ID, DiskFormat: "raw", Properties: p})
		if err != nil {
			t.Fatal(err)
		}
		if up.State != "" {
			up.ExternalID = id
			if err := setup.raw.Write(ctx, store.PutUpload(up)); err != nil {
				t.Fatal(err)
			}
		}
		return id
	}

	// A deleting record whose image is the other project's.
	deleting := record(store.Deleting)
	deletedTheirs := name(theirs, &deleting, nil)
	// An uploading record naming the other project's image, and one naming
	// none, whose upload's properties another image of that project carries.
	named := record(store.Uploading)
	namedTheirs := name(theirs, &named, nil)
	found := record(store.Uploading)
	foundTheirs := name(theirs, &store.Upload{ID: found.ID}, nil)
	// Tagged with this builder's id, known to no record.
	tagged := name(theirs, &store.Upload{ID: "0000000099"}, map[string]string{uploader.PropBuilderID: st.BuilderID()})
	// The builder's own image of a deleting record.
	mine := record(store.Deleting)
	ownImage := name(cloud, &mine, nil)

	var logs testenv.Buffer
	u := uploader.New(uploader.Options{Store: st, Config: setup.cfg, Clouds: map[string]uploader.Cloud{"glance": cloud},
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err := u.Recover(ctx); err != nil {
		t.Fatalf("recover: %v\n%s", err, logs.String())
	}
	for range 2 {
		if err := u.Delete(ctx); err != nil {
			t.Fatalf("delete: %v\n%s", err, logs.String())
		}
		if err := u.Sweep(ctx); err != nil {
			t.Fatalf("sweep: %v\n%s", err, logs.String())
		}
	}

	gone := func(id string) bool {
		img, err := cloud.Get(ctx, id)
		if err != nil && !errors.Is(err, uploader.ErrNotFound) {
			t.Fatal(err)
		}
		return err != nil || img.Status == "deleted" || img.Status == "pending_delete"
	}
	for what, id := range map[string]string{"a deleting record's": deletedTheirs, "an uploading record's": namedTheirs,
		"found by an uploading record's properties,": foundTheirs, "tagged with the builder's id,": tagged} {
		if gone(id) {
			t.Errorf("the other project's image %s %s was deleted; want it left\n%s", what, id, logs.String())
		}
	}
	if !gone(ownImage) {
		t.Errorf("the builder's own image %s of a deleting record was left; want it deleted\n%s", ownImage, logs.String())
	}
	ups, err := st.Uploads(ctx, store.UploadFilter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, up := range ups {
		switch up.ID {
		case named.ID, found.ID:
			if up.State != store.Failed || up.ExternalID != "" {
				t.Errorf("uploading record %s: %s naming %q; want it failed, naming no image", up.ID, up.State, up.ExternalID)
			}
		case deleting.ID:
			if up.State != store.Deleting || up.ExternalID != deletedTheirs {
				t.Errorf("deleting record %s: %s naming %q; want it left as it was", up.ID, up.State, up.ExternalID)
			}
		case mine.ID:
			t.Errorf("the record of the deleted image %s is left", ownImage)
		}
	}
	said := 0
	for line := range strings.Lines(logs.String()) {
		if strings.Contains(line, "external_id=") && strings.Contains(line, "another project's image") {
			said++
		}
	}
	if said != 4 {
		t.Errorf("%d log lines say an image is another project's, want one for each of its 4 images:\n%s", said, logs.String())
	}
}
