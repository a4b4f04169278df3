package diskspace

import (
	"errors"
	"strings"
	"syscall"
	"testing"
)

func TestCheck(t *testing.T) {
	const need = 4 << 20
	tests := []struct {
		name    string
		free    func(string) (int64, error)
		noSpace bool
		says    []string // nil: no error
	}{
		{"exactly enough", func(string) (int64, error) { return need, nil }, false, nil},
		{"a byte short", func(string) (int64, error) { return need - 1, nil }, true, []string{"/pretend", "need 4194304 bytes, 4194303 free"}},
		{"cannot tell", func(string) (int64, error) { return 0, syscall.EIO }, false, []string{"check free space in /pretend", "input/output error"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Check("/pretend", need, tt.free)
			if tt.says == nil {
				if err != nil {
					t.Fatalf("Check: %v", err)
				}
				return
			}
			if err == nil || errors.Is(err, ErrNoSpace) != tt.noSpace {
				t.Fatalf("Check = %v, want an error that wraps ErrNoSpace: %v", err, tt.noSpace)
			}
			for _, want := range tt.says {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
		})
	}
}

// TestCheckFree: with no pretend filesystem, Check asks the real one, which has
// room for 0 bytes and none for 4 EiB.
func TestCheckFree(t *testing.T) {
	dir := t.TempDir()
	have, err := Free(dir)
	if err != nil || have <= 0 {
		t.Fatalf("Free(%s) = %d, %v", dir, have, err)
	}
	if err := Check(dir, 0, nil); err != nil {
		t.Errorf("Check of 0 bytes: %v", err)
	}
	if err := Check(dir, 1<<62, nil); !errors.Is(err, ErrNoSpace) {
		t.Errorf("Check of 4 EiB = %v, want ErrNoSpace", err)
	}
}

// TestClass: the metrics count ErrNoSpace, however wrapped, as "space".
func TestClass(t *testing.T) {
	var classed interface{ FailureClass() string }
	if err := Check("/pretend", 1, func(string) (int64, error) { return 0, nil }); !errors.As(err, &classed) || classed.FailureClass() != "space" {
		t.Errorf("Check error %v does not say its class is space", err)
	}
}
