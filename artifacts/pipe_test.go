package artifacts

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"
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
		t.Skipf("the filesystem of %s does not keep holes (%d bytes allocated for an empty 16 MiB file)", dir, a)
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
