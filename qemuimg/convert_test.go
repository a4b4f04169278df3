package qemuimg

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/diskspace"
	"github.com/nodepool-builder/nodepool-builder/internal/perm"
	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/internal/untrusted"
)

// qemuInfo returns the format and virtual size qemu-img reports for path.
func qemuInfo(t *testing.T, qemuImg, path string) (string, int64) {
	t.Helper()
	out, err := exec.Command(qemuImg, "info", "--output=json", path).Output()
	if err != nil {
		t.Fatalf("qemu-img info %s: %v", path, err)
	}
	var info struct {
		Format      string `json:"format"`
		VirtualSize int64  `json:"virtual-size"`
	}
	if err := json.Unmarshal(out, &info); err != nil {
		t.Fatalf("parse qemu-img info: %v", err)
	}
	return info.Format, info.VirtualSize
}

// inspect returns what Inspect finds of the image at path, claimed to be format.
func inspect(t *testing.T, qemuImg, path, format string) Info {
	t.Helper()
	img, err := Inspect(context.Background(), qemuImg, path, format)
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	return img
}

func TestConvert(t *testing.T) {
	qemuImg := testenv.RequireBinary(t, "qemu-img")
	dir := t.TempDir()
	// 3 MiB + 512 bytes: not a whole number of VHD geometry cylinders, so force_size matters.
	disk := make([]byte, 3<<20+512)
	rand.NewChaCha8([32]byte{1}).Read(disk)
	raw := filepath.Join(dir, "img.raw")
	if err := os.WriteFile(raw, disk, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		format   string // what to convert raw into, in our names
		qemuName string // what qemu-img info then reports
	}{
		{"qcow2", "qcow2"},
		{"qcow", "qcow2"},
		{"vhd", "vpc"},
	}
	for _, tt := range tests {
		t.Run(tt.format, func(t *testing.T) {
			ctx := context.Background()
			conv := filepath.Join(dir, "img."+tt.format)
			if err := Convert(ctx, qemuImg, inspect(t, qemuImg, raw, "raw"), conv, tt.format); err != nil {
				t.Fatalf("Convert raw to %s: %v", tt.format, err)
			}
			// Images are for the builder's user and group: 0640, not
			// CreateTemp's 0600 nor the umask's 0644.
			if fi, err := os.Stat(conv); err != nil || fi.Mode().Perm() != perm.File {
				t.Errorf("converted image mode %v, %v; want %v", fi.Mode().Perm(), err, perm.File)
			}
			format, size := qemuInfo(t, qemuImg, conv)
			if format != tt.qemuName || size != int64(len(disk)) {
				t.Errorf("converted image is %s of %d bytes, want %s of %d", format, size, tt.qemuName, len(disk))
			}
			back := filepath.Join(dir, "back-"+tt.format+".raw")
			if err := Convert(ctx, "", inspect(t, qemuImg, conv, tt.format), back, "raw"); err != nil {
				t.Fatalf("Convert %s to raw: %v", tt.format, err)
			}
			got, err := os.ReadFile(back)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, disk) {
				t.Errorf("raw -> %s -> raw gave %d bytes that differ from the %d original", tt.format, len(got), len(disk))
			}
		})
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("temporary file left behind: %s", e.Name())
		}
	}
}

func TestConvertFailure(t *testing.T) {
	qemuImg := testenv.RequireBinary(t, "qemu-img")
	dir := t.TempDir()
	src := filepath.Join(dir, "not-qcow2")
	if err := os.WriteFile(src, []byte("this is not a qcow2 image"), 0o644); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "out.raw")
	// As a file Inspect did not see: qemu-img itself must refuse it.
	err := Convert(context.Background(), qemuImg, Info{Path: src, Format: "qcow2", VirtualSize: 1 << 20}, dst, "raw")
	if err == nil {
		t.Fatal("Convert of a broken image succeeded")
	}
	// qemu-img's own complaint must reach the caller.
	if !strings.Contains(err.Error(), src) || !strings.Contains(strings.ToLower(err.Error()), "qcow2") {
		t.Errorf("error %q names neither the source nor the problem", err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory holds %d files after a failed conversion, want only the source", len(entries))
	}
}

