package artifacts

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodepool-builder/nodepool-builder/internal/hostpattern"
	"github.com/nodepool-builder/nodepool-builder/internal/untrusted"
)

func mustPattern(t testing.TB, s string) hostpattern.Pattern {
	t.Helper()
	p, err := hostpattern.Parse(s)
	if err != nil {
		t.Fatalf("hostpattern.Parse(%q): %v", s, err)
	}
	return p
}

func TestHostsMatch(t *testing.T) {
	var h Hosts
	for _, s := range []string{"zuul.example.com:443", "*.swift.example.com", "192.0.2.7:8080", "2001:db8::7"} {
		h.Name(mustPattern(t, s))
	}
	h.Allow(mustPattern(t, "logs.example.com"))
	tests := []struct {
		url            string
		allowed, named bool
	}{
		{"https://zuul.example.com/api", true, true},
		{"https://ZUUL.example.com.:443/api", true, true},
		{"http://zuul.example.com/api", false, false}, // port 80, not the 443 named
		{"https://zuul.example.com:8443/", false, false},
		{"https://a.swift.example.com/x", true, true},
		{"http://a.b.swift.example.com:9000/x", true, true},
		{"https://swift.example.com/x", false, false}, // the wildcard is for names below it
		{"https://evilswift.example.com/x", false, false},
		{"http://192.0.2.7:8080/x", true, true},
		{"http://192.0.2.7/x", false, false},
		{"http://[::ffff:192.0.2.7]:8080/x", true, true},
		{"http://[2001:db8::7]:1234/x", true, true},
		{"http://[2001:db8:0:0::7]/x", true, true},
		{"https://logs.example.com/x", true, false},
		{"http://logs.example.com:8080/x", true, false},
		{"https://a.logs.example.com/x", false, false},
		{"https://example.com/x", false, false},
	}
	for _, tt := range tests {
		u, err := url.Parse(tt.url)
		if err != nil {
			t.Fatal(err)
		}
		if got := h.allows(u); got != tt.allowed {
			t.Errorf("allows(%s) = %v, want %v", tt.url, got, tt.allowed)
		}
		if got := h.named(u.Hostname(), hostpattern.Port(u)); got != tt.named {
			t.Errorf("named(%s) = %v, want %v", tt.url, got, tt.named)
		}
	}
	var none Hosts
	if u, _ := url.Parse("https://zuul.example.com/"); none.allows(u) {
		t.Error("the zero Hosts allows a URL")
	}
}

