package artifacts

import (
	"context"
	"flag"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/nodepool-builder/nodepool-builder/internal/benchkit"
)

// zstBenchMiB is the size of the image BenchmarkFetchZst fetches. md5 is the floor of a
// fetch (every byte must go through it, on one core), so the benchmark reports the fetch
// time as a multiple of md5sum's on the same image; a smaller image gives a quick but
// noisier answer.
var zstBenchMiB = flag.Int("fetchzst.mib", 1024, "size in MiB of the image BenchmarkFetchZst fetches")

// BenchmarkFetchZst fetches a zstd-compressed raw image, a third random data and the rest
// zeros as a disk image is, over loopback, and times md5sum of the raw image right after
// each fetch. It reports the median of the fetch's time as a multiple of md5sum's in each
// repetition (x_md5sum), the CPU time the process spent on the fetch, server included
// (fetch_cpu_s), how much the peak resident memory of the process grew during the fetch
// (peak_rss_MiB), and how many cores the rest of the machine kept busy meanwhile
// (others_cores). The fetch keeps both cores of a 2-core machine busy where md5sum needs
// one: a ratio taken beside other work is that work's, not the fetch's.
//
// The fetched image is removed after each repetition, untimed: a fetch never writes
// over an image, and renaming onto the last repetition's would time the kernel freeing
// a gigabyte of it (0.3 to 0.4 s here).
func BenchmarkFetchZst(b *testing.B) {
	size := int64(*zstBenchMiB) << 20
	dir := b.TempDir()
	raw := filepath.Join(dir, "img.raw")
	served := raw + ".zst"
	benchkit.WriteDiskImage(b, raw, size)
	compressFile(b, raw, served)

	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeFile(w, r, served)
	}))
	defer srv.Close()
	f := testFetcher(b)
	dest := filepath.Join(dir, "fetched.raw")
	req := Request{URL: srv.URL + "/img.raw.zst", Files: files(f, "img.raw", dest), Size: size}

	b.SetBytes(size)
	times := benchkit.SideBySide{Anchor: "md5sum"}
	var fetchCPU time.Duration
	var peak int64
	for b.Loop() {
		b.StopTimer()
		mem := benchkit.ResetPeak()
		cpuBefore := benchkit.CPUTime(b)
		b.StartTimer()
		times.Start()
		start := time.Now()
		res, err := f.Fetch(context.Background(), req)
		fetched := time.Since(start)
		b.StopTimer()
		fetchCPU += benchkit.CPUTime(b) - cpuBefore
		if err != nil {
			b.Fatal(err)
		}
		if grew, ok := mem.Growth(b); ok {
			peak = max(peak, grew)
		}
		start = time.Now()
		sum := md5sum(b, raw)
		times.Add(fetched, time.Since(start))
		if res.MD5 != sum || res.Size != size {
			b.Fatalf("fetched md5 %s size %d, md5sum says %s for %d bytes", res.MD5, res.Size, sum, size)
		}
		if err := os.Remove(dest); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	times.Report(b, "fetch")
	b.ReportMetric(fetchCPU.Seconds()/float64(b.N), "fetch_cpu_s")
	if peak > 0 {
		b.ReportMetric(float64(peak)/(1<<20), "peak_rss_MiB")
	}
}

// compressFile writes src compressed with zstd to dst, with the content size in the frame
// header as the zstd command line writes it.
func compressFile(b *testing.B, src, dst string) {
	b.Helper()
	in, err := os.Open(src)
	if err != nil {
		b.Fatal(err)
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		b.Fatal(err)
	}
	out, err := os.Create(dst)
	if err != nil {
		b.Fatal(err)
	}
	defer out.Close()
	enc, err := zstd.NewWriter(nil)
	if err != nil {
		b.Fatal(err)
	}
	enc.ResetContentSize(out, fi.Size())
	if _, err := io.Copy(enc, in); err != nil {
		b.Fatal(err)
	}
	if err := enc.Close(); err != nil {
		b.Fatal(err)
	}
	if err := out.Close(); err != nil {
		b.Fatal(err)
	}
}

// md5sum runs md5sum on path and returns the digest it prints.
func md5sum(b *testing.B, path string) string {
	b.Helper()
	out, err := exec.Command("md5sum", path).Output()
	if err != nil {
		b.Fatalf("md5sum %s: %v", path, err)
	}
	sum, _, _ := strings.Cut(string(out), " ")
	return sum
}
