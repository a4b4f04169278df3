package untrusted

import (
	"errors"
	"fmt"
	"testing"
)

// TestClass: the metrics count both refusals, however wrapped, as "refused", and
// tell them apart from each other.
func TestClass(t *testing.T) {
	for _, sentinel := range []error{ErrUnsafe, ErrTooLarge} {
		err := fmt.Errorf("inspect img.qcow2: %w: backing file", sentinel)
		var classed interface{ FailureClass() string }
		if !errors.As(err, &classed) || classed.FailureClass() != "refused" {
			t.Errorf("%v does not say its class is refused", err)
		}
	}
	if errors.Is(ErrUnsafe, ErrTooLarge) || errors.Is(ErrTooLarge, ErrUnsafe) {
		t.Error("ErrUnsafe and ErrTooLarge are one error")
	}
}

func TestCanonicalFormat(t *testing.T) {
	for in, want := range map[string]string{"qcow": "qcow2", " QCOW2 ": "qcow2", "qcow2": "qcow2", "VHD": "vhd", "raw\n": "raw", "": ""} {
		if got := CanonicalFormat(in); got != want {
			t.Errorf("CanonicalFormat(%q) = %q, want %q", in, got, want)
		}
	}
}
