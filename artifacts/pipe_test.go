package artifacts

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
	"github.com/nodepool-builder/nodepool-builder/internal/untrusted"
)

// allocated returns the bytes the filesystem holds for the file at path.
func allocated(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Blocks * 512
}

// requireHoles skips the test when dir's filesystem does not keep holes in files.
func requireHoles(t *testing.T, dir string) {
	t.Helper()
	path := filepath.Join(dir, "hole-probe")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, 16<<20); err != nil {
		t.Fatal(err)
	}
	if a := allocated(t, path); a >= 16<<20 {
		testenv.Unavailable(t, "the filesystem of %s does not keep holes (%d bytes allocated for an empty 16 MiB file)", dir, a)
	}
	os.Remove(path)
}

func TestSparseWriter(t *testing.T) {
	dir := t.TempDir()
	requireHoles(t, dir)
	const size = 4<<20 + 100 // ends in a partial block
	data := make([]byte, size)
	copy(data[100:], "data in the first block")
	copy(data[sparseBlock*5-3:], "across a block boundary")
	copy(data[2<<20:], testImage(sparseBlock*3))
	data[size-1] = 1

	tests := []struct {
		name  string
		data  []byte
		chunk int // bytes per Write
	}{
		{"byte by byte", data[:3*sparseBlock+5], 1},
		{"odd chunks", data, 4093},
		{"block sized chunks", data, sparseBlock},
		{"large unaligned chunks", data, 3*sparseBlock + 17},
		{"one write", data, len(data)},
		{"zeros to the end", make([]byte, 3<<20+7), 100000},
		{"empty", nil, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, tt.name)
			f, err := os.Create(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			w := newSparseWriter(f)
			for p := tt.data; len(p) > 0; {
				n := min(tt.chunk, len(p))
				if m, err := w.Write(p[:n]); err != nil || m != n {
					t.Fatalf("Write(%d bytes) = %d, %v", n, m, err)
				}
				p = p[n:]
			}
			if err := w.finish(); err != nil {
				t.Fatalf("finish: %v", err)
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, tt.data) {
				t.Fatalf("file has %d bytes that differ from the %d written", len(got), len(tt.data))
			}
			// Data lies in at most a few blocks; the rest must be holes.
			nonZero := int64(0)
			for off := 0; off < len(tt.data); off += sparseBlock {
				b := tt.data[off:min(off+sparseBlock, len(tt.data))]
				if !bytes.Equal(b, make([]byte, len(b))) {
					nonZero += sparseBlock
				}
			}
			if a := allocated(t, path); a > nonZero+sparseBlock {
				t.Errorf("%d bytes allocated for %d bytes in non-zero blocks", a, nonZero)
			}
		})
	}
}

// pipeDownload returns a download of a file compressed with comp whose bytes as served
// are already on disk, as after a complete transfer, and the room of an attempt over it.
func pipeDownload(t *testing.T, comp string, served []byte) (*download, *room) {
	t.Helper()
	f := testFetcher(t)
	if err := os.MkdirAll(partialDir(f), 0o755); err != nil {
		t.Fatal(err)
	}
	d := &download{
		f:       f,
		dlPath:  filepath.Join(partialDir(f), "img.raw.download"),
		outPath: filepath.Join(partialDir(f), "img.raw"),
		comp:    comp,
		limit:   untrusted.DefaultMaxSize,
		bound:   "the maximum",
	}
	if err := os.WriteFile(d.dlPath, served, 0o644); err != nil {
		t.Fatal(err)
	}
	return d, d.room(int64(len(served)), 0)
}

// pipeFrom runs d.pipe over the served bytes, the first prefix of them from the file on
// disk and the rest from a network stream.
func pipeFrom(ctx context.Context, d *download, rm *room, served []byte, prefix int) (sums, error) {
	if prefix == len(served) {
		return d.pipe(ctx, int64(prefix), nil, func() {}, rm)
	}
	pr, pw := io.Pipe()
	fed := make(chan struct{})
	go func() {
		defer close(fed)
		if _, err := pw.Write(served[prefix:]); err != nil {
			return
		}
		pw.Close()
	}()
	s, err := d.pipe(ctx, int64(prefix), pr, func() {}, rm)
	<-fed
	return s, err
}

// sparseImage returns size bytes of zeros with a little data here and there, as an
// unused disk image has, ending in a long run of zeros.
func sparseImage(size int) []byte {
	b := make([]byte, size)
	copy(b, testImage(300<<10))
	copy(b[size/3+5:], testImage(70<<10))
	b[size/2] = 1
	return b
}

