package uploader_test

import (
	"context"
	"flag"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/benchkit"
	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/uploader"
	"github.com/nodepool-builder/nodepool-builder/uploader/openstack"
)

// uploadBenchMiB is the size of the image BenchmarkUploadVsCurl uploads.
var uploadBenchMiB = flag.Int("upload.mib", 1024, "size in MiB of the image BenchmarkUploadVsCurl uploads")

// BenchmarkUploadVsCurl uploads one raw disk image (a third random data, the
// rest zeros) to a real Glance through the uploader, as a builder uploads a
// build, and with `curl -T` into an image made the same way, one beside the
// other in each repetition. One Glance worker storing the bytes is the floor of
// an upload, and curl is the simplest client that reaches it.
//
// The product's time runs from the call that sends the data to the status
// check that finds the image active: the check that Glance has the image
// before any data moves, the PUT through the uploader's progress reader, and
// the wait for active. curl's runs from its start to its exit: Glance stores
// the data before it answers the PUT, and the image is active then (checked,
// untimed). The image's creation and the records are outside both. It reports
// the median of the ratio of the two (x_curl) and how much the peak resident
// memory of the process grew during the product's upload (peak_rss_MiB).
func BenchmarkUploadVsCurl(b *testing.B) {
	curl := testenv.RequireBinary(b, "curl")
	g := testenv.NewGlance(b)
	ctx := b.Context()
	cloud, err := openstack.Open(ctx, openstack.Options{Cloud: g.Cloud, CloudsFile: g.CloudsFile})
	if err != nil {
		b.Fatal(err)
	}
	size := int64(*uploadBenchMiB) << 20
	dir := b.TempDir()
	image := filepath.Join(dir, "image.raw")
	benchkit.WriteDiskImage(b, image, size)
	sum := fileMD5(b, image)

	s := newGlanceSetup(b, "glance", g.Cloud, 10*time.Minute, 1)
	timed := &timedCloud{Cloud: cloud}
	up := uploader.New(uploader.Options{Store: s.st, Config: s.cfg, Clouds: map[string]uploader.Cloud{"glance": timed},
		Logger: slog.New(slog.DiscardHandler)})

	times := benchkit.SideBySide{Anchor: "curl"}
	var productCPU, curlCPU time.Duration // the CPU time of the process, and of curl
	// Each upload's image is deleted as soon as it is measured. Here, a
	// gigabyte Glance keeps makes the next upload half as slow again (4.7 s,
	// then 7 s and more, curl's as much as ours: the page cache of the next
	// one lands in memory the machine had not used yet), and a bench that
	// kept them would time that rather than either client.
	//
	// upload makes a new build of the image (a hard link: no copy) and uploads
	// it as a builder does, and returns the product's time.
	upload := func() time.Duration {
		bld := s.readyBuild(b, sum, func(path string) error { return os.Link(image, path) })
		jobs, err := up.Plan(ctx)
		if err != nil || len(jobs) != 1 || jobs[0].Build.ID != bld.ID {
			b.Fatalf("plan: %v, %v; want one job for build %s", jobs, err, bld.ID)
		}
		timed.reset()
		cpu := benchkit.CPUTime(b)
		b.StartTimer()
		rec, err := up.Upload(ctx, jobs[0])
		b.StopTimer()
		productCPU += benchkit.CPUTime(b) - cpu
		if err != nil {
			b.Fatal(err)
		}
		took, ok := timed.took()
		if !ok {
			b.Fatalf("upload %s: the uploader ended without seeing the image active", rec.ExternalID)
		}
		if err := cloud.Delete(ctx, rec.ExternalID); err != nil {
			b.Fatal(err)
		}
		return took
	}
	// anchor uploads the image with curl into an image made as the uploader
	// makes one, and returns curl's time.
	anchor := func() time.Duration {
		id, err := cloud.Create(ctx, uploader.ImageSpec{Name: "bench-curl", DiskFormat: "raw"})
		if err != nil {
			b.Fatal(err)
		}
		cmd := exec.CommandContext(ctx, curl, "-sS", "--fail", "-X", "PUT", "-H", "Content-Type: application/octet-stream",
			"-T", image, g.Endpoint+"/v2/images/"+id+"/file")
		start := time.Now()
		out, err := cmd.CombinedOutput()
		took := time.Since(start)
		if err != nil {
			b.Fatalf("curl -T: %v: %s", err, out)
		}
		curlCPU += cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
		img, err := cloud.Get(ctx, id)
		if err != nil || img.Status != "active" || img.Checksum != sum {
			b.Fatalf("curl's image: %+v, %v; want it active with md5 %s", img, err, sum)
		}
		if err := cloud.Delete(ctx, id); err != nil {
			b.Fatal(err)
		}
		return took
	}

	var peak int64
	b.SetBytes(size)
	rep := 0
	for b.Loop() {
		b.StopTimer() // only the uploader's Upload is timed
		rep++
		var product, curl time.Duration
		mem := benchkit.ResetPeak()
		// Each goes first in every other repetition: neither always meets the
		// machine as the other left it.
		if rep%2 == 1 {
			product = upload()
			curl = anchor()
		} else {
			curl = anchor()
			product = upload()
		}
		if grew, ok := mem.Growth(b); ok {
			peak = max(peak, grew)
		}
		times.Add(product, curl)
		b.StartTimer()
	}
	times.Report(b, "upload")
	b.ReportMetric(productCPU.Seconds()/float64(b.N), "upload_cpu_s")
	b.ReportMetric(curlCPU.Seconds()/float64(b.N), "curl_cpu_s")
	if peak > 0 {
		b.ReportMetric(float64(peak)/(1<<20), "peak_rss_MiB")
	}
}

// timedCloud times one upload through the cloud: from the call that sends the
// data to the first status check that finds the image active.
type timedCloud struct {
	uploader.Cloud
	mu     sync.Mutex
	start  time.Time
	active time.Time
}

func (c *timedCloud) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.start, c.active = time.Time{}, time.Time{}
}

func (c *timedCloud) took() (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.active.Sub(c.start), !c.start.IsZero() && !c.active.IsZero()
}

func (c *timedCloud) Upload(ctx context.Context, id string, data io.Reader, size int64) error {
	c.mu.Lock()
	c.start = time.Now()
	c.mu.Unlock()
	return c.Cloud.Upload(ctx, id, data, size)
}

func (c *timedCloud) Get(ctx context.Context, id string) (uploader.CloudImage, error) {
	img, err := c.Cloud.Get(ctx, id)
	if err == nil && img.Status == "active" {
		c.mu.Lock()
		if !c.start.IsZero() && c.active.IsZero() {
			c.active = time.Now()
		}
		c.mu.Unlock()
	}
	return img, err
}