// onlySource fails the test unless dir holds nothing but src: no output, no
// temporary file.
func onlySource(t *testing.T, dir, src string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != filepath.Base(src) {
			t.Errorf("%s left in the directory", e.Name())
		}
	}
}

// TestConvertChecksRoom: a conversion writes up to the disk's virtual size, so
// it starts only when the destination's filesystem has that much free.
func TestConvertChecksRoom(t *testing.T) {
	qemuImg := testenv.RequireBinary(t, "qemu-img")
	const size = 4 << 20
	tests := []struct {
		name string
		free func(string) (int64, error)
		want []string // what the error says; nil: the conversion goes ahead
	}{
		{"exactly enough", func(string) (int64, error) { return size, nil }, nil},
		{"a byte short", func(string) (int64, error) { return size - 1, nil }, []string{"need 4194304 bytes, 4194303 free", "a disk of 4.0 MiB"}},
		{"cannot tell", func(string) (int64, error) { return 0, syscall.EIO }, []string{"check free space", "input/output error"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			qemuImgCreate(t, qemuImg, dir, "-q", "-f", "qcow2", "src.qcow2", strconv.Itoa(size))
			src := inspect(t, qemuImg, filepath.Join(dir, "src.qcow2"), "qcow2")
			dst := filepath.Join(dir, "out.raw")
			var asked []string
			free := func(d string) (int64, error) {
				asked = append(asked, d)
				return tt.free(d)
			}
			err := convert(context.Background(), qemuImg, src, dst, "raw", free, convertBounds(src.VirtualSize))
			if len(asked) != 1 || asked[0] != dir {
				t.Errorf("free space asked of %v, want once of %s", asked, dir)
			}
			if tt.want == nil {
				if err != nil {
					t.Fatalf("convert: %v", err)
				}
				if _, size := qemuInfo(t, qemuImg, dst); size != src.VirtualSize {
					t.Errorf("converted disk of %d bytes, want %d", size, src.VirtualSize)
				}
				return
			}
			if err == nil {
				t.Fatal("convert went ahead")
			}
			if tt.name == "a byte short" && !errors.Is(err, diskspace.ErrNoSpace) {
				t.Errorf("error %v does not wrap diskspace.ErrNoSpace", err)
			}
			for _, want := range append(tt.want, dir, src.Path) {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
			onlySource(t, dir, src.Path)
		})
	}
}

// TestConvertHugeDiskNoRoom: a qcow2 of a few hundred KiB holding a disk of
// terabytes, more than its filesystem has free, is not converted to raw.
func TestConvertHugeDiskNoRoom(t *testing.T) {
	qemuImg := testenv.RequireBinary(t, "qemu-img")
	dir := t.TempDir()
	size := testenv.HugerThanFree(t, dir)
	qemuImgCreate(t, qemuImg, dir, "-q", "-f", "qcow2", "huge.qcow2", strconv.FormatInt(size, 10))
	src := inspect(t, qemuImg, filepath.Join(dir, "huge.qcow2"), "qcow2")
	err := Convert(context.Background(), qemuImg, src, filepath.Join(dir, "huge.raw"), "raw")
	if want := fmt.Sprintf("need %d bytes", size); !errors.Is(err, diskspace.ErrNoSpace) || !strings.Contains(err.Error(), want) {
		t.Fatalf("Convert = %v, want diskspace.ErrNoSpace saying %q", err, want)
	}
	onlySource(t, dir, src.Path)
}

// TestConvertCancel: once its context is done, the conversion's qemu-img is
// killed and Convert returns, leaving nothing behind.
func TestConvertCancel(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "stuck.raw")
	if err := os.WriteFile(src, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	// A FIFO nobody writes to: the stand-in blocks opening it, a conversion that would
	// never end by itself. (The real qemu-img is never given a FIFO: Convert refuses one.)
	fifo := filepath.Join(t.TempDir(), "block")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	qemuImg := fakeQemuImg(t, "read x < '"+fifo+"'")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- Convert(ctx, qemuImg, Info{Path: src, Format: "raw", VirtualSize: 1 << 20}, filepath.Join(dir, "out.qcow2"), "qcow2")
	}()
	pid := waitForProcess(t, done, "convert", src)
	// Should it outlive the test, it would wait on the FIFO for ever.
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Convert = %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Convert still running 10s after its context was cancelled")
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("qemu-img (pid %d) still exists after Convert returned: %v", pid, err)
	}
	onlySource(t, dir, src)
}