// TestCheckAddress: one row per range of IANA's IPv4 and IPv6 special-purpose address
// registries that is not globally reachable, and the IPv4 addresses carried inside NAT64,
// 6to4 and Teredo addresses judged as IPv4.
func TestCheckAddress(t *testing.T) {
	tests := []struct {
		addr     string
		internal bool
		why      string
	}{
		{"127.0.0.1:80", true, "loopback"},
		{"127.1.2.3:8080", true, "loopback"},
		{"[::1]:80", true, "loopback"},
		{"[::ffff:127.0.0.1]:80", true, "IPv4-mapped loopback"},
		{"169.254.169.254:80", true, "link-local (cloud metadata)"},
		{"[fe80::1]:80", true, "link-local"},
		{"10.0.0.1:443", true, "private"},
		{"172.16.5.4:80", true, "private"},
		{"192.168.1.1:80", true, "private"},
		{"[fc00::1]:80", true, "unique local"},
		{"[fd12:3456::1]:80", true, "unique local"},
		{"100.64.0.1:80", true, "shared"},
		{"100.127.255.254:80", true, "shared"},
		{"0.0.0.0:80", true, "this network"},
		{"0.1.2.3:80", true, "this network"},
		{"[::]:80", true, "unspecified"},
		{"224.0.0.1:80", true, "multicast"},
		{"[ff02::1]:80", true, "multicast"},
		{"192.0.0.8:80", true, "IETF protocol assignments"},
		{"192.0.0.192:80", true, "IETF protocol assignments"},
		{"192.0.2.1:80", true, "documentation (TEST-NET-1)"},
		{"192.88.99.1:80", true, "deprecated 6to4 relay anycast"},
		{"198.18.0.1:80", true, "benchmarking"},
		{"198.19.255.254:80", true, "benchmarking"},
		{"198.51.100.1:80", true, "documentation (TEST-NET-2)"},
		{"203.0.113.1:80", true, "documentation (TEST-NET-3)"},
		{"240.0.0.1:80", true, "reserved"},
		{"255.255.255.255:80", true, "limited broadcast"},
		{"[::7f00:1]:80", true, "IPv4-compatible"},
		{"[::8.8.8.8]:80", true, "IPv4-compatible"},
		{"[64:ff9b:1::808:808]:80", true, "local-use IPv4/IPv6 translation"},
		{"[100::1]:80", true, "discard-only"},
		{"[100:0:0:1::1]:80", true, "dummy prefix"},
		{"[2001:2::1]:80", true, "benchmarking"},
		{"[2001:10::1]:80", true, "deprecated ORCHID"},
		{"[2001:db8::1]:80", true, "documentation"},
		{"[3fff::1]:80", true, "documentation"},
		{"[5f00::1]:80", true, "segment routing SIDs"},
		{"[fec0::1]:80", true, "site-local"},
		{"[400::1]:80", true, "outside global unicast 2000::/3"},
		{"[64:ff9b::7f00:1]:80", true, "NAT64 of 127.0.0.1"},
		{"[64:ff9b::a9fe:a9fe]:80", true, "NAT64 of 169.254.169.254"},
		{"[64:ff9b::10.1.2.3]:80", true, "NAT64 of 10.1.2.3"},
		{"[2002:7f00:1::1]:80", true, "6to4 of 127.0.0.1"},
		{"[2002:c0a8:101::1]:80", true, "6to4 of 192.168.1.1"},
		{"[2002:a9fe:a9fe:1::1]:80", true, "6to4 of 169.254.169.254"},
		{"[2001:0:4136:e378:8000:63bf:80ff:fffe]:80", true, "Teredo client 127.0.0.1"},
		{"[2001:0:4136:e378:8000:63bf:f5ff:fffe]:80", true, "Teredo client 10.0.0.1"},
		{"[2001:0:a00:1:8000:63bf:f7f7:f7f7]:80", true, "Teredo server 10.0.0.1"},
		{"192.0.0.9:80", true, "IETF protocol assignments (anycast, refused with its block)"},

		{"8.8.8.8:443", false, "public"},
		{"100.128.0.1:80", false, "just past shared"},
		{"172.32.0.1:80", false, "just past private"},
		{"198.20.0.1:80", false, "just past benchmarking"},
		{"223.255.255.254:80", false, "just below multicast"},
		{"[2001:4860:4860::8888]:443", false, "public"},
		{"[64:ff9b::808:808]:80", false, "NAT64 of 8.8.8.8"},
		{"[2002:808:808::1]:80", false, "6to4 of 8.8.8.8"},
		{"[2001:0:4136:e378:8000:63bf:f7f7:f7f7]:80", false, "Teredo server 65.54.227.120, client 8.8.8.8"},
		{"[2a00:1450:4001:82a::200e]:443", false, "public"},
	}
	for _, tt := range tests {
		err := newAddressRule(nil).check("tcp", tt.addr, nil)
		if tt.internal {
			if !errors.Is(err, ErrInternalAddress) || !errors.Is(err, untrusted.ErrUnsafe) {
				t.Errorf("check(%s) (%s) = %v, want ErrInternalAddress", tt.addr, tt.why, err)
			}
		} else if err != nil {
			t.Errorf("check(%s) (%s) = %v, want nil", tt.addr, tt.why, err)
		}
	}
}

