package follow

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
)

// readAll reads r to its end on a goroutine of its own.
func readAll(r io.Reader) <-chan result {
	ch := make(chan result, 1)
	go func() {
		b, err := io.ReadAll(r)
		ch <- result{b, err}
	}()
	return ch
}

type result struct {
	data []byte
	err  error
}

// reached waits until a reader has read n bytes.
func reached(t *testing.T, r *Reader, n int64) {
	t.Helper()
	testenv.WaitFor(t, 10*time.Second, fmt.Sprintf("the reader at %d bytes", n), func() bool { return r.pos.Load() == n },
		func() string { return fmt.Sprintf("it is at %d", r.pos.Load()) })
}

func TestReadersFollowTheWriterAndWaitForRelease(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "image")
	data := bytes.Repeat([]byte("0123456789abcdef"), 3*HoldBack/16)
	if err := os.WriteFile(path, data[:HoldBack*2], 0o644); err != nil {
		t.Fatal(err)
	}
	f := New()
	defer f.Close()
	r1, r2 := f.NewReader(t.Context()), f.NewReader(t.Context())
	got1, got2 := readAll(r1), readAll(r2)
	if err := f.Start(path, HoldBack*2); err != nil {
		t.Fatal(err)
	}
	// All but the held-back end of what is written.
	reached(t, r1, HoldBack)
	reached(t, r2, HoldBack)
	// The rest is written, and then a hole the file does not reach yet.
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	f.Written(int64(len(data)) + 100)
	reached(t, r1, int64(len(data))+100-HoldBack)
	select {
	case <-got1:
		t.Fatal("a reader ended before the file was released")
	default:
	}
	if err := f.Release(int64(len(data)) + 100); err != nil {
		t.Fatal(err)
	}
	want := append(bytes.Clone(data), make([]byte, 100)...)
	for _, ch := range []<-chan result{got1, got2} {
		res := <-ch
		if res.err != nil || !bytes.Equal(res.data, want) {
			t.Fatalf("read %d bytes, %v; want the %d bytes written and the hole as zeros", len(res.data), res.err, len(want))
		}
	}
	// A reader that starts after the release reads it all at once.
	if b, err := io.ReadAll(f.NewReader(t.Context())); err != nil || !bytes.Equal(b, want) {
		t.Fatalf("a late reader read %d bytes, %v", len(b), err)
	}
}

func TestAFailedFileFailsItsReaders(t *testing.T) {
	path := filepath.Join(t.TempDir(), "image")
	if err := os.WriteFile(path, make([]byte, 3*HoldBack), 0o644); err != nil {
		t.Fatal(err)
	}
	f := New()
	defer f.Close()
	r := f.NewReader(t.Context())
	got := readAll(r)
	if err := f.Start(path, 3*HoldBack); err != nil {
		t.Fatal(err)
	}
	reached(t, r, 2*HoldBack)
	bad := errors.New("sha256 mismatch")
	f.Fail(bad)
	if res := <-got; !errors.Is(res.err, bad) {
		t.Fatalf("a reader of a failed file ended with %v; want its failure", res.err)
	}
	if err := f.Release(3 * HoldBack); !errors.Is(err, bad) {
		t.Fatalf("releasing a failed file: %v; want its failure", err)
	}
}

// A write that starts over in a new file (a download whose decompressed
// output is rebuilt) goes on for the readers from where they are.
func TestAWriteThatStartsOver(t *testing.T) {
	dir := t.TempDir()
	data := bytes.Repeat([]byte{1, 2, 3, 4, 5, 6, 7}, HoldBack)
	first, second := filepath.Join(dir, "first"), filepath.Join(dir, "second")
	if err := os.WriteFile(first, data[:3*HoldBack], 0o644); err != nil {
		t.Fatal(err)
	}
	f := New()
	defer f.Close()
	r := f.NewReader(t.Context())
	got := readAll(r)
	if err := f.Start(first, 3*HoldBack); err != nil {
		t.Fatal(err)
	}
	reached(t, r, 2*HoldBack)
	if err := os.Remove(first); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(second, data[:HoldBack], 0o644); err != nil {
		t.Fatal(err)
	}
	if err := f.Start(second, HoldBack); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(second, data, 0o644); err != nil {
		t.Fatal(err)
	}
	f.Written(int64(len(data)))
	if err := f.Release(int64(len(data))); err != nil {
		t.Fatal(err)
	}
	if res := <-got; res.err != nil || !bytes.Equal(res.data, data) {
		t.Fatalf("read %d bytes, %v; want the %d bytes of the file", len(res.data), res.err, len(data))
	}
}

func TestAReaderEndsWithItsContext(t *testing.T) {
	f := New()
	defer f.Close()
	ctx, cancel := context.WithCancel(t.Context())
	got := readAll(f.NewReader(ctx))
	cancel()
	if res := <-got; !errors.Is(res.err, context.Canceled) {
		t.Fatalf("a reader whose context ended: %v; want context.Canceled", res.err)
	}
}

func TestSeekSendsAgainFromTheStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "image")
	data := bytes.Repeat([]byte{9}, 2*HoldBack)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	f := New()
	defer f.Close()
	if err := f.Start(path, int64(len(data))); err != nil {
		t.Fatal(err)
	}
	if err := f.Release(int64(len(data))); err != nil {
		t.Fatal(err)
	}
	r := f.NewReader(t.Context())
	if _, err := io.ReadAll(r); err != nil {
		t.Fatal(err)
	}
	if n, err := r.Seek(0, io.SeekStart); err != nil || n != 0 {
		t.Fatalf("seek: %d, %v", n, err)
	}
	if b, err := io.ReadAll(r); err != nil || !bytes.Equal(b, data) {
		t.Fatalf("read again: %d bytes, %v", len(b), err)
	}
	if _, err := r.Seek(0, io.SeekEnd); err == nil {
		t.Fatal("seek from the end of a followed file: no error")
	}
}
