// Package benchkit holds what the benchmarks that set the product beside an
// anchor share: the disk image they move, the product-to-anchor ratio over
// repetitions, the CPU and peak memory of the process, and the CPU the rest of
// the machine took meanwhile.
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
	others  []float64 // cores the rest of the machine took, per repetition begun with Start
	meter   *Others
}

// Start begins a repetition whose product and anchor both run before the next
// Add: the CPU the rest of the machine takes meanwhile is reported beside the
// times. Without Start, Add records the times alone.
func (s *SideBySide) Start() {
	m := StartOthers()
	s.meter = &m
}

// Add records one repetition.
func (s *SideBySide) Add(product, anchor time.Duration) {
	s.product = append(s.product, product.Seconds())
	s.anchor = append(s.anchor, anchor.Seconds())
	s.ratio = append(s.ratio, product.Seconds()/anchor.Seconds())
	if s.meter != nil {
		if cores, ok := s.meter.Cores(); ok {
			s.others = append(s.others, cores)
		}
		s.meter = nil
	}
}

// Report reports, as b's metrics, the median of the product's times (product_s),
// of the anchor's (<Anchor>_s) and of their ratio in each repetition
// (x_<Anchor>), and logs every repetition. A ratio of 1 is the floor the anchor
// sets; the median keeps one disturbed repetition from moving it. When every
// repetition measured the rest of the machine, it also reports the median of
// the cores it took (others_cores) and logs it with each repetition.
func (s *SideBySide) Report(b *testing.B, product string) {
	b.Helper()
	if len(s.ratio) == 0 {
		return
	}
	b.ReportMetric(Median(s.product), product+"_s")
	b.ReportMetric(Median(s.anchor), s.Anchor+"_s")
	b.ReportMetric(Median(s.ratio), "x_"+s.Anchor)
	others := len(s.others) == len(s.ratio)
	if others {
		b.ReportMetric(Median(s.others), "others_cores")
	}
	var reps []string
	for i := range s.ratio {
		rep := fmt.Sprintf("%.3fs/%.3fs=%.3f", s.product[i], s.anchor[i], s.ratio[i])
		if others {
			rep += fmt.Sprintf(" (others %.2f)", s.others[i])
		}
		reps = append(reps, rep)
	}
	b.Logf("%s against %s, each repetition: %s", product, s.Anchor, strings.Join(reps, " "))
}

// Others measures the CPU the rest of the machine takes while a benchmark
// runs: other processes, the kernel's own threads and, in a virtual machine,
// the time the host gives to others (steal). A product that keeps every core
// busy loses more to them than an anchor that needs one core, so its ratio to
// the anchor is its own only while the rest of the machine is idle.
type Others struct {
	at      time.Time
	machine time.Duration // CPU time of the whole machine, steal included
	own     time.Duration // CPU time of the process and its waited-for children
	ok      bool
}

// StartOthers starts measuring. Where the machine's CPU time cannot be read
// (no /proc/stat), Cores reports nothing.
func StartOthers() Others {
	machine, err := machineCPUTime()
	own, oerr := ownCPUTime()
	return Others{at: time.Now(), machine: machine, own: own, ok: err == nil && oerr == nil}
}

// Cores returns how many cores, on average, the rest of the machine kept busy
// since StartOthers, and false when it cannot tell.
func (o Others) Cores() (float64, bool) {
	if !o.ok {
		return 0, false
	}
	machine, err := machineCPUTime()
	if err != nil {
		return 0, false
	}
	own, err := ownCPUTime()
	if err != nil {
		return 0, false
	}
	elapsed := time.Since(o.at)
	if elapsed <= 0 {
		return 0, false
	}
	// The machine's time is counted in ticks, the process's finer: a little
	// below zero is the rounding.
	others := (machine - o.machine) - (own - o.own)
	return max(others.Seconds()/elapsed.Seconds(), 0), true
}

// userHZ is the unit of the times in /proc/stat: fixed for user space
// whatever the kernel's own tick rate.
const userHZ = 100

// machineCPUTime returns the busy time of all the machine's CPUs since boot,
// with the time the host took from them.
func machineCPUTime() (time.Duration, error) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := bytes.Cut(data, []byte("\n"))
	return busyTime(string(line))
}

// busyTime returns the busy time in the first line of /proc/stat: "cpu" and
// then user, nice, system, idle, iowait, irq, softirq and steal ticks, and
// more. All but idle and iowait are busy; guest time is within user and nice
// already.
func busyTime(line string) (time.Duration, error) {
	fields := strings.Fields(line)
	if len(fields) < 9 || fields[0] != "cpu" {
		return 0, fmt.Errorf("unexpected first line in /proc/stat: %q", line)
	}
	var ticks int64
	for i, f := range fields[1:9] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("parse /proc/stat: %w", err)
		}
		if i != 3 && i != 4 {
			ticks += n
		}
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}

// ownCPUTime returns the CPU time of the process and of the children it has
// waited for, such as an anchor run as a command.
func ownCPUTime() (time.Duration, error) {
	var self, children syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &self); err != nil {
		return 0, err
	}
	if err := syscall.Getrusage(syscall.RUSAGE_CHILDREN, &children); err != nil {
		return 0, err
	}
	return time.Duration(self.Utime.Nano() + self.Stime.Nano() + children.Utime.Nano() + children.Stime.Nano()), nil
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