// TestCheckAddressNAT64Prefixes: an address of a NAT64 prefix the operator lists, of
// any length RFC 6052 defines and in any range, is judged by the IPv4 address it
// carries: the metadata service or a private address behind a network-specific
// prefix is internal, a public one behind a unique local prefix is not.
func TestCheckAddressNAT64Prefixes(t *testing.T) {
	prefixes := []netip.Prefix{
		netip.MustParsePrefix("2a00:1:64::/96"),   // global: its addresses look public
		netip.MustParsePrefix("fd00:64::/96"),     // unique local: its addresses look private
		netip.MustParsePrefix("64:ff9b:1::/96"),   // local-use (RFC 8215)
		netip.MustParsePrefix("2a00:2:6400::/40"), // the IPv4 address split around bits 64 to 71
	}
	tests := []struct {
		addr              string
		internal, without bool // with the prefixes listed; without them
		why               string
	}{
		{"[2a00:1:64::a9fe:a9fe]:80", true, false, "169.254.169.254 behind a global prefix"},
		{"[2a00:1:64::7f00:1]:80", true, false, "127.0.0.1 behind a global prefix"},
		{"[2a00:1:64::a00:1]:80", true, false, "10.0.0.1 behind a global prefix"},
		{"[2a00:1:64::808:808]:80", false, false, "8.8.8.8 behind a global prefix"},
		{"[fd00:64::808:808]:80", false, true, "8.8.8.8 behind a unique local prefix"},
		{"[fd00:64::c0a8:101]:80", true, true, "192.168.1.1 behind a unique local prefix"},
		{"[fd00:64:0:1::808:808]:80", true, true, "unique local, outside the prefix"},
		{"[64:ff9b:1::808:808]:80", false, true, "8.8.8.8 behind a local-use prefix"},
		{"[64:ff9b:1::a9fe:a9fe]:80", true, true, "169.254.169.254 behind a local-use prefix"},
		{"[2a00:2:64a9:fea9:fe::]:80", true, false, "169.254.169.254 behind a /40"},
		{"[2a00:2:6408:808:8::]:80", false, false, "8.8.8.8 behind a /40"},
		{"[2a00:2:6408:808:ff08::]:80", true, false, "bits 64 to 71 set: no translator's address"},
		{"[64:ff9b::a9fe:a9fe]:80", true, true, "the well-known prefix still counts"},
	}
	with, without := newAddressRule(prefixes), newAddressRule(nil)
	for _, tt := range tests {
		for _, c := range []struct {
			rule     addressRule
			internal bool
			listed   string
		}{{with, tt.internal, "listed"}, {without, tt.without, "not listed"}} {
			err := c.rule.check("tcp", tt.addr, nil)
			if c.internal != (err != nil) || err != nil && !errors.Is(err, ErrInternalAddress) {
				t.Errorf("check(%s) (%s), prefixes %s = %v, want internal %v", tt.addr, tt.why, c.listed, err, c.internal)
			}
		}
	}
}

// TestFetchRefusesNAT64Internal: through the real fetch path, a URL whose host is
// allowed but whose address is the metadata service behind the Fetcher's NAT64
// prefix is refused before any connection.
func TestFetchRefusesNAT64Internal(t *testing.T) {
	const host = "2a00:1:64::a9fe:a9fe"
	hosts := &Hosts{}
	hosts.Allow(mustPattern(t, host))
	u := (&url.URL{Scheme: "http", Host: net.JoinHostPort(host, "8080"), Path: "/img.raw"}).String()
	// Without the rule, the address is dialled: it leads nowhere here, so the
	// deadline ends a download that would otherwise be retried.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	f := testFetcher(t)
	f.NAT64Prefixes = []netip.Prefix{netip.MustParsePrefix("2a00:1:64::/96")}
	_, err := f.Fetch(ctx, Request{URL: u, Files: files(f, "img.raw", filepath.Join(t.TempDir(), "img.raw")), Hosts: hosts})
	if !errors.Is(err, ErrInternalAddress) || !errors.Is(err, untrusted.ErrUnsafe) {
		t.Fatalf("Fetch %s = %v, want ErrInternalAddress", u, err)
	}
	checkNoPartials(t, f)
}

// recordingServer serves image at any path and records each request's headers.
type recordingServer struct {
	*httptest.Server
	mu      sync.Mutex
	headers []http.Header
}

