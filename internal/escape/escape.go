// Package escape makes text that came from outside (Zuul's answers, cloud image
// names, the shared state) safe to print: what a terminal would act on is shown.
package escape

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Controls returns s with everything that is not printable written as a Go
// escape: newline, carriage return and tab as \n, \r and \t, other control and
// format characters (escape sequences, C1 controls, bidirectional overrides) as
// \x1b, \u009b or \u202e, and bytes that are not UTF-8 as \xff. A terminal shows
// the result as it is: nothing in it moves the cursor, clears the screen or
// starts a line. Backslashes are left as they are, so plain text reads the same.
func Controls(s string) string {
	if printable(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < utf8.RuneSelf && !strconv.IsPrint(r):
			fmt.Fprintf(&b, `\x%02x`, r)
		case !strconv.IsPrint(r):
			if r > 0xffff {
				fmt.Fprintf(&b, `\U%08x`, r)
			} else {
				fmt.Fprintf(&b, `\u%04x`, r)
			}
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// printable tells whether s has nothing to escape, without allocating.
func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < ' ' || c > '~' {
			return !strings.ContainsFunc(s, func(r rune) bool { return !strconv.IsPrint(r) }) && utf8.ValidString(s)
		}
	}
	return true
}
