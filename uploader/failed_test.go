package uploader

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/store"
)

// TestFailedUploadKeepsItsLeftoverImage: an attempt that fails and whose
// half-made image the cloud will not delete is recorded failed with that
// image's id, never left uploading (which nodepool's builders drop without a
// look at the cloud). The lifecycle tries the delete on every pass, and once
// the cloud agrees the image goes and then the record; meanwhile the retry runs
// as a new upload, counting on from the failed one's attempts.
func TestFailedUploadKeepsItsLeftoverImage(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.up.opts.RetryBase = time.Hour
	f.addBuild("debian", "qcow2", "raw")
	a := f.clouds["a"]
	a.failUpload, a.failDelete = 1, true
	err := f.step(ctx)
	if err == nil || !strings.Contains(err.Error(), "attempt 1 of 3") {
		t.Fatalf("first step: %v", err)
	}
	ups := f.uploads(store.UploadFilter{Provider: "a"})
	if len(ups) != 1 || ups[0].State != store.Failed || ups[0].ExternalID == "" || ups[0].Attempts != 1 ||
		!strings.Contains(ups[0].LastError, "injected upload failure") || !strings.Contains(ups[0].LastError, "could not be deleted") {
		t.Fatalf("after a failed attempt whose image could not be deleted: %+v; want it failed, with its image's id and both reasons", ups)
	}
	leftover := ups[0]
	if _, err := a.Get(ctx, leftover.ExternalID); err != nil {
		t.Fatalf("the half-made image: %v", err)
	}

	// The cloud still refuses: the record keeps the image's id; nothing else
	// happens before the backoff.
	if err := f.step(ctx); err == nil || !strings.Contains(err.Error(), leftover.ExternalID) {
		t.Fatalf("a pass whose delete failed: %v; want the failed delete of %s reported", err, leftover.ExternalID)
	}
	if ups := f.uploads(store.UploadFilter{Provider: "a"}); len(ups) != 1 || ups[0].ID != leftover.ID ||
		ups[0].State != store.Failed || ups[0].ExternalID != leftover.ExternalID {
		t.Fatalf("after a pass whose delete failed: %+v; want the failed upload with its image as it was", ups)
	}

	// The retry is due while the image is still there: it is a new upload,
	// and the failed record stays until its image is gone.
	f.clock.Add(2 * time.Hour)
	if err := f.step(ctx); err == nil {
		t.Fatal("a pass whose delete failed reported nothing")
	}
	ups = f.uploads(store.UploadFilter{Provider: "a"})
	var ready []store.Upload
	for _, up := range ups {
		if up.State == store.Ready {
			ready = append(ready, up)
		}
	}
	if len(ups) != 2 || len(ready) != 1 || ready[0].ID == leftover.ID || ready[0].Attempts != 2 {
		t.Fatalf("after the retry: %+v; want a new ready upload at attempt 2 beside the failed one", ups)
	}
	if _, err := a.Get(ctx, leftover.ExternalID); err != nil {
		t.Fatalf("the half-made image went while the cloud refused deletes: %v", err)
	}

	// The cloud answers again: the image goes, then the record.
	a.failDelete = false
	if err := f.step(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Get(ctx, leftover.ExternalID); err == nil {
		t.Fatalf("the half-made image %s is still in the cloud", leftover.ExternalID)
	}
	if ups := f.uploads(store.UploadFilter{Provider: "a"}); len(ups) != 1 || ups[0].ID != ready[0].ID || ups[0].State != store.Ready {
		t.Fatalf("after the delete: %+v; want only the ready upload", ups)
	}
	if n := a.count(); n != 1 {
		t.Fatalf("cloud a holds %d images, want the ready upload's only", n)
	}
}

// TestFailedUploadWithImageOfAReleasedBuild: a failed upload that holds its
// image is not forgotten with its record when a newer upload is ready, nor when
// its build is deleted: its image is deleted first.
func TestFailedUploadWithImageOfAReleasedBuild(t *testing.T) {
	for _, tc := range []struct {
		name    string
		release func(f *fixture, b store.Build)
	}{
		{"newer upload ready", func(f *fixture, b store.Build) {}},
		{"build deleting", func(f *fixture, b store.Build) {
			b, err := f.st.Build(context.Background(), b.ID)
			if err != nil {
				f.t.Fatal(err)
			}
			b.SetState(store.Deleting, f.st.Now())
			if err := f.raw.Write(context.Background(), store.PutBuild(&b)); err != nil {
				f.t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			ctx := context.Background()
			old := f.addBuild("debian", "qcow2", "raw")
			// The old build's upload to a failed, and its image could not be
			// deleted then.
			up, err := f.st.CreateUpload(ctx, &old, "a", "qcow2")
			if err != nil {
				t.Fatal(err)
			}
			id, err := f.clouds["a"].Create(ctx, ImageSpec{Name: "debian-half", DiskFormat: "qcow2",
				Properties: map[string]string{PropBuildID: old.ID, PropUploadID: up.ID, PropProvider: "a", PropBuilderID: f.st.BuilderID()}})
			if err != nil {
				t.Fatal(err)
			}
			up.SetState(store.Failed, f.st.Now())
			up.ExternalID, up.LastError, up.Attempts = id, "glance went away", 3
			if err := f.raw.Write(ctx, store.PutUpload(&up)); err != nil {
				t.Fatal(err)
			}
			f.addBuild("debian", "qcow2", "raw")
			tc.release(f, old)
			for range 2 {
				if err := f.step(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := f.clouds["a"].Get(ctx, id); err == nil {
				t.Fatalf("the failed upload's image %s leaked: its record is %+v", id, f.uploads(store.UploadFilter{BuildID: old.ID}))
			}
			if left := f.uploads(store.UploadFilter{BuildID: old.ID, Provider: "a", State: store.Failed}); len(left) != 0 {
				t.Fatalf("failed uploads left after their image went: %+v", left)
			}
		})
	}
}
