package qemuimg

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/internal/untrusted"
)

// qemuImgCreate runs `qemu-img create` with args in dir.
func qemuImgCreate(t *testing.T, qemuImg, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command(qemuImg, append([]string{"create"}, args...)...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create %v: %v: %s", args, err, out)
	}
}

func TestInspect(t *testing.T) {
	qemuImg := testenv.RequireBinary(t, "qemu-img")
	dir := t.TempDir()
	create := func(args ...string) { qemuImgCreate(t, qemuImg, dir, args...) }
	create("-f", "qcow2", "plain.qcow2", "1M")
	create("-f", "raw", "plain.raw", "1M")
	create("-f", "vpc", "plain.vhd", "1M")
	create("-f", "vmdk", "plain.vmdk", "1M")
	// -u: the backing file does not exist here, and qemu-img info must not need it.
	create("-f", "qcow2", "-u", "-b", "/etc/nodepool/clouds.yaml", "-F", "raw", "backed.qcow2", "1M")
	create("-f", "qcow2", "-o", "data_file="+filepath.Join(dir, "host.data")+",data_file_raw=on", "datafile.qcow2", "1M")
	create("-f", "vmdk", "-o", "subformat=twoGbMaxExtentSparse", "split.vmdk", "3G")
	create("-f", "vmdk", "-o", "subformat=monolithicFlat", "flat.vmdk", "1M")
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("just some text\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Raw images by size, sparse: only their length matters.
	for name, size := range map[string]int64{"odd.raw": 1<<20 + 1, "short.raw": 1<<20 - 512, "sectors.raw": 2<<20 + 512} {
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(size); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}

	tests := []struct {
		file, format string
		unsafe       []string // what the error must name; nil: safe
	}{
		{file: "plain.qcow2", format: "qcow2"},
		{file: "plain.qcow2", format: "qcow"},
		{file: "plain.raw", format: "raw"},
		{file: "plain.raw", format: "iso"},
		{file: "plain.vhd", format: "vhd"},
		{file: "plain.vmdk", format: "vmdk"},
		{file: "notes.txt", format: "squashfs"},
		{file: "sectors.raw", format: "raw"},
		{file: "notes.txt", format: "raw", unsafe: []string{"a raw image of 15 bytes is no disk image", "at least 1048576 bytes"}},
		{file: "odd.raw", format: "raw", unsafe: []string{"a raw image of 1048577 bytes", "whole number of 512-byte sectors"}},
		{file: "short.raw", format: "raw", unsafe: []string{"a raw image of 1048064 bytes"}},
		{file: "backed.qcow2", format: "qcow2", unsafe: []string{`backing file "/etc/nodepool/clouds.yaml"`}},
		{file: "datafile.qcow2", format: "qcow2", unsafe: []string{`external data file "` + filepath.Join(dir, "host.data") + `"`}},
		{file: "plain.qcow2", format: "raw", unsafe: []string{"claims raw but is qcow2"}},
		{file: "plain.qcow2", format: "vhd", unsafe: []string{"claims vhd but is qcow2"}},
		{file: "plain.qcow2", format: "tar", unsafe: []string{"claims tar but is qcow2"}},
		{file: "backed.qcow2", format: "raw", unsafe: []string{"claims raw but is qcow2"}},
		{file: "split.vmdk", format: "vmdk", unsafe: []string{"vmdk descriptor file", `SPARSE "split-s001.vmdk", SPARSE "split-s002.vmdk"`}},
		{file: "flat.vmdk", format: "vmdk", unsafe: []string{"vmdk descriptor file", `FLAT "flat-flat.vmdk"`}},
		{file: "plain.vmdk", format: "raw", unsafe: []string{"claims raw but is vmdk"}},
	}
	for _, tt := range tests {
		t.Run(tt.file+" as "+tt.format, func(t *testing.T) {
			path := filepath.Join(dir, tt.file)
			_, err := Inspect(context.Background(), qemuImg, path, tt.format)
			if tt.unsafe == nil {
				if err != nil {
					t.Fatalf("Inspect: %v", err)
				}
				return
			}
			if !errors.Is(err, untrusted.ErrUnsafe) {
				t.Fatalf("Inspect error = %v, want untrusted.ErrUnsafe", err)
			}
			for _, want := range append(tt.unsafe, path) {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
		})
	}
}

// TestInspectRelativePath checks that a relative name reaches qemu-img as a file, not as
// an option or a "protocol:" qemu would resolve.
func TestInspectRelativePath(t *testing.T) {
	qemuImg := testenv.RequireBinary(t, "qemu-img")
	dir := t.TempDir()
	qemuImgCreate(t, qemuImg, dir, "-f", "qcow2", "./-x:y.qcow2", "1M")
	t.Chdir(dir)
	if _, err := Inspect(context.Background(), qemuImg, "-x:y.qcow2", "qcow2"); err != nil {
		t.Fatalf("Inspect: %v", err)
	}
}

// fakeQemuImg writes a shell script standing in for qemu-img.
func fakeQemuImg(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "qemu-img")
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestInspectFailures(t *testing.T) {
	img := filepath.Join(t.TempDir(), "img.raw")
	if err := os.WriteFile(img, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		qemuImg string
		path    string
		timeout time.Duration
		want    string
	}{
		{name: "no such program", qemuImg: filepath.Join(t.TempDir(), "missing"), path: img, want: "qemu-img info"},
		{name: "fails", qemuImg: fakeQemuImg(t, "echo 'cannot read image' >&2; exit 1"), path: img, want: "cannot read image"},
		{name: "bad json", qemuImg: fakeQemuImg(t, "echo not json"), path: img, want: "parse output"},
		{name: "no format", qemuImg: fakeQemuImg(t, "echo '{}'"), path: img, want: "names no format"},
		{name: "negative virtual size", qemuImg: fakeQemuImg(t, `echo '{"format": "raw", "virtual-size": -1}'`), path: img, want: "virtual size -1"},
		{name: "hangs", qemuImg: fakeQemuImg(t, "exec sleep 30"), path: img, timeout: 200 * time.Millisecond, want: "deadline exceeded"},
		{name: "no format claimed", qemuImg: "qemu-img", path: img, want: "no format claimed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			if tt.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.timeout)
				defer cancel()
			}
			format := "raw"
			if tt.name == "no format claimed" {
				format = ""
			}
			start := time.Now()
			_, err := Inspect(ctx, tt.qemuImg, tt.path, format)
			if err == nil || errors.Is(err, untrusted.ErrUnsafe) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Inspect error = %v, want an ordinary error saying %q", err, tt.want)
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("Inspect took %s", d)
			}
		})
	}
}

