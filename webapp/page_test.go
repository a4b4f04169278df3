package webapp

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/config"
	"github.com/nodepool-builder/nodepool-builder/listing"
	"github.com/nodepool-builder/nodepool-builder/store"
)

// TestFailureRows: refused Zuul builds come first, by image, then failed
// builds and uploads in the store's order, each list cut at maxFailures.
func TestFailureRows(t *testing.T) {
	now := time.Now()
	failedBuilds := func(n int) []store.Build {
		var bs []store.Build
		for i := range n {
			bs = append(bs, store.Build{Image: "debian", ID: fmt.Sprintf("%010d", n-i), State: store.Failed},
				store.Build{Image: "debian", ID: "ready", State: store.Ready})
		}
		return bs
	}
	refused := listing.ImageRow{Name: "debian", Cursor: &store.Cursor{ZuulUUID: "u1", Outcome: string(store.Failed), Reason: "bad"}}
	ingested := listing.ImageRow{Name: "fedora", Cursor: &store.Cursor{ZuulUUID: "u2", Outcome: string(store.Ready)}}
	upload := store.Upload{Image: "debian", BuildID: "0000000001", Provider: "p1", ID: "0000000002", State: store.Failed}
	for _, tc := range []struct {
		name   string
		images []listing.ImageRow
		builds []store.Build
		ups    []store.Upload
		want   []string // What: Subject
	}{
		{"nothing failed", []listing.ImageRow{ingested}, failedBuilds(0), []store.Upload{{State: store.Ready}}, nil},
		{"in order", []listing.ImageRow{ingested, refused}, failedBuilds(2), []store.Upload{upload},
			[]string{"Zuul build refused: debian: u1", "build: debian-0000000002", "build: debian-0000000001",
				"upload to p1: debian-0000000001 upload 0000000002"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, r := range failureRows(tc.images, tc.builds, tc.ups, now) {
				got = append(got, r.What+": "+r.Subject)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("failureRows = %q, want %q", got, tc.want)
			}
		})
	}
	rows := failureRows(nil, failedBuilds(maxFailures+3), nil, now)
	if len(rows) != maxFailures || rows[0].Subject != fmt.Sprintf("debian-%010d", maxFailures+3) {
		t.Errorf("failureRows of %d failed builds: %d rows from %q; want the first %d", maxFailures+3, len(rows), rows[0].Subject, maxFailures)
	}
}

// TestImageRowsUploads: an image's row has a cell for each provider that has
// the image, in the config's order, showing the newest upload there (the
// first in the store's order) or none.
func TestImageRowsUploads(t *testing.T) {
	now := time.Now()
	providers := []config.Provider{
		{Name: "p1", DiskImages: []config.ProviderImage{{Name: "debian"}}},
		{Name: "p2", DiskImages: []config.ProviderImage{{Name: "fedora"}}},
		{Name: "p3", DiskImages: []config.ProviderImage{{Name: "debian"}}},
	}
	ups := []store.Upload{
		{Image: "debian", BuildID: "0000000002", Provider: "p1", State: store.Uploading},
		{Image: "debian", BuildID: "0000000001", Provider: "p1", State: store.Ready},
	}
	builds := []store.Build{{Image: "debian", ID: "0000000002", State: store.Building}}
	rows := imageRows([]listing.ImageRow{{Name: "debian"}, {Name: "fedora"}}, builds, ups, providers, now)
	var got []string
	for _, r := range rows {
		s := fmt.Sprintf("%s building=%v:", r.Name, r.Building)
		for _, c := range r.Uploads {
			s += fmt.Sprintf(" %s=%s/%s", c.Provider, c.Build, c.State)
		}
		got = append(got, s)
	}
	want := []string{"debian building=true: p1=debian-0000000002/uploading p3=/", "fedora building=false: p2=/"}
	if !slices.Equal(got, want) {
		t.Errorf("imageRows = %q\nwant %q", got, want)
	}
}