func newRecordingServer(t *testing.T, image []byte, redirect func(r *http.Request) string) *recordingServer {
	rs := &recordingServer{}
	rs.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rs.mu.Lock()
		rs.headers = append(rs.headers, r.Header.Clone())
		rs.mu.Unlock()
		if redirect != nil {
			if to := redirect(r); to != "" {
				http.Redirect(w, r, to, http.StatusFound)
				return
			}
		}
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(image))
	}))
	t.Cleanup(rs.Close)
	return rs
}

func (rs *recordingServer) seen() []http.Header {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return append([]http.Header(nil), rs.headers...)
}

func hostPort(t *testing.T, rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// TestFetchRefusesHosts: an artifact URL, or a redirect, to a host not allowed is refused
// before anything is sent to it; so is an allowed host that the operator did not name
// when it resolves to an internal address. Here "zuul" is the operator's (named by host
// and port), "localhost" is a log host learnt from Zuul, and "secret" a service on
// loopback that only the builder host can reach.
func TestFetchRefusesHosts(t *testing.T) {
	image := testImage(64 << 10)
	secret := newRecordingServer(t, image, nil)
	su, _ := url.Parse(secret.URL)
	secretPort := ":" + su.Port()
	var zuulURL string
	zuul := newRecordingServer(t, image, func(r *http.Request) string {
		switch r.URL.Path {
		case "/to-secret":
			return secret.URL + "/img.raw"
		case "/to-localhost":
			return "http://localhost" + secretPort + "/img.raw"
		}
		return ""
	})
	zuulURL = zuul.URL
	hosts := &Hosts{}
	hosts.Name(mustPattern(t, hostPort(t, zuulURL)))
	hosts.Allow(mustPattern(t, "localhost"))

	tests := []struct {
		name, url string
		says      []string
		internal  bool
	}{
		{name: "URL to another port of the named host", url: secret.URL + "/img.raw",
			says: []string{"refused URL " + secret.URL + "/img.raw", "not among the allowed artifact hosts (" + hostPort(t, zuulURL) + ", localhost)"}},
		{name: "URL to another host", url: "http://127.0.0.2" + secretPort + "/img.raw", says: []string{"refused URL http://127.0.0.2"}},
		{name: "redirect to a host not allowed", url: zuulURL + "/to-secret",
			says: []string{"refused redirect to " + secret.URL + "/img.raw"}},
		{name: "allowed host on loopback", url: "http://localhost" + secretPort + "/img.raw", internal: true,
			says: []string{"refused to connect to"}},
		{name: "redirect to an allowed host on loopback", url: zuulURL + "/to-localhost", internal: true,
			says: []string{"refused to connect to"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := len(secret.seen())
			f := testFetcher(t)
			dest := filepath.Join(t.TempDir(), "img.raw")
			_, err := f.Fetch(context.Background(), Request{URL: tt.url, Files: files(f, "img.raw", dest), Hosts: hosts})
			if !errors.Is(err, untrusted.ErrUnsafe) || errors.Is(err, ErrInternalAddress) != tt.internal {
				t.Fatalf("Fetch error = %v, want untrusted.ErrUnsafe (internal address: %v)", err, tt.internal)
			}
			for _, s := range tt.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not say %q", err, s)
				}
			}
			if n := len(secret.seen()) - before; n != 0 {
				t.Errorf("the service not allowed got %d requests", n)
			}
			checkNoPartials(t, f)
		})
	}

	// The same URLs, with the hosts named by the operator, are fetched.
	named := &Hosts{}
	named.Name(mustPattern(t, "127.0.0.1"))
	named.Name(mustPattern(t, "localhost"))
	for _, u := range []string{zuulURL + "/to-secret", zuulURL + "/to-localhost"} {
		f := testFetcher(t)
		dest := filepath.Join(t.TempDir(), "img.raw")
		res, err := f.Fetch(context.Background(), Request{URL: u, Files: files(f, "img.raw", dest), Hosts: named})
		if err != nil {
			t.Fatalf("Fetch %s with the hosts named: %v", u, err)
		}
		checkFetched(t, f, res, dest, image)
	}
}

