package testenv

import (
	"syscall"
	"testing"
)

// HugerThanFree returns a disk size, 8 TiB or a larger power of two, that is
// more than the filesystem of dir has free: the virtual size of a sparse image
// whose conversion must be refused for want of room, on any machine.
func HugerThanFree(t testing.TB, dir string) int64 {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatalf("free space of %s: %v", dir, err)
	}
	free := int64(st.Bavail) * st.Bsize
	size := int64(8 << 40)
	for size <= free {
		size *= 2
	}
	return size
}
