// Package nat64 owns the IPv6 prefixes of NAT64 (RFC 6052): which prefixes a
// translator may use, and the IPv4 address an IPv6 address of one carries.
package nat64

import (
	"fmt"
	"net/netip"
	"slices"
)

// WellKnown is the well-known prefix, 64:ff9b::/96, which every DNS64 may use.
var WellKnown = netip.MustParsePrefix("64:ff9b::/96")

// Lengths are the prefix lengths RFC 6052 defines: the IPv4 address follows
// the prefix, skipping bits 64 to 71.
var Lengths = []int{32, 40, 48, 56, 64, 96}

// reserved are the IPv6 ranges no translator's prefix may cover: what is
// there (loopback, unspecified, IPv4-mapped and -compatible, link-local,
// multicast) is internal whatever IPv4 address its bits spell.
var reserved = []netip.Prefix{
	netip.MustParsePrefix("::/96"),
	netip.MustParsePrefix("::ffff:0:0/96"),
	netip.MustParsePrefix("fe80::/10"),
	netip.MustParsePrefix("ff00::/8"),
}

// CheckPrefix says why p cannot be a NAT64 prefix, or nil: it must be IPv6,
// of a length RFC 6052 defines, without bits set past its length, and clear
// of the reserved ranges.
func CheckPrefix(p netip.Prefix) error {
	if !p.IsValid() || !p.Addr().Is6() || p.Addr().Is4In6() {
		return fmt.Errorf("%s is not an IPv6 prefix", p)
	}
	if !slices.Contains(Lengths, p.Bits()) {
		return fmt.Errorf("%s is /%d; a NAT64 prefix is /32, /40, /48, /56, /64 or /96 (RFC 6052)", p, p.Bits())
	}
	if m := p.Masked(); m != p {
		return fmt.Errorf("%s has bits set past /%d; write %s", p, p.Bits(), m)
	}
	for _, r := range reserved {
		if p.Overlaps(r) {
			return fmt.Errorf("%s overlaps %s, which is never a NAT64 prefix", p, r)
		}
	}
	return nil
}

// IPv4 returns the IPv4 address that a carries when it is an address of p,
// a prefix CheckPrefix accepts (RFC 6052, section 2.2). ok is false when a is
// not in p; in p, valid is false when bits 64 to 71 are not zero, as no
// translator makes such an address.
func IPv4(p netip.Prefix, a netip.Addr) (v4 netip.Addr, ok, valid bool) {
	if !p.Contains(a) {
		return netip.Addr{}, false, false
	}
	b := a.As16()
	if p.Bits() == 96 {
		return netip.AddrFrom4([4]byte(b[12:16])), true, true
	}
	if b[8] != 0 {
		return netip.Addr{}, true, false
	}
	// The IPv4 address's bytes start at the prefix's end, byte 8 skipped.
	var out [4]byte
	at := p.Bits() / 8
	for i := range out {
		if at == 8 {
			at++
		}
		out[i] = b[at]
		at++
	}
	return netip.AddrFrom4(out), true, true
}
