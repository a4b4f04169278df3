// Package hostpattern reads and matches the host entries an operator lists (a zuul-image's
// artifact-hosts): a host name, an IP address or a "*.domain" wildcard, with or without a port.
package hostpattern

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
)

// Pattern is one allowed host: a host name, an IP address or a "*.domain" wildcard
// (any name below domain, not domain itself), with a port or, when it has none, any port.
type Pattern struct {
	host     string // lower case, without a trailing dot; an IP address in canonical form
	wildcard bool   // host is a domain; names below it match
	port     string // "" for any port
}

// String is the pattern as it would be written in artifact-hosts.
func (p Pattern) String() string {
	h := p.host
	if p.wildcard {
		h = "*." + h
	}
	if p.port == "" {
		if strings.Contains(h, ":") {
			return "[" + h + "]"
		}
		return h
	}
	return net.JoinHostPort(h, p.port)
}

// Parse reads a host entry: "logs.example.com", "*.example.com",
// "192.0.2.7", "[2001:db8::7]" or "2001:db8::7", each optionally with ":port" (an IPv6
// address with a port in brackets).
func Parse(s string) (Pattern, error) {
	host, port := s, ""
	switch {
	case strings.HasPrefix(s, "["):
		end := strings.Index(s, "]")
		if end < 0 {
			return Pattern{}, fmt.Errorf("%q has no closing ]", s)
		}
		host = s[1:end]
		rest := s[end+1:]
		if rest != "" {
			p, ok := strings.CutPrefix(rest, ":")
			if !ok {
				return Pattern{}, fmt.Errorf("%q: expected :port after ]", s)
			}
			port = p
		}
		if _, err := netip.ParseAddr(host); err != nil || !strings.Contains(host, ":") {
			return Pattern{}, fmt.Errorf("%q: only an IPv6 address goes in brackets", s)
		}
	case strings.Count(s, ":") == 1:
		host, port, _ = strings.Cut(s, ":")
		if port == "" {
			return Pattern{}, fmt.Errorf("%q: empty port after :", s)
		}
	}
	if port != "" {
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != port {
			return Pattern{}, fmt.Errorf("%q: port %q is not a number from 1 to 65535", s, port)
		}
	}
	if addr, err := netip.ParseAddr(host); err == nil {
		if addr.Zone() != "" {
			return Pattern{}, fmt.Errorf("%q: an address with a zone cannot be matched", s)
		}
		return Pattern{host: addr.Unmap().String(), port: port}, nil
	}
	p := Pattern{port: port}
	name := strings.ToLower(strings.TrimSuffix(host, "."))
	if rest, ok := strings.CutPrefix(name, "*."); ok {
		p.wildcard, name = true, rest
	}
	if err := checkName(name); err != nil {
		return Pattern{}, fmt.Errorf("%q: %w", s, err)
	}
	p.host = name
	return p, nil
}

// checkName accepts what DNS names look like: dot-separated labels of letters,
// digits, '-' and '_', at most 253 characters.
func checkName(name string) error {
	if name == "" {
		return errors.New("no host name")
	}
	if len(name) > 253 {
		return errors.New("host name longer than 253 characters")
	}
	for label := range strings.SplitSeq(name, ".") {
		if label == "" || len(label) > 63 {
			return fmt.Errorf("%q is not a host name label", label)
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
				return fmt.Errorf("%q is not a host name (a wildcard is only allowed as \"*.\" at the start)", name)
			}
		}
	}
	return nil
}

// FromURL is the host of an absolute http or https URL as a pattern: with the
// URL's port (its default port when it names none) when withPort is set, else any port.
func FromURL(rawURL string, withPort bool) (Pattern, error) {
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" {
		return Pattern{}, errors.New("not an absolute http or https URL")
	}
	host, port := Canonical(u.Hostname()), ""
	if withPort {
		port = Port(u)
	}
	return Pattern{host: host, port: port}, nil
}

// Canonical is a URL's or a dialled address's host as patterns hold it.
func Canonical(h string) string {
	if addr, err := netip.ParseAddr(h); err == nil {
		return addr.Unmap().String()
	}
	return strings.ToLower(strings.TrimSuffix(h, "."))
}

// Port is the port a URL connects to.
func Port(u *url.URL) string {
	if p := u.Port(); p != "" {
		return p
	}
	if u.Scheme == "https" {
		return "443"
	}
	return "80"
}

// Matches tells whether host (as Canonical gives it) and port match p.
func (p Pattern) Matches(host, port string) bool {
	if p.port != "" && p.port != port {
		return false
	}
	if !p.wildcard {
		return p.host == host
	}
	return strings.HasSuffix(host, "."+p.host) && !isIP(host)
}

func isIP(h string) bool {
	_, err := netip.ParseAddr(h)
	return err == nil
}

// Exact is the host and port u connects to, as a pattern that matches them alone.
func Exact(u *url.URL) Pattern {
	return Pattern{host: Canonical(u.Hostname()), port: Port(u)}
}
