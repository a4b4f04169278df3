package benchkit

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
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
