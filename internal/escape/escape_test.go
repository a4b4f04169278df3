package escape

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestControls(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", ""},
		{"debian-0f3c e1 (ready)", "debian-0f3c e1 (ready)"},
		{`C:\path "quoted"`, `C:\path "quoted"`},
		{"Grüße, 日本語, ✓ and \ufffd", "Grüße, 日本語, ✓ and \ufffd"},
		{"a\x1b[2J\nforged", `a\x1b[2J\nforged`},
		{"cr\rtab\tnul\x00del\x7f", `cr\rtab\tnul\x00del\x7f`},
		{"c1 \u009b31m csi", `c1 \u009b31m csi`},
		{"bidi \u202eevil\u202c", `bidi \u202eevil\u202c`},
		{"bad \x9b[2J byte \xff", `bad \x9b[2J byte \xff`},
		{"tag \U000E0041", `tag \U000e0041`},
	}
	for _, tt := range tests {
		if got := Controls(tt.in); got != tt.want {
			t.Errorf("Controls(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// TestControlsLeavesNothingToAct: whatever the input, the output holds no byte
// below space, no DEL, no C1 control and is valid UTF-8; escaping twice changes
// nothing.
func TestControlsLeavesNothingToAct(t *testing.T) {
	var all strings.Builder
	for c := range 256 {
		all.WriteByte(byte(c))
	}
	for r := rune(0x80); r < 0x3000; r++ {
		all.WriteRune(r)
	}
	got := Controls(all.String())
	if !utf8.ValidString(got) {
		t.Fatal("output is not UTF-8")
	}
	for i, r := range got {
		if r < ' ' || r == 0x7f || (r >= 0x80 && r < 0xa0) || r == 0x202e {
			t.Fatalf("output holds %U at %d", r, i)
		}
	}
	if again := Controls(got); again != got {
		t.Fatal("escaping an escaped text changed it")
	}
}
