package uploader_test

import (
	"context"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/benchkit"
	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/uploader"
	"github.com/nodepool-builder/nodepool-builder/uploader/openstack"
)

// TestUploadToGlanceWaitsForNothing: an upload to a real Glance sends its data
// in one PUT that announces its length (not chunked), and the first status read
// after it finds the image active, so the upload never waits a poll interval:
// with an interval of an hour it still ends at once.
func TestUploadToGlanceWaitsForNothing(t *testing.T) {
	g := testenv.NewGlance(t)
	ctx := t.Context()
	var mu sync.Mutex
	var seen []string // the requests, in order: "METHOD framing"
	client := &http.Client{Transport: roundTrip(func(r *http.Request) (*http.Response, error) {
		framing := ""
		if r.Method == http.MethodPut {
			// How the transport frames the body: a known length goes as
			// Content-Length, anything else chunked.
			framing = " chunked"
			if r.ContentLength > 0 && len(r.TransferEncoding) == 0 {
				framing = " length"
			}
		}
		mu.Lock()
		seen = append(seen, r.Method+framing)
		mu.Unlock()
		return http.DefaultTransport.RoundTrip(r)
	})}
	cloud, err := openstack.Open(ctx, openstack.Options{Cloud: g.Cloud, CloudsFile: g.CloudsFile, HTTPClient: client})
	if err != nil {
		t.Fatal(err)
	}

	const size = 8 << 20
	setup := newGlanceSetup(t, "glance", g.Cloud, time.Hour, 1)
	setup.readyBuild(t, "", func(path string) error {
		benchkit.WriteDiskImage(t, path, size)
		return nil
	})
	up := uploader.New(uploader.Options{Store: setup.st, Config: setup.cfg, Clouds: map[string]uploader.Cloud{"glance": cloud},
		PollInterval: time.Hour, Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	jobs, err := up.Plan(ctx)
	if err != nil || len(jobs) != 1 {
		t.Fatalf("plan: %v, %v; want one job", jobs, err)
	}
	mu.Lock()
	seen = nil
	mu.Unlock()
	uctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	rec, err := up.Upload(uctx, jobs[0])
	if err != nil {
		t.Fatalf("upload with a poll interval of an hour: %v", err)
	}
	mu.Lock()
	got := slices.Clone(seen)
	mu.Unlock()
	// Create, the check before the data, the data, one status read.
	if want := []string{"POST", "GET", "PUT length", "GET"}; !slices.Equal(got, want) {
		t.Errorf("the upload's requests: %q; want %q", got, want)
	}
	if img, err := cloud.Get(ctx, rec.ExternalID); err != nil || img.Status != "active" || img.Size != size {
		t.Fatalf("Glance's image: %+v, %v; want it active with %d bytes", img, err, size)
	}
}

type roundTrip func(*http.Request) (*http.Response, error)

func (f roundTrip) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
