package hostpattern

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	good := map[string]string{ // entry: as String writes it back
		"logs.example.com":      "logs.example.com",
		"Logs.Example.COM.":     "logs.example.com",
		"logs.example.com:8080": "logs.example.com:8080",
		"*.example.com":         "*.example.com",
		"*.example.com:443":     "*.example.com:443",
		"192.0.2.7":             "192.0.2.7",
		"192.0.2.7:80":          "192.0.2.7:80",
		"[2001:db8::7]":         "[2001:db8::7]",
		"[2001:db8::7]:8443":    "[2001:db8::7]:8443",
		"2001:db8:0::7":         "[2001:db8::7]",
		"::ffff:192.0.2.7":      "192.0.2.7",
		"swift_1.internal":      "swift_1.internal",
	}
	for in, want := range good {
		p, err := Parse(in)
		if err != nil {
			t.Errorf("Parse(%q): %v", in, err)
			continue
		}
		if p.String() != want {
			t.Errorf("Parse(%q) = %s, want %s", in, p, want)
		}
	}
	bad := map[string]string{ // entry: what the error says
		"":                          "no host name",
		"*":                         "is not a host name",
		"*.":                        "is not a host name",
		"a.*.example.com":           "is not a host name",
		"logs.example.com:":         "empty port",
		"logs.example.com:0":        "not a number from 1 to 65535",
		"logs.example.com:http":     "not a number from 1 to 65535",
		"logs.example.com:080":      "not a number from 1 to 65535",
		"host:65536":                "not a number from 1 to 65535",
		"https://logs.example.com/": "",
		"[192.0.2.7]":               "only an IPv6 address goes in brackets",
		"[2001:db8::7":              "no closing ]",
		"[2001:db8::7]8080":         "expected :port",
		"fe80::1%eth0":              "zone",
		"logs..example.com":         "is not a host name label",
		"logs example.com":          "is not a host name",
		"user@logs.example.com":     "is not a host name",
	}
	for in, says := range bad {
		p, err := Parse(in)
		if err == nil {
			t.Errorf("Parse(%q) = %s, want an error", in, p)
			continue
		}
		if !strings.Contains(err.Error(), says) {
			t.Errorf("Parse(%q) error %q does not say %q", in, err, says)
		}
	}
}

func TestFromURL(t *testing.T) {
	for _, tt := range []struct {
		url      string
		withPort bool
		want     string
	}{
		{"https://Zuul.Example.com/", true, "zuul.example.com:443"},
		{"http://zuul.example.com/", true, "zuul.example.com:80"},
		{"http://zuul.example.com:9000/t/x/", true, "zuul.example.com:9000"},
		{"https://logs.example.com:8443/a/b/", false, "logs.example.com"},
		{"http://[::1]:9000/", true, "[::1]:9000"},
	} {
		p, err := FromURL(tt.url, tt.withPort)
		if err != nil || p.String() != tt.want {
			t.Errorf("FromURL(%s, %v) = %s, %v; want %s", tt.url, tt.withPort, p, err, tt.want)
		}
	}
	for _, bad := range []string{"", "logs/", "ftp://logs.example.com/", "https:///x"} {
		if p, err := FromURL(bad, false); err == nil {
			t.Errorf("FromURL(%q) = %s, want an error", bad, p)
		}
	}
}
