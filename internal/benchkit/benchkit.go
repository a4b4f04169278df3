// Package benchkit holds what the benchmarks that set the product beside an
// anchor share: the disk image they move, the product-to-anchor ratio over
// repetitions, and the CPU and peak memory of the process.
package benchkit

import (
	"bufio"
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// imageBlock is the unit of WriteDiskImage: each block is random or zeros.
const imageBlock = 64 << 10

// WriteDiskImage writes size bytes made of 64 KiB blocks, 35% of them random and
// the rest zeros, in a fixed order, as a disk image is: mostly unused space. Zeros
// are written, not skipped, so that a reader of the file reads what it would
// read of a real image in the page cache.
func WriteDiskImage(tb testing.TB, path string, size int64) {
	tb.Helper()
	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	w := bufio.NewWriterSize(f, 1<<20)
	pick := rand.New(rand.NewPCG(3, 4))
	noise := rand.NewChaCha8([32]byte{9})
	block := make([]byte, imageBlock)
	zeros := make([]byte, imageBlock)
	for left := size; left > 0; left -= imageBlock {
		out := zeros
		if pick.IntN(100) < 35 {
			noise.Read(block)
			out = block
		}
		if _, err := w.Write(out[:min(left, imageBlock)]); err != nil {
			tb.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		tb.Fatal(err)
	}
	if err := f.Close(); err != nil {
		tb.Fatal(err)
	}
}

// SideBySide collects the times of the product and of its anchor, measured one
// beside the other in each repetition, and reports their medians.
type SideBySide struct {
	// Anchor names the anchor in the reported units: x_<Anchor>, <Anchor>_s.
	Anchor  string
	product []float64
	anchor  []float64
	ratio   []float64
}

// Add records one repetition.
func (s *SideBySide) Add(product, anchor time.Duration) {
	s.product = append(s.product, product.Seconds())
	s.anchor = append(s.anchor, anchor.Seconds())
	s.ratio = append(s.ratio, product.Seconds()/anchor.Seconds())
}

// Report reports, as b's metrics, the median of the product's times (product_s),
// of the anchor's (<Anchor>_s) and of their ratio in each repetition
// (x_<Anchor>), and logs every repetition. A ratio of 1 is the floor the anchor
// sets; the median keeps one disturbed repetition from moving it.
func (s *SideBySide) Report(b *testing.B, product string) {
	b.Helper()
	if len(s.ratio) == 0 {
		return
	}
	b.ReportMetric(Median(s.product), product+"_s")
	b.ReportMetric(Median(s.anchor), s.Anchor+"_s")
	b.ReportMetric(Median(s.ratio), "x_"+s.Anchor)
	var reps []string
	for i := range s.ratio {
		reps = append(reps, fmt.Sprintf("%.3fs/%.3fs=%.3f", s.product[i], s.anchor[i], s.ratio[i]))
	}
	b.Logf("%s against %s, each repetition: %s", product, s.Anchor, strings.Join(reps, " "))
}

// Median returns the median of xs, 0 for none.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// Memory measures how much the peak resident memory of the process grows.
type Memory struct {
	base int64
	ok   bool
}

// ResetPeak hands freed memory back to the system and resets the peak that
// Growth reads. Growth reports nothing when the kernel does not allow the reset.
func ResetPeak() Memory {
	runtime.GC()
	debug.FreeOSMemory()
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		return Memory{}
	}
	rss, err := procStatus("VmRSS")
	return Memory{base: rss, ok: err == nil}
}

// Growth returns how far the peak resident memory rose above the resident memory
// at the reset, and false when it cannot tell.
func (m Memory) Growth(tb testing.TB) (int64, bool) {
	tb.Helper()
	if !m.ok {
		return 0, false
	}
	n, err := procStatus("VmHWM")
	if err != nil {
		tb.Fatal(err)
	}
	return n - m.base, true
}

// CPUTime returns the user and system CPU time the process has used.
func CPUTime(tb testing.TB) time.Duration {
	tb.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
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
