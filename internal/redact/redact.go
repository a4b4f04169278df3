// Package redact removes secrets (userinfo, signed query strings) from URLs and from the
// free text of errors and log lines that carry URLs, before they reach a log or the state.
package redact

import (
	"net/url"
	"regexp"
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
// quotes in its errors (`Get "https://h/p?sig=abc": dial tcp ...`), and removes the
// userinfo of URLs of other schemes (see Userinfo).
func Text(s string) string {
	s = Userinfo(s)
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

// Userinfo removes the userinfo (a user name, and the password that may follow it)
// of every URL inside s, whatever its scheme, and leaves the rest of s as it is: the
// query strings too, which say what was asked of an API and are secret only in
// signed links (Text removes those). What a log line, an error shown to the operator
// and a failure reason in the state hold goes through it.
func Userinfo(s string) string {
	if !strings.Contains(s, "@") {
		return s // no userinfo anywhere: the common case costs no scan
	}
	var b strings.Builder
	rest := s
	for {
		i := strings.Index(rest, "://")
		if i < 0 {
			break
		}
		b.WriteString(rest[:i+3])
		rest = rest[i+3:]
		// The authority ends where the path, query or fragment begins, or the URL does.
		end := strings.IndexFunc(rest, func(r rune) bool { return r == '/' || r == '?' || r == '#' || endsURL(r) })
		if end < 0 {
			end = len(rest)
		}
		if at := strings.LastIndexByte(rest[:end], '@'); at >= 0 {
			rest = rest[at+1:]
		}
	}
	if b.Len() == 0 {
		return s
	}
	b.WriteString(rest)
	return b.String()
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

// secretWord is what in a key or a flag's name says that its value is a secret:
// OS_PASSWORD, api_key, application_credential_secret, X-Auth-Token, and the
// secrets of openstack's flags (--os-passcode, --os-code, its client,
// consumer and access secrets).
const secretWord = `(?:password|passwd|passcode|token|secret|key|credential|authorization|os[_-]code)`

var (
	// assignment is a KEY=VALUE (or "key": value, or an Authorization: header)
	// whose key names a secret, up to the end of its line: the whole rest of
	// the line, since a value may hold spaces, and a value cut short would
	// leak its tail.
	assignment = regexp.MustCompile(`(?i)([a-z0-9_.-]*` + secretWord + `[a-z0-9_.-]*["']?[ \t]*[=:][ \t]*)[^\s].*`)
	// flag is a command-line flag naming a secret and its value as the next
	// word (--os-password VALUE, as a traced command shows it), up to the end
	// of its line, for the same reason; --os-password=VALUE is an assignment.
	flag = regexp.MustCompile(`(?im)((?:^|[\s"'(\[])--?[a-z0-9_.-]*` + secretWord + `[a-z0-9_.-]*[ \t]+)[^\s].*`)
	// bearer is a bearer token wherever it is, as an HTTP client's trace
	// shows an Authorization header in a form an assignment may miss.
	bearer = regexp.MustCompile(`(?i)(\bbearer[ \t]+)[a-z0-9._~+/=-]+`)
)

// Secrets takes out of s the secrets that a program printing its environment,
// its config, a traced command line or an HTTP exchange shows:
//   - the value of every KEY=VALUE (or KEY: VALUE) whose key names a secret, as
//     environment variables, config files and HTTP headers spell them
//     (OS_PASSWORD=..., api_key: ..., Authorization: ..., --os-token=...): a key
//     that holds PASSWORD, PASSWD, PASSCODE, TOKEN, SECRET, KEY, CREDENTIAL,
//     AUTHORIZATION or OS_CODE in any case;
//   - the value of a command-line flag so named, given as the next word
//     (--os-password VALUE, --os-application-credential-secret VALUE);
//   - a bearer token (Bearer VALUE).
//
// A value of the first two is taken to the end of its line. It is meant for
// the output of programs such as a post-upload-hook, where it errs on the side
// of removing too much.
func Secrets(s string) string {
	s = assignment.ReplaceAllString(s, "${1}"+placeholder)
	s = flag.ReplaceAllString(s, "${1}"+placeholder)
	return bearer.ReplaceAllString(s, "${1}"+placeholder)
}

// Error wraps err so that its message carries redacted URLs only (see Text), while
// errors.Is and errors.As still see err. It returns nil for nil.
func Error(err error) error { return wrap(err, true) }

// UserinfoError wraps err so that its message carries no userinfo of a URL (see
// Userinfo), while errors.Is and errors.As still see err. It returns nil for nil.
func UserinfoError(err error) error { return wrap(err, false) }

func wrap(err error, queries bool) error {
	if err == nil {
		return nil
	}
	// Text removes userinfo too: an error Error redacted needs nothing more.
	if e, ok := err.(*redacted); ok && (e.queries || !queries) {
		return e
	}
	return &redacted{err: err, queries: queries}
}

// redacted is an error whose message goes through Text (queries) or Userinfo.
type redacted struct {
	err     error
	queries bool
}

func (e *redacted) Error() string {
	if e.queries {
		return Text(e.err.Error())
	}
	return Userinfo(e.err.Error())
}

func (e *redacted) Unwrap() error { return e.err }
