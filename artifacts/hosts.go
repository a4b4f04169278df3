package artifacts

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/hostpattern"
	"github.com/nodepool-builder/nodepool-builder/internal/nat64"
	"github.com/nodepool-builder/nodepool-builder/internal/redact"
	"github.com/nodepool-builder/nodepool-builder/internal/untrusted"
)

// The rule, in one place. An artifact URL comes from a job, so it may name any host:
//
//   - Every URL a download reaches, the first and each redirect, must match Hosts: the
//     artifact-hosts the operator listed or, without that list, the host and port of Zuul's
//     api-url and the host (any port) of the build's log_url.
//   - A connection to a loopback, link-local (cloud metadata at 169.254.169.254 among
//     them), private, shared (CGNAT), unspecified or multicast address, or any other that
//     IANA's special-purpose registries mark not globally reachable, is refused, unless
//     the host being connected to was named by the operator: an artifact-hosts entry, or
//     the api-url's host and port. The log_url's host is allowed but not exempt: it comes
//     from Zuul's answer, and a job's Zuul answer is not the operator's word. The address
//     is checked after name resolution, on the address actually dialled, so a name that
//     resolves to loopback (or re-resolves to it later) is refused too. An IPv6 address
//     that carries an IPv4 one the packets reach (NAT64, 6to4, Teredo) is judged by it:
//     NAT64's are those of the well-known prefix and of the prefixes the operator lists
//     (Fetcher.NAT64Prefixes), whatever range the prefix itself is in.
//   - Through an HTTP proxy, the connection is to the proxy, which the operator configured;
//     the proxy resolves the artifact's host, so only the host check holds there. The
//     exemption is the proxy's host and port: a direct connection to another port of
//     the proxy's host (one NO_PROXY leaves out) is checked like any other.

// Hosts is what an artifact download may reach: the hosts it may fetch from, and those
// of them the operator named, which alone may be on internal addresses. The zero value
// allows nothing; a Request without Hosts allows only its own URL's host and port.
type Hosts struct {
	rules []hostRule
}

type hostRule struct {
	hostpattern.Pattern
	named bool
}

// Name allows p as named by the operator: its connections may go to any address.
func (h *Hosts) Name(p hostpattern.Pattern) { h.rules = append(h.rules, hostRule{p, true}) }

// Allow allows p as a host learnt from elsewhere (Zuul's log_url): its connections must
// go to public addresses.
func (h *Hosts) Allow(p hostpattern.Pattern) { h.rules = append(h.rules, hostRule{p, false}) }

// String lists the patterns, for messages.
func (h *Hosts) String() string {
	if h == nil || len(h.rules) == 0 {
		return "none"
	}
	s := make([]string, len(h.rules))
	for i, r := range h.rules {
		s[i] = r.Pattern.String()
	}
	return strings.Join(s, ", ")
}

// allows tells whether a download may fetch u.
func (h *Hosts) allows(u *url.URL) bool {
	host, port := hostpattern.Canonical(u.Hostname()), hostpattern.Port(u)
	for _, r := range h.rules {
		if r.Matches(host, port) {
			return true
		}
	}
	return false
}

// named tells whether host:port, as dialled, is one the operator named.
func (h *Hosts) named(host, port string) bool {
	host = hostpattern.Canonical(host)
	for _, r := range h.rules {
		if r.named && r.Matches(host, port) {
			return true
		}
	}
	return false
}

// ErrHostNotAllowed is wrapped by the refusal of a URL, an artifact's or a redirect's, whose
// host the zuul-image does not allow, or whose host resolved to an internal address the
// operator did not name: the operator's configuration, not the build's content, which
// an artifact-hosts entry (HostEntry) changes. It wraps untrusted.ErrUnsafe too.
var ErrHostNotAllowed = errors.New("artifact host not allowed")

// HostEntry is the artifact-hosts entry that allows u: its host, with its port when the
// URL names one (an entry without a port allows every port).
func HostEntry(u *url.URL) string {
	if u.Port() != "" {
		return u.Host
	}
	return u.Hostname()
}

