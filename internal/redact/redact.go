// Package redact removes secrets (userinfo, signed query strings) from URLs and from the
// free text of errors and log lines that carry URLs, before they reach a log or the state.
package redact

import (
	"net/url"
	"strings"
)

// placeholder stands in for a removed query string.
const placeholder = "REDACTED"

// URL returns raw without its userinfo and with a non-empty query replaced by
// "?REDACTED"; the rest is left as it is. A string that does not parse as a URL loses
// everything after its first '?' (and anything that looks like userinfo), since it may
// still be a signed address that merely has a bad escape in it.
func URL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return fallback(raw)
	}
	if u.User == nil && u.RawQuery == "" {
		return raw // nothing secret: keep the exact spelling
	}
	u.User = nil
	if u.RawQuery != "" {
		u.RawQuery = placeholder
	}
	return u.String()
}

// fallback redacts a string url.Parse rejects by hand.
func fallback(raw string) string {
	if i := strings.IndexByte(raw, '?'); i >= 0 {
		raw = raw[:i] + "?" + placeholder
	}
	// "scheme://user:pass@host/...": drop what lies between "//" and an '@' before the path.
	if i := strings.Index(raw, "//"); i >= 0 {
		authority := raw[i+2:]
		if end := strings.IndexAny(authority, "/?#"); end >= 0 {
			authority = authority[:end]
		}
		if at := strings.LastIndexByte(authority, '@'); at >= 0 {
			raw = raw[:i+2] + raw[i+2+at+1:]
		}
	}
	return raw
}

// Text applies URL to every http:// and https:// URL inside s, such as the one net/http
// quotes in its errors (`Get "https://h/p?sig=abc": dial tcp ...`).
func Text(s string) string {
	var b strings.Builder
	rest := s
	for {
		i := indexURL(rest)
		if i < 0 {
			if b.Len() == 0 {
				return s // the common case: no URL, no copy
			}
			b.WriteString(rest)
			return b.String()
		}
		b.WriteString(rest[:i])
		rest = rest[i:]
		end := strings.IndexFunc(rest, endsURL)
		if end < 0 {
			end = len(rest)
		}
		// Punctuation that closes a sentence or a clause is not part of the URL.
		token := strings.TrimRight(rest[:end], ".,;:!)]}")
		b.WriteString(URL(token))
		rest = rest[len(token):]
	}
}

// indexURL returns the index of the first "http://" or "https://" in s, in any case.
func indexURL(s string) int {
	for i := 0; i < len(s); i++ {
		if s[i] != 'h' && s[i] != 'H' {
			continue
		}
		if hasPrefixFold(s[i:], "http://") || hasPrefixFold(s[i:], "https://") {
			return i
		}
	}
	return -1
}

// hasPrefixFold is strings.HasPrefix ignoring ASCII case; unlike a lower-cased copy it
// keeps byte offsets valid whatever else s holds.
func hasPrefixFold(s, prefix string) bool {
	if len(s) < len(prefix) {
		return false
	}
	for i := 0; i < len(prefix); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != prefix[i] {
			return false
		}
	}
	return true
}

// endsURL tells the characters that cannot be part of a URL in text: white space,
// quotes and angle brackets, as in Go's %q, slog's quoting and <URL> notation.
func endsURL(r rune) bool {
	switch r {
	case ' ', '\t', '\n', '\r', '"', '\'', '`', '<', '>':
		return true
	}
	return r < ' ' || r == 0x7f
}

// Error wraps err so that its message carries redacted URLs only (see Text), while
// errors.Is and errors.As still see err. It returns nil for nil.
func Error(err error) error {
	if err == nil {
		return nil
	}
	if e, ok := err.(*redacted); ok {
		return e
	}
	return &redacted{err: err}
}

type redacted struct{ err error }

func (e *redacted) Error() string { return Text(e.err.Error()) }
func (e *redacted) Unwrap() error { return e.err }
