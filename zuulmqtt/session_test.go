package zuulmqtt

import (
	"errors"
	"testing"
)

func TestRedactPassword(t *testing.T) {
	for _, tc := range []struct {
		name, err, password, want string
	}{
		{"no password", "connect: refused", "", "connect: refused"},
		{"not quoted", "connect: refused", "s3cret", "connect: refused"},
		{"quoted twice", "login s3cret refused: s3cret", "s3cret", "login REDACTED refused: REDACTED"},
		{"too short to tell", "abc refused", "abc", "abc refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := redactPassword(errors.New(tc.err), tc.password)
			if got.Error() != tc.want {
				t.Errorf("redactPassword(%q) = %q, want %q", tc.err, got, tc.want)
			}
		})
	}
	if redactPassword(nil, "s3cret") != nil {
		t.Error("redactPassword(nil) is not nil")
	}
	wrapped := errors.New("x")
	if got := redactPassword(wrapped, "s3cret"); got != wrapped {
		t.Error("redactPassword replaced an error that does not quote the password: errors.Is no longer sees through it")
	}
}

func TestRefusedTopic(t *testing.T) {
	for _, tc := range []struct {
		name  string
		codes map[string]byte
		want  string
	}{
		{"none", nil, ""},
		{"granted", map[string]byte{"zuul/#": 0, "other": 1}, ""},
		{"refused", map[string]byte{"zuul/#": 0, "secret/#": 0x80}, "secret/#"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, refused := refusedTopic(tc.codes)
			if got != tc.want || refused != (tc.want != "") {
				t.Errorf("refusedTopic(%v) = %q, %v; want %q", tc.codes, got, refused, tc.want)
			}
		})
	}
}