func TestPipe(t *testing.T) {
	dir := t.TempDir()
	requireHoles(t, dir)
	images := []struct {
		name   string
		data   []byte
		sparse bool
	}{
		{"empty", nil, false},
		{"one byte", []byte{7}, false},
		{"one buffer", testImage(copyBufferSize), false},
		{"odd size", testImage(3*copyBufferSize + 12345), false},
		{"long zero runs", sparseImage(48<<20 + 4321), true},
	}
	for _, comp := range []string{"", "zst", "gz"} {
		for _, img := range images {
			for _, from := range []string{"disk", "network"} {
				t.Run(fmt.Sprintf("%s/comp=%s/from %s", img.name, comp, from), func(t *testing.T) {
					before := runtime.NumGoroutine()
					served := compress(t, comp, img.data)
					d, rm := pipeDownload(t, comp, served)
					prefix := len(served)
					if from == "network" {
						prefix /= 2
					}
					s, err := pipeFrom(context.Background(), d, rm, served, prefix)
					if err != nil {
						t.Fatalf("pipe: %v", err)
					}
					if s.size != int64(len(img.data)) || s.fed != int64(len(served)) {
						t.Errorf("pipe = %+v, want size %d fed %d", s, len(img.data), len(served))
					}
					out := d.outPath
					if comp == "" {
						out = d.dlPath // the download is the image
					}
					got, err := os.ReadFile(out)
					if err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(got, img.data) {
						t.Fatalf("output has %d bytes that differ from the %d of the image", len(got), len(img.data))
					}
					if want := testenv.ToolSum(t, "sha256sum", out); s.sha256 != want {
						t.Errorf("sha256 = %s, sha256sum says %s", s.sha256, want)
					}
					if want := testenv.ToolSum(t, "md5sum", out); s.md5 != want {
						t.Errorf("md5 = %s, md5sum says %s", s.md5, want)
					}
					if img.sparse && comp != "" {
						if a := allocated(t, out); a > int64(len(img.data))/8 {
							t.Errorf("%d bytes allocated for a %d-byte image of about 400 KiB of data: not sparse", a, len(img.data))
						}
					}
					checkGoroutinesEnd(t, before)
				})
			}
		}
	}
}

// fedForever writes an endless image, compressed with comp, into pw until the pipe is
// closed, and closes done then.
func fedForever(t *testing.T, comp string, pw *io.PipeWriter, done chan<- struct{}) {
	defer close(done)
	var w io.Writer = pw
	switch comp {
	case "zst":
		zw, err := zstd.NewWriter(pw, zstd.WithEncoderConcurrency(1))
		if err != nil {
			t.Error(err)
			return
		}
		defer zw.Close()
		w = zw
	case "gz":
		zw := gzip.NewWriter(pw)
		defer zw.Close()
		w = zw
	}
	block := testImage(64 << 10)
	for {
		if _, err := w.Write(block); err != nil {
			return
		}
	}
}

// checkGoroutinesEnd fails the test unless the goroutines started since before have
// ended within a few seconds.
func checkGoroutinesEnd(t *testing.T, before int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines left running, %d before:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
		}
		runtime.Gosched()
	}
}

// errorsFromPipe runs d.pipe in its own goroutine and fails the test when it does not
// return within a deadline.
func errorsFromPipe(t *testing.T, run func() error) error {
	t.Helper()
	errc := make(chan error, 1)
	go func() { errc <- run() }()
	select {
	case err := <-errc:
		return err
	case <-time.After(20 * time.Second):
		buf := make([]byte, 1<<20)
		t.Fatalf("pipe did not return:\n%s", buf[:runtime.Stack(buf, true)])
	}
	return nil
}

func TestPipeErrors(t *testing.T) {
	if _, err := os.Stat("/dev/full"); err != nil {
		testenv.Unavailable(t, "no /dev/full: %v", err)
	}
	image := testImage(4 * copyBufferSize)
	for _, comp := range []string{"zst", "gz"} {
		for _, resumed := range []bool{false, true} {
			t.Run(fmt.Sprintf("corrupt stream/comp=%s/resumed=%v", comp, resumed), func(t *testing.T) {
				before := runtime.NumGoroutine()
				served := compress(t, comp, image)
				// Damage the middle of the stream, past any header.
				for i := len(served) / 3; i < len(served)/3+4096; i++ {
					served[i] ^= 0x5a
				}
				d, rm := pipeDownload(t, comp, served)
				prefix := 0
				if resumed {
					prefix = len(served) / 4
				}
				err := errorsFromPipe(t, func() error {
					_, err := pipeFrom(context.Background(), d, rm, served, prefix)
					return err
				})
				var de *decodeError
				if !errors.As(err, &de) || de.resumed != resumed {
					t.Fatalf("pipe error = %#v, want a decodeError with resumed %v", err, resumed)
				}
				checkGoroutinesEnd(t, before)
			})
		}
		t.Run("write error/comp="+comp, func(t *testing.T) {
			before := runtime.NumGoroutine()
			served := compress(t, comp, image)
			d, rm := pipeDownload(t, comp, served)
			if err := os.Symlink("/dev/full", d.outPath); err != nil {
				t.Fatal(err)
			}
			err := errorsFromPipe(t, func() error {
				_, err := pipeFrom(context.Background(), d, rm, served, len(served)/2)
				return err
			})
			if !errors.Is(err, syscall.ENOSPC) || errors.As(err, new(*decodeError)) || !strings.Contains(err.Error(), "write decompressed output") {
				t.Fatalf("pipe error = %v, want a write error wrapping ENOSPC", err)
			}
			checkGoroutinesEnd(t, before)
		})
	}
	for _, comp := range []string{"", "zst", "gz"} {
		t.Run("cancelled mid-stream/comp="+comp, func(t *testing.T) {
			before := runtime.NumGoroutine()
			d, _ := pipeDownload(t, comp, nil)
			rm := d.room(0, -1)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			pr, pw := io.Pipe()
			fed := make(chan struct{})
			go fedForever(t, comp, pw, fed)
			var fedBytes atomic.Int64
			touch := func() {
				// Cancel once the stream is well under way.
				if fedBytes.Add(1) == 200 {
					cancel()
				}
			}
			err := errorsFromPipe(t, func() error {
				_, err := d.pipe(ctx, 0, pr, touch, rm)
				return err
			})
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("pipe error = %v, want context.Canceled", err)
			}
			<-fed
			checkGoroutinesEnd(t, before)
		})
	}
}
