package fanout

import (
	"bytes"
	"context"
	"crypto/md5"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"time"
)

// noise returns n pseudo-random bytes, the same for the same n.
func noise(n int) []byte {
	b := make([]byte, n)
	rand.NewChaCha8([32]byte{byte(n)}).Read(b)
	return b
}

// recorder keeps what it is given and counts its Finish calls.
type recorder struct {
	bytes.Buffer
	writes   int
	finished atomic.Int32
}

func (r *recorder) Write(p []byte) (int, error) {
	r.writes++
	return r.Buffer.Write(p)
}

func (r *recorder) Finish() error {
	r.finished.Add(1)
	return nil
}

// checkGoroutines fails the test unless the goroutines started since before have ended
// within a few seconds.
func checkGoroutines(t *testing.T, before int) {
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

func TestCopy(t *testing.T) {
	const size = 4 << 10
	tests := []struct {
		name string
		data []byte
		wrap func(io.Reader) io.Reader
	}{
		{"empty", nil, nil},
		{"one byte", noise(1), nil},
		{"one short chunk", noise(size - 1), nil},
		{"one chunk", noise(size), nil},
		{"one chunk and a byte", noise(size + 1), nil},
		{"many chunks, odd end", noise(37*size + 17), nil},
		{"byte by byte reads", noise(3*size + 5), iotest.OneByteReader},
		{"half reads", noise(9*size + 100), iotest.HalfReader},
		{"data with the last read", noise(5*size + 3), iotest.DataErrReader},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := runtime.NumGoroutine()
			var src io.Reader = bytes.NewReader(tt.data)
			if tt.wrap != nil {
				src = tt.wrap(src)
			}
			ws := []*recorder{{}, {}, {}}
			hs, hm := sha256.New(), md5.New()
			c := Copier{BufferSize: size, Buffers: 3}
			n, err := c.Copy(context.Background(), src, ws[0], hs, ws[1], hm, ws[2])
			if err != nil || n != int64(len(tt.data)) {
				t.Fatalf("Copy = %d, %v; want %d, nil", n, err, len(tt.data))
			}
			for i, w := range ws {
				if !bytes.Equal(w.Bytes(), tt.data) {
					t.Errorf("writer %d got %d bytes that differ from the %d read", i, w.Len(), len(tt.data))
				}
				if wantWrites := (len(tt.data) + size - 1) / size; w.writes != wantWrites {
					t.Errorf("writer %d got %d writes, want %d whole chunks", i, w.writes, wantWrites)
				}
				if f := w.finished.Load(); f != 1 {
					t.Errorf("writer %d finished %d times, want once", i, f)
				}
			}
			wantSHA, wantMD5 := sha256.Sum256(tt.data), md5.Sum(tt.data)
			if !bytes.Equal(hs.Sum(nil), wantSHA[:]) || !bytes.Equal(hm.Sum(nil), wantMD5[:]) {
				t.Errorf("hashes differ from those of the data")
			}
			checkGoroutines(t, before)
		})
	}
}

func TestCopyZeroValueAndNoWriters(t *testing.T) {
	data := noise(3*DefaultBufferSize + 1)
	var w recorder
	if n, err := Copy(context.Background(), bytes.NewReader(data), &w); err != nil || n != int64(len(data)) || !bytes.Equal(w.Bytes(), data) {
		t.Errorf("Copy = %d, %v, %d bytes written; want %d", n, err, w.Len(), len(data))
	}
	if n, err := Copy(context.Background(), bytes.NewReader(data)); err != nil || n != int64(len(data)) {
		t.Errorf("Copy to no writer = %d, %v; want %d, nil", n, err, len(data))
	}
}

// TestCopyMemoryFlat checks that the buffers are allocated once per Copy, not per chunk.
func TestCopyMemoryFlat(t *testing.T) {
	c := Copier{BufferSize: 1 << 10, Buffers: 4}
	allocs := func(size int) float64 {
		data := make([]byte, size)
		return testing.AllocsPerRun(5, func() {
			if _, err := c.Copy(context.Background(), bytes.NewReader(data), io.Discard, io.Discard); err != nil {
				t.Fatal(err)
			}
		})
	}
	small, large := allocs(4<<10), allocs(4<<20)
	t.Logf("%.0f allocations for 4 chunks, %.0f for 4096", small, large)
	if large > small+2 {
		t.Errorf("%.0f allocations for 4 chunks, %.0f for 4096: memory grows with the stream", small, large)
	}
}

// failWriter fails its write number failAt.
type failWriter struct {
	recorder
	failAt int
	err    error
}

func (w *failWriter) Write(p []byte) (int, error) {
	if w.writes+1 == w.failAt {
		w.writes++
		return 0, w.err
	}
	return w.recorder.Write(p)
}

