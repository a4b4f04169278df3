package artifacts

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
)

// zstBenchMiB is the size of the image BenchmarkFetchZst fetches. md5 is the floor of a
// fetch (every byte must go through it, on one core), so the benchmark reports the fetch
// time as a multiple of md5sum's on the same image; a smaller image gives a quick but
// noisier answer.
var zstBenchMiB = flag.Int("fetchzst.mib", 1024, "size in MiB of the image BenchmarkFetchZst fetches")

// BenchmarkFetchZst fetches a zstd-compressed raw image, a third random data and the rest
// zeros as a disk image is, over loopback, and times md5sum of the raw image in the same
// run. It reports the ratio of the two (x_md5sum), the CPU time the process spent on the
// fetch, server included (fetch_cpu_s), and how much the peak resident memory of the
// process grew during the fetch (peak_rss_MiB).
func BenchmarkFetchZst(b *testing.B) {
	size := int64(*zstBenchMiB) << 20
	dir := b.TempDir()
	raw := filepath.Join(dir, "img.raw")
	served := raw + ".zst"
	writeDiskImage(b, raw, size)
	compressFile(b, raw, served)

	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeFile(w, r, served)
	}))
	defer srv.Close()
	f := testFetcher(b)
	dest := filepath.Join(dir, "fetched.raw")
	req := Request{URL: srv.URL + "/img.raw.zst", Dest: dest, Key: "img.raw", Size: size}

	b.SetBytes(size)
	var fetchTime, fetchCPU, md5Time time.Duration
	var peak int64
	for b.Loop() {
		b.StopTimer()
		base, resetOK := resetPeakRSS()
		cpuBefore := cpuTime(b)
		b.StartTimer()
		start := time.Now()
		res, err := f.Fetch(context.Background(), req)
		fetchTime += time.Since(start)
		b.StopTimer()
		fetchCPU += cpuTime(b) - cpuBefore
		if err != nil {
			b.Fatal(err)
		}
		if resetOK {
			peak = max(peak, peakRSS(b)-base)
		}
		start = time.Now()
		sum := md5sum(b, raw)
		md5Time += time.Since(start)
		if res.MD5 != sum || res.Size != size {
			b.Fatalf("fetched md5 %s size %d, md5sum says %s for %d bytes", res.MD5, res.Size, sum, size)
		}
		b.StartTimer()
	}
	b.ReportMetric(md5Time.Seconds()/float64(b.N), "md5sum_s")
	b.ReportMetric(fetchTime.Seconds()/float64(b.N), "fetch_s")
	b.ReportMetric(fetchCPU.Seconds()/float64(b.N), "fetch_cpu_s")
	b.ReportMetric(fetchTime.Seconds()/md5Time.Seconds(), "x_md5sum")
	if peak > 0 {
		b.ReportMetric(float64(peak)/(1<<20), "peak_rss_MiB")
	}
}

// writeDiskImage writes size bytes made of 64 KiB blocks, 35% of them random and the rest
// zeros, in a fixed order. Zeros are written, not skipped, so that md5sum reads what it
// would read of a real image in the page cache.
func writeDiskImage(b *testing.B, path string, size int64) {
	b.Helper()
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	w := bufio.NewWriterSize(f, 1<<20)
	pick := rand.New(rand.NewPCG(3, 4))
	noise := rand.NewChaCha8([32]byte{9})
	block := make([]byte, sparseBlock)
	zeros := make([]byte, sparseBlock)
	for left := size; left > 0; left -= sparseBlock {
		out := zeros
		if pick.IntN(100) < 35 {
			noise.Read(block)
			out = block
		}
		if _, err := w.Write(out[:min(left, sparseBlock)]); err != nil {
			b.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		b.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
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

// resetPeakRSS returns the resident memory of the process after handing freed memory back
// to the system, and resets the peak that peakRSS reads; false when the kernel does not
// allow the reset.
func resetPeakRSS() (int64, bool) {
	runtime.GC()
	debug.FreeOSMemory()
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		return 0, false
	}
	rss, err := procStatus("VmRSS")
	return rss, err == nil
}

// peakRSS returns the peak resident memory of the process since the last reset.
func peakRSS(b *testing.B) int64 {
	b.Helper()
	n, err := procStatus("VmHWM")
	if err != nil {
		b.Fatal(err)
	}
	return n
}

// cpuTime returns the user and system CPU time the process has used.
func cpuTime(b *testing.B) time.Duration {
	b.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// procStatus returns a memory field of /proc/self/status, in bytes.
func procStatus(field string) (int64, error) {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for line := range bytes.Lines(data) {
		rest, ok := bytes.CutPrefix(line, []byte(field+":"))
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(string(rest)), " kB"), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("parse %s in /proc/self/status: %w", field, err)
		}
		return kb << 10, nil
	}
	return 0, fmt.Errorf("no %s in /proc/self/status", field)
}
