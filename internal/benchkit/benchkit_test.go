package benchkit

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
)

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		xs   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{1.2, 0.9, 1.0}, 1.0},
		{[]float64{4, 1, 3, 2}, 2.5},
	} {
		in := slices.Clone(c.xs)
		if got := Median(c.xs); got != c.want {
			t.Errorf("Median(%v) = %v, want %v", in, got, c.want)
		}
		if !slices.Equal(in, c.xs) {
			t.Errorf("Median reordered its input: %v, was %v", c.xs, in)
		}
	}
}

// TestWriteDiskImage: the image has the size asked, about a third of its blocks
// hold data and the rest zeros, and it is the same image every time.
func TestWriteDiskImage(t *testing.T) {
	dir := t.TempDir()
	const size = 200*imageBlock + 123
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	WriteDiskImage(t, a, size)
	WriteDiskImage(t, b, size)
	da, err := os.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	db, err := os.ReadFile(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(da) != size || !slices.Equal(da, db) {
		t.Fatalf("two images of %d bytes: %d and %d bytes, equal %v", size, len(da), len(db), slices.Equal(da, db))
	}
	zeros := make([]byte, imageBlock)
	data := 0
	for off := 0; off+imageBlock <= size; off += imageBlock {
		if !slices.Equal(da[off:off+imageBlock], zeros) {
			data++
		}
	}
	if data < 50 || data > 90 {
		t.Errorf("%d of 200 blocks hold data; want about 70 (35%%)", data)
	}
}

func TestBusyTime(t *testing.T) {
	// user nice system idle iowait irq softirq steal guest guest_nice
	got, err := busyTime("cpu  158806 7 31721 79833 4697 3 1745 1498 900 0")
	if want := (158806 + 7 + 31721 + 3 + 1745 + 1498) * 10 * time.Millisecond; err != nil || got != want {
		t.Errorf("busyTime = %v, %v; want %v", got, err, want)
	}
	for _, line := range []string{"", "intr 1 2 3 4 5 6 7 8", "cpu 1 2 3", "cpu 1 2 3 x 5 6 7 8"} {
		if _, err := busyTime(line); err == nil {
			t.Errorf("busyTime(%q) gave no error", line)
		}
	}
}

// TestOthers: the CPU a busy process beside this one takes shows as the rest
// of the machine's, and no longer once this process has waited for it: then it
// is this process's child, whose time is the process's own.
func TestOthers(t *testing.T) {
	if _, ok := StartOthers().Cores(); !ok {
		testenv.Unavailable(t, "the machine's CPU time cannot be read")
	}
	o := StartOthers()
	busy := exec.Command("sh", "-c", "while :; do :; done")
	if err := busy.Start(); err != nil {
		t.Fatal(err)
	}
	stop := sync.OnceFunc(func() {
		busy.Process.Kill()
		busy.Wait()
	})
	defer stop()
	var spent time.Duration
	testenv.WaitFor(t, 30*time.Second, "the busy process to take half a second of CPU", func() bool {
		spent = cpuOf(t, busy.Process.Pid)
		return spent >= 500*time.Millisecond
	})
	// CPU seconds the rest of the machine took since o began.
	others := func() float64 {
		cores, ok := o.Cores()
		if !ok {
			t.Fatal("the machine's CPU time could be read, then not")
		}
		return cores * time.Since(o.at).Seconds()
	}
	before := others()
	// The machine counts in ticks of 10 ms on each CPU; between two readings a
	// few milliseconds apart, the rest of the machine adds little.
	slack := 0.1
	if n := float64(runtime.NumCPU()) * time.Since(o.at).Seconds(); before < spent.Seconds()-slack || before > n+slack {
		t.Fatalf("the rest of the machine took %.2f s of CPU in %s, the busy process %s of it", before, time.Since(o.at), spent)
	}
	stop()
	spent = busy.ProcessState.UserTime() + busy.ProcessState.SystemTime()
	if after := others(); after > before-spent.Seconds()+slack {
		t.Errorf("the rest of the machine took %.2f s of CPU with the busy process running, %.2f s once it was waited for, after it took %s", before, after, spent)
	}
}

// cpuOf returns the CPU time of the process pid so far.
func cpuOf(t *testing.T, pid int) time.Duration {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// pid (comm) state ppid ... utime stime: the 14th and 15th fields, the
	// 12th and 13th after the command's name, which may hold spaces.
	_, rest, _ := strings.Cut(string(data), ") ")
	fields := strings.Fields(rest)
	if len(fields) < 13 {
		t.Fatalf("unexpected /proc/%d/stat: %q", pid, data)
	}
	var ticks int64
	for _, f := range fields[11:13] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			t.Fatalf("unexpected /proc/%d/stat: %q", pid, data)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / userHZ
}