// Check refuses a URL that the hosts do not allow, as a download of it is refused
// before it connects; the error wraps ErrHostNotAllowed and names the URL redacted, or,
// for a URL no download can fetch, ErrUnfetchableURL.
func (h *Hosts) Check(rawURL string) error {
	u, err := parseURL(rawURL)
	if err != nil {
		return err // ErrUnfetchableURL: no host to allow
	}
	return h.check(u, "URL")
}

// check refuses u when it is not allowed, naming it redacted.
func (h *Hosts) check(u *url.URL, what string) error {
	if h.allows(u) {
		return nil
	}
	return fmt.Errorf("%w: %w: refused %s %s: host %s is not among the allowed artifact hosts (%s); add %s to the zuul-image's artifact-hosts if it is yours",
		ErrHostNotAllowed, untrusted.ErrUnsafe, what, redact.URL(u.String()), u.Host, h, HostEntry(u))
}

// ErrInternalAddress is wrapped by the error of a connection refused because it would go
// to an internal address (loopback, link-local, private, shared, unspecified, multicast,
// or another range not globally reachable) for a host the operator did not name. It wraps ErrHostNotAllowed too.
var ErrInternalAddress = errors.New("internal address")

// internalPrefixes are the ranges of IANA's IPv4 and IPv6 special-purpose address
// registries that are not globally reachable, beyond those netip's predicates cover. A
// block is refused whole, the few anycast services the registry marks global inside
// 192.0.0.0/24 and 2001::/23 with it: no artifact is served from them.
var internalPrefixes = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),       // "this network": Linux connects it to the host itself
	netip.MustParsePrefix("100.64.0.0/10"),   // shared address space (carrier-grade NAT)
	netip.MustParsePrefix("192.0.0.0/24"),    // IETF protocol assignments (DS-Lite, NAT64 discovery...)
	netip.MustParsePrefix("192.0.2.0/24"),    // documentation
	netip.MustParsePrefix("192.88.99.0/24"),  // 6to4 relay anycast, deprecated
	netip.MustParsePrefix("198.18.0.0/15"),   // benchmarking
	netip.MustParsePrefix("198.51.100.0/24"), // documentation
	netip.MustParsePrefix("203.0.113.0/24"),  // documentation
	netip.MustParsePrefix("240.0.0.0/4"),     // reserved, and the limited broadcast address
	netip.MustParsePrefix("64:ff9b:1::/48"),  // local-use IPv4/IPv6 translation
	netip.MustParsePrefix("2001::/23"),       // IETF protocol assignments (Teredo is judged before)
	netip.MustParsePrefix("2001:db8::/32"),   // documentation
	netip.MustParsePrefix("3fff::/20"),       // documentation
}

// Prefixes of IPv6 addresses that carry an IPv4 address a packet reaches in the end,
// besides NAT64's.
var (
	sixToFour    = netip.MustParsePrefix("2002::/16") // bits 16 to 48
	teredoPrefix = netip.MustParsePrefix("2001::/32") // server: bits 32 to 64; client: last 32, inverted
	// Outside 2000::/3 IANA allocates no global unicast: the IPv4-compatible ::/96,
	// site-local fec0::/10, discard-only 100::/64 and the rest are internal.
	globalUnicast = netip.MustParsePrefix("2000::/3")
)

// addressRule judges the addresses a download dials.
type addressRule struct {
	// nat64 are the translators' prefixes whose addresses are judged by the IPv4
	// address they carry: the well-known one, then the operator's.
	nat64 []netip.Prefix
}

func newAddressRule(nat64Prefixes []netip.Prefix) addressRule {
	return addressRule{nat64: append([]netip.Prefix{nat64.WellKnown}, nat64Prefixes...)}
}

// check refuses an internal address; it is the net.Dialer.Control of connections
// to hosts the operator did not name, and so sees the address after name resolution.
func (r addressRule) check(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: cannot read dialled address %q: %w", untrusted.ErrUnsafe, address, err)
	}
	if r.internal(ap.Addr()) {
		return fmt.Errorf("%w: %w: refused to connect to %s: %w; name the host in the zuul-image's artifact-hosts if it is yours",
			ErrHostNotAllowed, untrusted.ErrUnsafe, ap.Addr(), ErrInternalAddress)
	}
	return nil
}

