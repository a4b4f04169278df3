package store

import (
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
		sha, md, n, err := HashFile(path)
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
	if _, _, _, err := HashFile(missing); !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), missing) {
		t.Errorf("HashFile of a missing file: %v, want an error naming it", err)
	}
	if _, _, _, err := HashFile(dir); err == nil || !strings.Contains(err.Error(), dir) {
		t.Errorf("HashFile of a directory: %v, want a read error naming it", err)
	}
}
