package main

import (
	"strings"
	"testing"
	"time"
)

// TestOnceGlanceGoneMidUpload: Glance goes away while --once sends an image
// to it. The run fails, and image-list shows the upload failed with its
// half-made image's id, not uploading (which nothing does any more, and which
// a nodepool-builder would drop without deleting the image). Once Glance is
// back, the next runs delete that image and make the upload.
func TestOnceGlanceGoneMidUpload(t *testing.T) {
	e, slow, zb := newSlowUploadEnv(t) // Glance goes in the middle of the upload
	d := startMain(t, "", "-c", e.cfgPath, "--once")
	d.waitLog(t, 60*time.Second, `msg="upload started"`)
	slow.Down()
	select {
	case <-d.exited:
	case <-time.After(60 * time.Second):
		t.Fatalf("--once did not end within a minute of Glance going away\n%s", d.logs.String())
	}
	if d.err == nil {
		t.Fatalf("--once succeeded although Glance went away mid-upload\n%s", d.logs.String())
	}
	b, ok := e.zuulBuildOf(zb.UUID)
	if !ok {
		t.Fatalf("the Zuul build was not fetched: %+v", e.buildsJSON())
	}
	rows := e.uploadsJSON()
	if len(rows) != 1 || rows[0].State != "failed" || rows[0].ExternalID == "" || !strings.Contains(rows[0].Reason, "could not be deleted") {
		t.Fatalf("image-list after --once lost Glance mid-upload: %+v; want one upload, failed, with its half-made image's id", rows)
	}
	half := rows[0].ExternalID

	// Glance is back: the next run deletes the half-made image, and the
	// upload is made (by that run, or the one after if its backoff had not
	// passed yet).
	if err := slow.Up(); err != nil {
		t.Fatal(err)
	}
	slow.SetRate(0)
	e.once(0)
	for _, im := range e.images("cloud-r") {
		if im.ID == half {
			t.Fatalf("Glance still holds the half-made image %s after a run with Glance back: %+v", half, im)
		}
	}
	e.once(0)
	rows = e.uploadsJSON()
	if len(rows) != 1 || rows[0].State != "ready" {
		t.Fatalf("image-list after Glance came back: %+v; want one ready upload", rows)
	}
	e.checkUploaded("cloud-r", b, "raw")
}