func TestInspectMissingFile(t *testing.T) {
	qemuImg := testenv.RequireBinary(t, "qemu-img")
	_, err := Inspect(context.Background(), qemuImg, filepath.Join(t.TempDir(), "nothing.qcow2"), "qcow2")
	if err == nil || errors.Is(err, untrusted.ErrUnsafe) {
		t.Fatalf("Inspect of a missing file = %v, want an ordinary error", err)
	}
}

// TestInspectLimits checks that qemu-img runs under prlimit's memory and CPU limits.
func TestInspectLimits(t *testing.T) {
	testenv.RequireBinary(t, "prlimit")
	// The stand-in reports its limits in its error.
	qemuImg := fakeQemuImg(t, `echo "as=$(ulimit -v),cpu=$(ulimit -t)" >&2; exit 1`)
	iso := filepath.Join(t.TempDir(), "empty.iso")
	if err := os.WriteFile(iso, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Inspect(context.Background(), qemuImg, iso, "iso")
	if want := "as=1048576,cpu=30"; err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Inspect error = %v, want one saying %q", err, want)
	}
}

// TestInspectVirtualSize: a file of a few hundred KiB can hold a disk of
// terabytes; Inspect reports the disk's size, whatever the format, and CheckSize
// refuses one above the limit, naming both.
func TestInspectVirtualSize(t *testing.T) {
	qemuImg := testenv.RequireBinary(t, "qemu-img")
	dir := t.TempDir()
	create := func(args ...string) { qemuImgCreate(t, qemuImg, dir, args...) }
	create("-f", "qcow2", "huge.qcow2", "8T")
	create("-f", "vpc", "-o", "force_size=on", "huge.vhd", "2000G")
	create("-f", "vmdk", "huge.vmdk", "1T")
	create("-f", "raw", "huge.raw", "2T") // sparse
	create("-f", "qcow2", "small.qcow2", "1M")
	const limit = 1 << 30
	tests := []struct {
		file, format string
		size         int64
		says         string // how CheckSize(limit) names the size; "": within it
	}{
		{"huge.qcow2", "qcow2", 8 << 40, "8.0 TiB (8796093022208 bytes)"},
		{"huge.vhd", "vhd", 2000 << 30, "2.0 TiB (2147483648000 bytes)"},
		{"huge.vmdk", "vmdk", 1 << 40, "1.0 TiB (1099511627776 bytes)"},
		{"huge.raw", "raw", 2 << 40, "2.0 TiB (2199023255552 bytes)"},
		{"small.qcow2", "qcow2", 1 << 20, ""},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			path := filepath.Join(dir, tt.file)
			img, err := Inspect(context.Background(), qemuImg, path, tt.format)
			if err != nil {
				t.Fatalf("Inspect: %v", err)
			}
			if img.VirtualSize != tt.size || img.Path != path || img.Format != tt.format {
				t.Errorf("Inspect = %+v, want %s of format %s with a virtual size of %d", img, path, tt.format, tt.size)
			}
			err = img.CheckSize(limit)
			if tt.says == "" {
				if err != nil {
					t.Errorf("CheckSize(%d) of a disk of %d bytes: %v", int64(limit), img.VirtualSize, err)
				}
				return
			}
			if !errors.Is(err, untrusted.ErrTooLarge) {
				t.Fatalf("CheckSize(%d) = %v, want untrusted.ErrTooLarge", int64(limit), err)
			}
			for _, want := range []string{path, tt.says, "maximum of 1.0 GiB"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
			if err := img.CheckSize(tt.size); err != nil {
				t.Errorf("CheckSize of a disk exactly at the limit: %v", err)
			}
		})
	}
}