// TestFetchSendsNoCredentialsOrReferer: userinfo in the URL or in a redirect becomes no
// Authorization header, and a redirect's target sees no Referer (the first URL's query
// may be a signature).
func TestFetchSendsNoCredentialsOrReferer(t *testing.T) {
	image := testImage(64 << 10)
	target := newRecordingServer(t, image, nil)
	first := newRecordingServer(t, image, func(r *http.Request) string {
		if r.URL.Path == "/redirect" {
			return strings.Replace(target.URL, "http://", "http://joe:target-secret@", 1) + "/img.raw"
		}
		return ""
	})
	hosts := &Hosts{}
	hosts.Name(mustPattern(t, "127.0.0.1"))
	for _, u := range []string{
		strings.Replace(first.URL, "http://", "http://ann:first-secret@", 1) + "/redirect?sig=first-signature",
		strings.Replace(target.URL, "http://", "http://ann:first-secret@", 1) + "/img.raw",
	} {
		f := testFetcher(t)
		dest := filepath.Join(t.TempDir(), "img.raw")
		res, err := f.Fetch(context.Background(), Request{URL: u, Files: files(f, "img.raw", dest), Hosts: hosts})
		if err != nil {
			t.Fatalf("Fetch: %v", err)
		}
		checkFetched(t, f, res, dest, image)
	}
	seen := append(first.seen(), target.seen()...)
	if len(target.seen()) == 0 || len(first.seen()) == 0 {
		t.Fatalf("requests: %d to the first server, %d to the target", len(first.seen()), len(target.seen()))
	}
	for _, h := range seen {
		if a := h.Get("Authorization"); a != "" {
			t.Errorf("a server got Authorization %q", a)
		}
		if r := h.Get("Referer"); r != "" {
			t.Errorf("a server got Referer %q", r)
		}
	}
}