// endless is a reader that never ends; it cancels a context once it has given n bytes.
type endless struct {
	n      int64
	cancel func()
}

func (e *endless) Read(p []byte) (int, error) {
	if e.n -= int64(len(p)); e.n < 0 && e.cancel != nil {
		e.cancel()
		e.cancel = nil
	}
	return len(p), nil
}

// slowWriter takes its time over every chunk, so that the others wait for it.
type slowWriter struct{ recorder }

func (w *slowWriter) Write(p []byte) (int, error) {
	time.Sleep(time.Millisecond)
	return w.recorder.Write(p)
}

func TestCopyErrors(t *testing.T) {
	const size = 4 << 10
	errBoom := errors.New("boom")
	tests := []struct {
		name string
		run  func(ctx context.Context, c Copier) (io.Writer, error)
		want error
		// The failure comes with the last chunk, which the writer returned may have
		// taken and finished by then.
		atEnd bool
	}{
		{
			name: "read error",
			run: func(ctx context.Context, c Copier) (io.Writer, error) {
				w := &recorder{}
				src := io.MultiReader(bytes.NewReader(noise(10*size)), iotest.ErrReader(errBoom))
				_, err := c.Copy(ctx, src, w, &slowWriter{})
				return w, err
			},
			want: errBoom,
		},
		{
			name: "truncated stream",
			run: func(ctx context.Context, c Copier) (io.Writer, error) {
				w := &recorder{}
				src := io.MultiReader(bytes.NewReader(noise(size/2)), iotest.ErrReader(io.ErrUnexpectedEOF))
				_, err := c.Copy(ctx, src, w)
				return w, err
			},
			want: io.ErrUnexpectedEOF,
		},
		{
			name: "write error",
			run: func(ctx context.Context, c Copier) (io.Writer, error) {
				w := &recorder{}
				_, err := c.Copy(ctx, &endless{}, w, &failWriter{failAt: 50, err: errBoom}, &slowWriter{})
				return w, err
			},
			want: errBoom,
		},
		{
			name: "write error on the last chunk",
			run: func(ctx context.Context, c Copier) (io.Writer, error) {
				w := &recorder{}
				_, err := c.Copy(ctx, bytes.NewReader(noise(3*size)), w, &failWriter{failAt: 3, err: errBoom})
				return w, err
			},
			want:  errBoom,
			atEnd: true,
		},
		{
			name: "short write",
			run: func(ctx context.Context, c Copier) (io.Writer, error) {
				w := &recorder{}
				_, err := c.Copy(ctx, &endless{}, w, shortWriter{})
				return w, err
			},
			want: io.ErrShortWrite,
		},
		{
			name: "context cancelled mid-stream",
			run: func(ctx context.Context, c Copier) (io.Writer, error) {
				ctx, cancel := context.WithCancel(ctx)
				defer cancel()
				w := &recorder{}
				_, err := c.Copy(ctx, &endless{n: 100 * size, cancel: cancel}, w, &slowWriter{})
				return w, err
			},
			want: context.Canceled,
		},
		{
			name: "context cancelled before",
			run: func(ctx context.Context, c Copier) (io.Writer, error) {
				ctx, cancel := context.WithCancel(ctx)
				cancel()
				w := &recorder{}
				_, err := c.Copy(ctx, &endless{}, w)
				return w, err
			},
			want: context.Canceled,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := runtime.NumGoroutine()
			done := make(chan struct{})
			var w io.Writer
			var err error
			go func() {
				defer close(done)
				w, err = tt.run(context.Background(), Copier{BufferSize: size, Buffers: 4})
			}()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				buf := make([]byte, 1<<20)
				t.Fatalf("Copy did not return:\n%s", buf[:runtime.Stack(buf, true)])
			}
			if !errors.Is(err, tt.want) {
				t.Fatalf("Copy error = %v, want %v", err, tt.want)
			}
			if f := w.(*recorder).finished.Load(); f != 0 && !tt.atEnd {
				t.Errorf("a writer was finished after an error")
			}
			checkGoroutines(t, before)
		})
	}
}

type shortWriter struct{}

func (shortWriter) Write(p []byte) (int, error) { return len(p) / 2, nil }

// ExampleCopy hashes a stream with sha256 and md5 at once, each on its own core.
func ExampleCopy() {
	hs, hm := sha256.New(), md5.New()
	n, err := Copy(context.Background(), strings.NewReader("hello\n"), hs, hm)
	if err != nil {
		panic(err)
	}
	fmt.Printf("%d bytes\nsha256 %x\nmd5 %x\n", n, hs.Sum(nil), hm.Sum(nil))
	// Output:
	// 6 bytes
	// sha256 5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03
	// md5 b1946ac92492d2347c6235b4d2611184
}