func TestCheckSizeDefault(t *testing.T) {
	if err := (Info{VirtualSize: untrusted.DefaultMaxSize}).CheckSize(0); err != nil {
		t.Errorf("a disk of untrusted.DefaultMaxSize with no limit set: %v", err)
	}
	if err := (Info{VirtualSize: untrusted.DefaultMaxSize + 1}).CheckSize(0); !errors.Is(err, untrusted.ErrTooLarge) {
		t.Errorf("a disk above untrusted.DefaultMaxSize with no limit set: %v, want untrusted.ErrTooLarge", err)
	}
}

// recordingQemuImg wraps the real qemu-img in a script that logs each command line to
// the returned file before running it.
func recordingQemuImg(t *testing.T, qemuImg string) (wrapper, log string) {
	t.Helper()
	dir := t.TempDir()
	log = filepath.Join(dir, "calls")
	wrapper = filepath.Join(dir, "qemu-img")
	script := "#!/bin/sh\necho \"$*\" >> '" + log + "'\nexec '" + qemuImg + "' \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return wrapper, log
}

func readCalls(t *testing.T, log string) string {
	t.Helper()
	b, err := os.ReadFile(log)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return string(b)
}

// patch overwrites the file at path with b at off.
func patch(t *testing.T, path string, off int64, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func mkfifo(t *testing.T, path string) {
	t.Helper()
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestInspectRefusesOtherFilesBeforeQemu: a qcow2 with an external data file and a vmdk
// whose extents are other files (a descriptor, a FLAT extent at a FIFO, a sparse file whose
// embedded descriptor qemu would follow) are refused quickly from their headers, before
// qemu-img opens them, so nothing of qemu's reading of other files reaches the error; the
// files that pass are probed with -f the claimed format.
func TestInspectRefusesOtherFilesBeforeQemu(t *testing.T) {
	realQemuImg := testenv.RequireBinary(t, "qemu-img")
	dir := t.TempDir()
	create := func(args ...string) { qemuImgCreate(t, realQemuImg, dir, args...) }
	at := func(name string) string { return filepath.Join(dir, name) }
	create("-f", "qcow2", "plain.qcow2", "1M")
	create("-f", "raw", "plain.raw", "1M")
	create("-f", "vmdk", "plain.vmdk", "1M")
	create("-f", "vmdk", "-o", "subformat=streamOptimized", "stream.vmdk", "1M")
	create("-f", "qcow2", "-o", "data_file="+at("host.data"), "datafile.qcow2", "1M")
	// The data file replaced by a FIFO: a qemu that opens it hangs.
	create("-f", "qcow2", "-o", "data_file="+at("fifo.data"), "fifodata.qcow2", "1M")
	os.Remove(at("fifo.data"))
	mkfifo(t, at("fifo.data"))
	// Only the incompatible-feature bit left: the extension's type overwritten.
	create("-f", "qcow2", "-o", "data_file="+at("bit.data"), "bit.qcow2", "1M")
	patch(t, at("bit.qcow2"), 112, []byte{0x12, 0x34, 0x56, 0x78})
	create("-f", "vmdk", "-o", "subformat=monolithicFlat", "flat.vmdk", "1M")
	create("-f", "vmdk", "-o", "subformat=twoGbMaxExtentFlat", "twoflat.vmdk", "1M")
	create("-f", "vmdk", "-o", "subformat=twoGbMaxExtentSparse", "split.vmdk", "1M")
	mkfifo(t, at("extent.fifo"))
	descriptor := "# Disk DescriptorFile\nversion=1\nCID=fffffffe\nparentCID=ffffffff\ncreateType=\"monolithicFlat\"\n\nRW 2048 FLAT \"" + at("extent.fifo") + "\" 0\n"
	if err := os.WriteFile(at("fifo.vmdk"), []byte(descriptor), 0o644); err != nil {
		t.Fatal(err)
	}
	// A sparse vmdk of capacity 0, whose embedded descriptor names the FIFO.
	create("-f", "vmdk", "zero.vmdk", "1M")
	patch(t, at("zero.vmdk"), 12, make([]byte, 8))
	patch(t, at("zero.vmdk"), 512, append([]byte(descriptor), 0))
	// A sparse vmdk whose embedded descriptor lists a second extent.
	create("-f", "vmdk", "two.vmdk", "1M")
	patch(t, at("two.vmdk"), 512, append([]byte("# Disk DescriptorFile\nversion=1\ncreateType=\"monolithicSparse\"\nRW 2048 SPARSE \"two.vmdk\"\nRW 2048 FLAT \"/etc/passwd\" 0\n"), 0))

	qemuImg, calls := recordingQemuImg(t, realQemuImg)
	tests := []struct {
		file, format string
		unsafe       []string // what the error must name; nil: safe
	}{
		{file: "plain.qcow2", format: "qcow2"},
		{file: "plain.raw", format: "raw"},
		{file: "plain.vmdk", format: "vmdk"},
		{file: "stream.vmdk", format: "vmdk"},
		{file: "datafile.qcow2", format: "qcow2", unsafe: []string{`external data file "` + at("host.data") + `"`}},
		{file: "fifodata.qcow2", format: "qcow2", unsafe: []string{`external data file "` + at("fifo.data") + `"`}},
		{file: "bit.qcow2", format: "qcow2", unsafe: []string{"external data file (the qcow2 incompatible feature bit)"}},
		{file: "flat.vmdk", format: "vmdk", unsafe: []string{`vmdk descriptor file (createType "monolithicFlat")`, `FLAT "flat-flat.vmdk"`}},
		{file: "twoflat.vmdk", format: "vmdk", unsafe: []string{`vmdk descriptor file (createType "twoGbMaxExtentFlat")`, `FLAT "twoflat-f001.vmdk"`}},
		{file: "split.vmdk", format: "vmdk", unsafe: []string{`vmdk descriptor file (createType "twoGbMaxExtentSparse")`, `SPARSE "split-s001.vmdk"`}},
		{file: "fifo.vmdk", format: "vmdk", unsafe: []string{"vmdk descriptor file", `FLAT "` + at("extent.fifo") + `"`}},
		{file: "fifo.vmdk", format: "raw", unsafe: []string{"claims raw but is vmdk"}},
		{file: "zero.vmdk", format: "vmdk", unsafe: []string{"capacity 0", `createType "monolithicFlat"`, `FLAT "` + at("extent.fifo") + `"`}},
		{file: "two.vmdk", format: "vmdk", unsafe: []string{`names 2 extents (SPARSE "two.vmdk", FLAT "/etc/passwd")`}},
		{file: "extent.fifo", format: "raw", unsafe: []string{"not a regular file"}},
	}
	for _, tt := range tests {
		t.Run(tt.file+" as "+tt.format, func(t *testing.T) {
			path := at(tt.file)
			before := readCalls(t, calls)
			start := time.Now()
			_, err := Inspect(context.Background(), qemuImg, path, tt.format)
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("Inspect took %s", d)
			}
			ran := strings.TrimPrefix(readCalls(t, calls), before)
			if tt.unsafe == nil {
				if err != nil {
					t.Fatalf("Inspect: %v", err)
				}
				if want := "info -f " + qemuFormat(tt.format) + " "; !strings.Contains(ran, want) {
					t.Errorf("qemu-img ran as %q, want %q", ran, want)
				}
				return
			}
			if !errors.Is(err, untrusted.ErrUnsafe) {
				t.Fatalf("Inspect error = %v, want untrusted.ErrUnsafe", err)
			}
			for _, want := range append(tt.unsafe, path) {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
			if ran != "" {
				t.Errorf("qemu-img ran on the unsafe file: %q", ran)
			}
		})
	}
}