// waitForProcess returns the pid of the process of this test's whose command line
// holds every one of args, once it runs; it fails the test when done (the work
// that should start it) ends first or none runs within 10s.
func waitForProcess(t *testing.T, done <-chan error, args ...string) int {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(10 * time.Second)
	for {
		if pid := findProcess(args); pid > 0 {
			return pid
		}
		select {
		case err := <-done:
			t.Fatalf("ended before a process %v was seen: %v", args, err)
		case <-deadline:
			t.Fatalf("no process %v within 10s", args)
		case <-tick.C:
		}
	}
}

// findProcess returns the pid of a child of this process whose command line holds
// every one of args; 0 when none does.
func findProcess(args []string) int {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// The parent pid is the 4th field, after the command name in parentheses.
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(fields) < 2 || fields[1] != strconv.Itoa(os.Getpid()) {
			continue
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		argv := strings.Split(string(cmdline), "\x00")
		all := true
		for _, a := range args {
			if !slices.Contains(argv, a) {
				all = false
			}
		}
		if all {
			return pid
		}
	}
	return 0
}

// TestConvertRefusesOtherFiles: Convert reads its source through qemu-img too, so it
// judges the header as Inspect does, whatever Info it is given, before qemu-img runs.
func TestConvertRefusesOtherFiles(t *testing.T) {
	realQemuImg := testenv.RequireBinary(t, "qemu-img")
	dir := t.TempDir()
	qemuImgCreate(t, realQemuImg, dir, "-f", "qcow2", "-o", "data_file="+filepath.Join(dir, "host.data"), "datafile.qcow2", "1M")
	qemuImgCreate(t, realQemuImg, dir, "-f", "vmdk", "-o", "subformat=monolithicFlat", "flat.vmdk", "1M")
	qemuImg, calls := recordingQemuImg(t, realQemuImg)
	for _, src := range []Info{
		{Path: filepath.Join(dir, "datafile.qcow2"), Format: "qcow2", VirtualSize: 1 << 20},
		{Path: filepath.Join(dir, "flat.vmdk"), Format: "vmdk", VirtualSize: 1 << 20},
	} {
		err := Convert(context.Background(), qemuImg, src, filepath.Join(dir, "out.raw"), "raw")
		if !errors.Is(err, untrusted.ErrUnsafe) {
			t.Errorf("Convert %s = %v, want untrusted.ErrUnsafe", src.Path, err)
		}
	}
	if ran := readCalls(t, calls); ran != "" {
		t.Errorf("qemu-img ran: %q", ran)
	}
	if _, err := os.Stat(filepath.Join(dir, "out.raw")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("out.raw: %v, want none", err)
	}
}

// TestConvertLimits: qemu-img convert runs under prlimit's CPU and memory limits,
// which grow with the disk.
func TestConvertLimits(t *testing.T) {
	testenv.RequireBinary(t, "prlimit")
	// The stand-in reports its limits in its error (ulimit -d counts KiB).
	qemuImg := fakeQemuImg(t, `echo "data=$(ulimit -d),cpu=$(ulimit -t)" >&2; exit 1`)
	dir := t.TempDir()
	src := filepath.Join(dir, "img.raw")
	if err := os.WriteFile(src, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	err := Convert(context.Background(), qemuImg, Info{Path: src, Format: "raw", VirtualSize: 1 << 20}, filepath.Join(dir, "out.qcow2"), "qcow2")
	if want := "data=2097152,cpu=330"; err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Convert error = %v, want one saying %q", err, want)
	}
	onlySource(t, dir, src)
}

