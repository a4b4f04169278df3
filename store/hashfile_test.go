package store

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/testenv"
)

func TestHashFile(t *testing.T) {
	dir := t.TempDir()
	for _, size := range []int{0, 1, 256<<10 - 1, 256 << 10, 5<<20 + 12345} {
		path := filepath.Join(dir, "file")
		data := make([]byte, size)
		rand.NewChaCha8([32]byte{byte(size)}).Read(data[:size/2]) // and zeros after
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		sha, md, n, err := HashFile(context.Background(), path)
		if err != nil {
			t.Fatalf("HashFile of %d bytes: %v", size, err)
		}
		if want := testenv.ToolSum(t, "sha256sum", path); sha != want {
			t.Errorf("%d bytes: sha256 %s, sha256sum says %s", size, sha, want)
		}
		if want := testenv.ToolSum(t, "md5sum", path); md != want {
			t.Errorf("%d bytes: md5 %s, md5sum says %s", size, md, want)
		}
		if n != int64(size) {
			t.Errorf("HashFile size = %d, want %d", n, size)
		}
	}
	missing := filepath.Join(dir, "missing")
	if _, _, _, err := HashFile(context.Background(), missing); !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), missing) {
		t.Errorf("HashFile of a missing file: %v, want an error naming it", err)
	}
	if _, _, _, err := HashFile(context.Background(), dir); err == nil || !strings.Contains(err.Error(), dir) {
		t.Errorf("HashFile of a directory: %v, want a read error naming it", err)
	}
}

// TestHashFileStopsOnCancel: hashing an image of a terabyte takes hours; a
// builder told to stop must not wait for it.
func TestHashFileStopsOnCancel(t *testing.T) {
	path := filepath.Join(t.TempDir(), "huge.raw")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	// Sparse: a terabyte of holes that read as zeros, far more than a test can hash.
	if err := f.Truncate(1 << 40); err != nil {
		t.Skipf("this filesystem takes no sparse file of 1 TiB: %v", err)
	}
	f.Close()

	// hashCancelled runs HashFile with a context that after cancels, and checks that
	// it returns context.Canceled, naming the file, promptly once it is cancelled.
	hashCancelled := func(t *testing.T, after time.Duration) {
		const promptly = 10 * time.Second
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		cancelled := make(chan time.Time, 1)
		timer := time.AfterFunc(after, func() {
			cancelled <- time.Now()
			cancel()
		})
		defer timer.Stop()
		done := make(chan error, 1)
		go func() {
			_, _, n, err := HashFile(ctx, path)
			if err == nil {
				err = errors.New("hashed all " + strconv.FormatInt(n, 10) + " bytes")
			}
			done <- err
		}()
		at := <-cancelled
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), path) {
				t.Fatalf("HashFile: %v, want context.Canceled naming the file", err)
			}
			if took := time.Since(at); took > promptly {
				t.Errorf("HashFile returned %s after its context was cancelled", took)
			}
		case <-time.After(promptly):
			t.Fatalf("HashFile of 1 TiB still running %s after its context was cancelled", promptly)
		}
	}
	t.Run("cancelled before", func(t *testing.T) { hashCancelled(t, 0) })
	// Whenever the cancel comes, the hash is far from done: what counts is how
	// long HashFile takes to return once it has.
	t.Run("cancelled while hashing", func(t *testing.T) { hashCancelled(t, 200*time.Millisecond) })
}