func (r addressRule) internal(a netip.Addr) bool {
	a = a.Unmap()
	// A translator's prefix may be in any range, unique local or local-use ones
	// included: what its addresses reach is the IPv4 address they carry.
	for _, p := range r.nat64 {
		if v4, in, valid := nat64.IPv4(p, a); in {
			return !valid || r.internal(v4)
		}
	}
	if a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() || a.IsInterfaceLocalMulticast() ||
		a.IsPrivate() || a.IsUnspecified() || a.IsMulticast() || !a.IsValid() {
		return true
	}
	if a.Is6() {
		b := a.As16()
		switch {
		case sixToFour.Contains(a):
			return r.internal(netip.AddrFrom4([4]byte(b[2:6])))
		case teredoPrefix.Contains(a):
			client := [4]byte{^b[12], ^b[13], ^b[14], ^b[15]}
			return r.internal(netip.AddrFrom4([4]byte(b[4:8]))) || r.internal(netip.AddrFrom4(client))
		case !globalUnicast.Contains(a):
			return true
		}
	}
	for _, p := range internalPrefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// guardedTransport returns a copy of base (nil: http.DefaultTransport) whose connections
// obey hosts, dialled as http.DefaultTransport dials (base's own DialContext is not
// used; a TLS dialer of its own is refused, as it would bypass the check): a dial to a host the operator did not name, nor to the configured proxy,
// runs rule's check on the resolved address. The caller closes its idle connections.
func guardedTransport(base http.RoundTripper, hosts *Hosts, rule addressRule) (*http.Transport, error) {
	if base == nil {
		base = http.DefaultTransport
	}
	t, ok := base.(*http.Transport)
	if !ok {
		return nil, fmt.Errorf("the HTTP client's transport is %T, not *http.Transport: its connections cannot be checked", base)
	}
	if t.DialTLSContext != nil || t.DialTLS != nil { //nolint:staticcheck // DialTLS too would bypass the check
		return nil, errors.New("the HTTP client's transport has its own TLS dialer: its connections cannot be checked")
	}
	t = t.Clone()
	t.Dial = nil //nolint:staticcheck // replaced by DialContext below, as the doc of Fetcher.HTTPClient says
	g := &dialGuard{hosts: hosts, rule: rule, proxies: map[string]bool{}}
	if proxy := t.Proxy; proxy != nil {
		t.Proxy = func(r *http.Request) (*url.URL, error) {
			u, err := proxy(r)
			if u != nil {
				g.addProxy(u)
			}
			return u, err
		}
	}
	t.DialContext = g.dial
	return t, nil
}

// dialGuard dials for one download.
type dialGuard struct {
	hosts   *Hosts
	rule    addressRule
	mu      sync.Mutex
	proxies map[string]bool // host:port of the proxies the transport chose
}

func (g *dialGuard) addProxy(u *url.URL) {
	g.mu.Lock()
	g.proxies[proxyKey(u.Hostname(), proxyPort(u))] = true
	g.mu.Unlock()
}

func proxyKey(host, port string) string {
	return net.JoinHostPort(hostpattern.Canonical(host), port)
}

// proxyPort is the port the transport dials for the proxy u, as net/http defaults it.
func proxyPort(u *url.URL) string {
	if p := u.Port(); p != "" {
		return p
	}
	switch u.Scheme {
	case "https":
		return "443"
	case "socks5", "socks5h":
		return "1080"
	}
	return "80"
}

func (g *dialGuard) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	// As http.DefaultTransport dials.
	d := net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	g.mu.Lock()
	proxy := g.proxies[proxyKey(host, port)]
	g.mu.Unlock()
	if !proxy && !g.hosts.named(host, port) {
		d.Control = g.rule.check
	}
	return d.DialContext(ctx, network, addr)
}