// TestFetchThroughProxy: through an HTTP proxy the connection goes to the proxy, which
// the operator set up: it is not refused for its internal address, while the host of
// the URL must still be allowed.
func TestFetchThroughProxy(t *testing.T) {
	image := testImage(64 << 10)
	var mu sync.Mutex
	var hostsAsked []string
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hostsAsked = append(hostsAsked, r.URL.Host)
		mu.Unlock()
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(image))
	}))
	defer proxy.Close()
	proxyURL, _ := url.Parse(proxy.URL)
	f := testFetcher(t)
	f.HTTPClient = &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxyURL)}}
	hosts := &Hosts{}
	hosts.Allow(mustPattern(t, "logs.example.com"))

	dest := filepath.Join(t.TempDir(), "img.raw")
	res, err := f.Fetch(context.Background(), Request{URL: "http://logs.example.com/img.raw", Files: files(f, "img.raw", dest), Hosts: hosts})
	if err != nil {
		t.Fatalf("Fetch through the proxy: %v", err)
	}
	checkFetched(t, f, res, dest, image)
	_, err = f.Fetch(context.Background(), Request{URL: "http://files.example.com/img.raw", Files: files(f, "img.raw", dest), Hosts: hosts})
	if !errors.Is(err, untrusted.ErrUnsafe) {
		t.Fatalf("Fetch of a host not allowed through the proxy: %v, want untrusted.ErrUnsafe", err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, h := range hostsAsked {
		if h != "logs.example.com" {
			t.Errorf("the proxy was asked for %s", h)
		}
	}
}

// TestFetchWithoutHosts: a Request without Hosts may fetch its own URL's host and port,
// even on loopback, and nothing else.
func TestFetchWithoutHosts(t *testing.T) {
	image := testImage(64 << 10)
	other := newRecordingServer(t, image, nil)
	srv := newRecordingServer(t, image, func(r *http.Request) string {
		if r.URL.Path == "/away" {
			return other.URL + "/img.raw"
		}
		return ""
	})
	f := testFetcher(t)
	dest := filepath.Join(t.TempDir(), "img.raw")
	res, err := f.Fetch(context.Background(), Request{URL: srv.URL + "/img.raw", Files: files(f, "img.raw", dest)})
	if err != nil {
		t.Fatalf("Fetch: %v", err)
	}
	checkFetched(t, f, res, dest, image)
	_, err = f.Fetch(context.Background(), Request{URL: srv.URL + "/away", Files: files(f, "img2.raw", dest)})
	if !errors.Is(err, untrusted.ErrUnsafe) || len(other.seen()) != 0 {
		t.Fatalf("redirect to another port: %v, %d requests there; want untrusted.ErrUnsafe and none", err, len(other.seen()))
	}
}

// TestFetchRefusesEmbeddedInternal: through the real fetch path, a URL at a NAT64, 6to4 or
// Teredo address carrying an internal IPv4 address, or at another range that is not
// globally reachable, is refused before any connection, though its host is allowed.
func TestFetchRefusesEmbeddedInternal(t *testing.T) {
	for _, host := range []string{"64:ff9b::7f00:1", "2002:7f00:1::1", "2001:0:4136:e378:8000:63bf:80ff:fffe", "fec0::1", "198.18.0.1"} {
		t.Run(host, func(t *testing.T) {
			hosts := &Hosts{}
			hosts.Allow(mustPattern(t, host))
			u := (&url.URL{Scheme: "http", Host: net.JoinHostPort(host, "8080"), Path: "/img.raw"}).String()
			// Without the rule, the address is dialled: it leads nowhere here, so the
			// deadline ends a download that would otherwise be retried.
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			f := testFetcher(t)
			_, err := f.Fetch(ctx, Request{URL: u, Files: files(f, "img.raw", filepath.Join(t.TempDir(), "img.raw")), Hosts: hosts})
			if !errors.Is(err, ErrInternalAddress) || !errors.Is(err, untrusted.ErrUnsafe) {
				t.Fatalf("Fetch %s = %v, want ErrInternalAddress", u, err)
			}
			checkNoPartials(t, f)
		})
	}
}

// TestFetchProxyExemptsOnlyItsPort: the proxy's connection is exempt from the address
// rule, but only to the proxy's own port: a direct connection (one NO_PROXY leaves out)
// to another port of the proxy's host is judged like any other.
func TestFetchProxyExemptsOnlyItsPort(t *testing.T) {
	image := testImage(64 << 10)
	secret := newRecordingServer(t, image, nil)
	proxy := newRecordingServer(t, image, func(r *http.Request) string {
		if r.URL.Path == "/to-secret" {
			return secret.URL + "/img.raw"
		}
		return ""
	})
	proxyURL, _ := url.Parse(proxy.URL)
	f := testFetcher(t)
	f.HTTPClient = &http.Client{Transport: &http.Transport{Proxy: func(r *http.Request) (*url.URL, error) {
		if r.URL.Hostname() == "logs.example.com" {
			return proxyURL, nil
		}
		return nil, nil // as NO_PROXY=127.0.0.1 would
	}}}
	hosts := &Hosts{}
	hosts.Allow(mustPattern(t, "logs.example.com"))
	hosts.Allow(mustPattern(t, "127.0.0.1"))

	dest := filepath.Join(t.TempDir(), "img.raw")
	res, err := f.Fetch(context.Background(), Request{URL: "http://logs.example.com/img.raw", Files: files(f, "img.raw", dest), Hosts: hosts})
	if err != nil {
		t.Fatalf("Fetch through the proxy: %v", err)
	}
	checkFetched(t, f, res, dest, image)
	_, err = f.Fetch(context.Background(), Request{URL: "http://logs.example.com/to-secret", Files: files(f, "img2.raw", dest), Hosts: hosts})
	if !errors.Is(err, ErrInternalAddress) {
		t.Fatalf("Fetch redirected past the proxy to another port of its host = %v, want ErrInternalAddress", err)
	}
	if n := len(secret.seen()); n != 0 {
		t.Errorf("the service beside the proxy got %d requests", n)
	}
}