// TestConvertBounds: a conversion's time and CPU time grow by the started GiB of
// the disk's virtual size; its memory does not.
func TestConvertBounds(t *testing.T) {
	for _, tt := range []struct {
		size      int64
		time, cpu time.Duration
	}{
		{0, 10 * time.Minute, 5 * time.Minute},
		{1, 11 * time.Minute, 5*time.Minute + 30*time.Second},
		{1 << 30, 11 * time.Minute, 5*time.Minute + 30*time.Second},
		{1<<30 + 1, 12 * time.Minute, 6 * time.Minute},
		{128 << 30, 138 * time.Minute, 69 * time.Minute},
	} {
		b := convertBounds(tt.size)
		if b.timeout != tt.time || b.cpu != tt.cpu || b.data != 2<<30 || b.addressSpace != 0 {
			t.Errorf("convertBounds(%d) = %+v, want %s, %s of CPU and 2 GiB of memory", tt.size, b, tt.time, tt.cpu)
		}
	}
}

// TestConvertTimeout: a conversion that runs past its time limit is killed, and the
// error says it ran out of time, what the operator can do, and leaves nothing behind.
func TestConvertTimeout(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "stuck.raw")
	if err := os.WriteFile(src, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(t.TempDir(), "block")
	mkfifo(t, fifo)
	qemuImg := fakeQemuImg(t, "read x < '"+fifo+"'")
	b := bounds{timeout: 500 * time.Millisecond, cpu: time.Minute, data: 2 << 30}
	start := time.Now()
	err := convert(context.Background(), qemuImg, Info{Path: src, Format: "raw", VirtualSize: 1 << 20},
		filepath.Join(dir, "out.qcow2"), "qcow2", diskspace.Free, b)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("convert = %v, want context.DeadlineExceeded", err)
	}
	for _, want := range []string{"ran longer than its 500ms, its bound for a disk of 1.0 MiB", "publish qcow2 from the image job"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("convert returned %s after it started, its bound 500ms", d)
	}
	onlySource(t, dir, src)
}

// TestConvertCPULimit: a conversion that spins past its CPU time is killed, and
// the error says so.
func TestConvertCPULimit(t *testing.T) {
	testenv.RequireBinary(t, "prlimit")
	dir := t.TempDir()
	src := filepath.Join(dir, "spin.raw")
	if err := os.WriteFile(src, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	qemuImg := fakeQemuImg(t, "while :; do :; done")
	b := bounds{timeout: time.Minute, cpu: time.Second, data: 2 << 30}
	err := convert(context.Background(), qemuImg, Info{Path: src, Format: "raw", VirtualSize: 1 << 20},
		filepath.Join(dir, "out.qcow2"), "qcow2", diskspace.Free, b)
	if err == nil || !strings.Contains(err.Error(), "used its 1s of CPU time, its bound for a disk of 1.0 MiB") {
		t.Fatalf("convert = %v, want an error saying it used its 1s of CPU time", err)
	}
	onlySource(t, dir, src)
}

// TestConvertWithinBounds: real conversions of a disk with data fit the bounds,
// though qemu-img starts a pool of threads whose stacks and allocator arenas
// reserve far more address space than it uses.
func TestConvertWithinBounds(t *testing.T) {
	qemuImg := testenv.RequireBinary(t, "qemu-img")
	testenv.RequireBinary(t, "prlimit")
	dir := t.TempDir()
	raw := filepath.Join(dir, "disk.raw")
	data := make([]byte, 64<<20)
	rand.NewChaCha8([32]byte{2}).Read(data)
	if err := os.WriteFile(raw, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(raw, 256<<20); err != nil {
		t.Fatal(err)
	}
	src := inspect(t, qemuImg, raw, "raw")
	for _, format := range []string{"vmdk", "vhd", "qcow2"} {
		if err := Convert(context.Background(), qemuImg, src, filepath.Join(dir, "disk."+format), format); err != nil {
			t.Errorf("Convert raw to %s: %v", format, err)
		}
	}
}
