package redact

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"testing"
)

func TestURL(t *testing.T) {
	tests := []struct{ in, want string }{
		{"https://example.com/img.qcow2", "https://example.com/img.qcow2"},
		{"https://example.com/img.qcow2?X-Amz-Signature=abc&X-Amz-Credential=k", "https://example.com/img.qcow2?REDACTED"},
		{"https://user:pass@example.com:8443/a/b?sig=1#frag", "https://example.com:8443/a/b?REDACTED#frag"},
		{"http://token@example.com/a", "http://example.com/a"},
		{"https://example.com/a?", "https://example.com/a?"},
		{"https://example.com/a%20b?x=1", "https://example.com/a%20b?REDACTED"},
		{"/relative/path?temp_url_sig=abc", "/relative/path?REDACTED"},
		{"", ""},
		// Bad escapes do not parse: the query goes anyway, and so does userinfo.
		{"https://example.com/%zz?sig=abc", "https://example.com/%zz?REDACTED"},
		{"https://user:pass@example.com/%zz", "https://example.com/%zz"},
		{"https://u:p@h/%zz?a@b", "https://h/%zz?REDACTED"},
		{"not a url %zz ? secret", "not a url %zz ?REDACTED"},
	}
	for _, tt := range tests {
		if got := URL(tt.in); got != tt.want {
			t.Errorf("URL(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestText(t *testing.T) {
	tests := []struct{ in, want string }{
		{"no url here", "no url here"},
		{`Get "https://h/p?sig=abc": dial tcp 127.0.0.1:1: connect: connection refused`,
			`Get "https://h/p?REDACTED": dial tcp 127.0.0.1:1: connect: connection refused`},
		{"download k from https://h/p?sig=abc: gave up after 3 attempts",
			"download k from https://h/p?REDACTED: gave up after 3 attempts"},
		{"two: http://a/x?s=1 and HTTPS://u:p@b/y?t=2.", "two: http://a/x?REDACTED and https://b/y?REDACTED."},
		{"url=https://h/p?s=1\nnext line", "url=https://h/p?REDACTED\nnext line"},
		{"(see <https://h/p?s=1>)", "(see <https://h/p?REDACTED>)"},
		{"ftp://u:p@h/x?s=1 is not ours", "ftp://u:p@h/x?s=1 is not ours"},
		{"ünïcödé before https://h/?s=1 after", "ünïcödé before https://h/?REDACTED after"},
		{"ends with https://", "ends with https://"},
	}
	for _, tt := range tests {
		if got := Text(tt.in); got != tt.want {
			t.Errorf("Text(%q) =\n  %q, want\n  %q", tt.in, got, tt.want)
		}
	}
}

func TestError(t *testing.T) {
	if Error(nil) != nil {
		t.Fatal("Error(nil) is not nil")
	}
	inner := fmt.Errorf(`Get "https://h/p?sig=topsecret": %w`, fs.ErrNotExist)
	err := Error(inner)
	if strings.Contains(err.Error(), "topsecret") {
		t.Errorf("message %q carries the secret", err)
	}
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("errors.Is lost the wrapped error")
	}
	wrapped := fmt.Errorf("outer: %w", err)
	if strings.Contains(wrapped.Error(), "topsecret") || !errors.Is(wrapped, fs.ErrNotExist) {
		t.Errorf("wrapping the redacted error: %q", wrapped)
	}
	if Error(err) != err {
		t.Errorf("redacting twice wraps twice")
	}
}
