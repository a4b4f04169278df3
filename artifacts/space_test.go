package artifacts

import (
	"errors"
	"strings"
	"testing"

	"github.com/nodepool-builder/nodepool-builder/internal/diskspace"
)

func TestRoomNeed(t *testing.T) {
	const mib = 1 << 20
	tests := []struct {
		name string
		r    room
		want int64
	}{
		{"plain, known", room{served: 100 * mib}, 100 * mib},
		{"plain, half fed", room{served: 100 * mib, fed: 40 * mib}, 60 * mib},
		{"plain, resumed", room{served: 100 * mib, prefix: 70 * mib}, 30 * mib},
		// Re-reading the prefix writes nothing: what is left is still what lies beyond it.
		{"plain, re-reading the prefix", room{served: 100 * mib, prefix: 70 * mib, fed: 10 * mib}, 30 * mib},
		{"plain, unknown", room{served: -1}, spaceFloor},
		{"plain, unknown, well along", room{served: -1, fed: 10 << 30}, spaceFloor},
		{"compressed, image known", room{compressed: true, served: 10 * mib, image: 100 * mib, fed: 5 * mib, wrote: 50 * mib}, 5*mib + 50*mib},
		{"compressed, image known, length unknown", room{compressed: true, served: -1, image: 1000 * mib}, 1000 * mib},
		{"compressed, image known, length unknown, near the end", room{compressed: true, served: -1, image: 1000 * mib, wrote: 999 * mib}, spaceFloor},
		{"compressed, image estimated", room{compressed: true, served: 1000 * mib, image: -1}, 2000 * mib},
		{"compressed, small, image estimated", room{compressed: true, served: 10 * mib, image: -1}, spaceFloor},
		{"compressed, nothing known", room{compressed: true, served: -1, image: -1}, spaceFloor},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.r.need(); got != tt.want {
				t.Errorf("need() = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestRoomChecksEvery64MiB(t *testing.T) {
	free := int64(1 << 30)
	calls := 0
	r := &room{dir: "/pretend", served: -1, image: -1, free: func(string) (int64, error) {
		calls++
		return free, nil
	}}
	if err := r.check(); err != nil || calls != 1 {
		t.Fatalf("check: %v after %d calls", err, calls)
	}
	for range 63 {
		if err := r.progress(1<<20, 0); err != nil {
			t.Fatal(err)
		}
	}
	if calls != 1 {
		t.Fatalf("free space checked %d times in 63 MiB", calls)
	}
	free = spaceFloor - 1
	err := r.progress(0, 1<<20)
	if calls != 2 || !errors.Is(err, diskspace.ErrNoSpace) {
		t.Fatalf("after 64 MiB: %d checks, error %v; want a second check failing with diskspace.ErrNoSpace", calls, err)
	}
	if !strings.Contains(err.Error(), "/pretend") || !strings.Contains(err.Error(), "need 268435456 bytes") {
		t.Errorf("error %q does not name the directory and the bytes needed", err)
	}
}
