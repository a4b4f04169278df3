package nat64

import (
	"net/netip"
	"strings"
	"testing"
)

// TestIPv4: the addresses of RFC 6052's examples (section 2.4), each of
// 192.0.2.33 under a prefix of every length, give it back.
func TestIPv4(t *testing.T) {
	want := netip.MustParseAddr("192.0.2.33")
	for _, tt := range []struct{ prefix, addr string }{
		{"2001:db8::/32", "2001:db8:c000:221::"},
		{"2001:db8:100::/40", "2001:db8:1c0:2:21::"},
		{"2001:db8:122::/48", "2001:db8:122:c000:2:2100::"},
		{"2001:db8:122:300::/56", "2001:db8:122:3c0:0:221::"},
		{"2001:db8:122:344::/64", "2001:db8:122:344:c0:2:2100:0"},
		{"2001:db8:122:344::/96", "2001:db8:122:344::192.0.2.33"},
		{"64:ff9b::/96", "64:ff9b::192.0.2.33"},
	} {
		p := netip.MustParsePrefix(tt.prefix)
		if err := CheckPrefix(p); err != nil {
			t.Errorf("CheckPrefix(%s): %v", p, err)
		}
		got, ok, valid := IPv4(p, netip.MustParseAddr(tt.addr))
		if got != want || !ok || !valid {
			t.Errorf("IPv4(%s, %s) = %v, %v, %v; want %v", tt.prefix, tt.addr, got, ok, valid, want)
		}
	}
}

// TestIPv4Outside: an address outside the prefix carries nothing; one inside
// whose bits 64 to 71 are set is no translator's.
func TestIPv4Outside(t *testing.T) {
	p := netip.MustParsePrefix("2001:db8:122::/48")
	if _, ok, _ := IPv4(p, netip.MustParseAddr("2001:db8:123:c000:2:2100::")); ok {
		t.Error("an address outside the prefix is in it")
	}
	if _, ok, valid := IPv4(p, netip.MustParseAddr("2001:db8:122:c000:ff02:2100::")); !ok || valid {
		t.Errorf("an address with bits 64 to 71 set: in %v, valid %v; want in, not valid", ok, valid)
	}
}

func TestCheckPrefix(t *testing.T) {
	for _, tt := range []struct{ prefix, want string }{
		{"192.0.2.0/24", "not an IPv6 prefix"},
		{"::ffff:c000:200/120", "not an IPv6 prefix"},
		{"2001:db8:64::/80", "is /80; a NAT64 prefix is /32, /40, /48, /56, /64 or /96"},
		{"2001:db8:64::/33", "is /33"},
		{"2001:db8:64::1/96", "has bits set past /96; write 2001:db8:64::/96"},
		{"::/96", "overlaps ::/96"},
		{"fe80::/64", "overlaps fe80::/10"},
		{"ff05::/32", "overlaps ff00::/8"},
	} {
		err := CheckPrefix(netip.MustParsePrefix(tt.prefix))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("CheckPrefix(%s) = %v, want an error saying %q", tt.prefix, err, tt.want)
		}
	}
	for _, ok := range []string{"64:ff9b:1::/48", "64:ff9b:1::/96", "fd00:64::/96", "2001:db8:64::/64"} {
		if err := CheckPrefix(netip.MustParsePrefix(ok)); err != nil {
			t.Errorf("CheckPrefix(%s): %v", ok, err)
		}
	}
}
