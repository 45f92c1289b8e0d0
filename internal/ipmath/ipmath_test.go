package ipmath

import (
	"math"
	"net/netip"
	"testing"
)

func TestSize(t *testing.T) {
	tests := []struct {
		cidr string
		want uint64
	}{
		{"10.0.0.0/24", 254},
		{"10.0.0.0/30", 2},
		{"10.0.0.0/31", 0},
		{"10.0.0.0/32", 0},
		{"10.0.0.0/15", 131070},
		{"10.96.0.0/12", 1048574},
		{"0.0.0.0/0", 1<<32 - 2},
		{"0.0.0.0/1", 1<<31 - 2},
		{"::/1", math.MaxUint64},
		{"fd00::/112", 65535},
		{"fd00::/108", 1<<20 - 1},
		{"fd00::/127", 1},
		{"fd00::/128", 0},
		{"fd00::/65", 1<<63 - 1},
		{"fd00::/64", math.MaxUint64},
		{"fd00::/63", math.MaxUint64},
		{"::/0", math.MaxUint64},
	}
	for _, tt := range tests {
		if got := Size(netip.MustParsePrefix(tt.cidr)); got != tt.want {
			t.Errorf("Size(%s) = %d, want %d", tt.cidr, got, tt.want)
		}
	}
	if got := Size(netip.Prefix{}); got != 0 {
		t.Errorf("Size(zero Prefix) = %d, want 0", got)
	}
}

func TestBandOffset(t *testing.T) {
	tests := []struct {
		cidr string
		want uint64
	}{
		{"10.0.0.0/30", 0},
		{"10.0.0.0/28", 0},
		{"10.0.0.0/27", 16},
		{"10.0.0.0/26", 16},
		{"10.0.0.0/24", 16},
		{"10.0.0.0/23", 32},
		{"10.0.0.0/22", 64},
		{"10.0.0.0/21", 128},
		{"10.0.0.0/20", 256},
		{"10.96.0.0/12", 256},
		{"128.0.0.0/2", 256},
		// kube-apiserver's range size is 0 past 31 (IPv4) or 127 (IPv6) host bits, so its band is too.
		{"0.0.0.0/1", 0},
		{"0.0.0.0/0", 0},
		{"::/1", 0},
		{"::/0", 0},
		{"::/2", 256},
		{"fd00::/124", 0},
		{"fd00::/122", 16},
		{"fd00::/118", 64},
		{"fd00::/108", 256},
		{"fd00::/64", 256},
	}
	for _, tt := range tests {
		if got := BandOffset(netip.MustParsePrefix(tt.cidr)); got != tt.want {
			t.Errorf("BandOffset(%s) = %d, want %d", tt.cidr, got, tt.want)
		}
	}
}

func TestOffsetAndAddrAt(t *testing.T) {
	tests := []struct {
		cidr, ip string
		off      uint64
		ok       bool
	}{
		{"10.96.0.0/24", "10.96.0.1", 0, true},
		{"10.96.0.0/24", "10.96.0.254", 253, true},
		{"10.96.0.0/24", "10.96.0.0", 0, false},   // network
		{"10.96.0.0/24", "10.96.0.255", 0, false}, // broadcast
		{"10.96.0.0/24", "10.96.1.1", 0, false},
		{"10.96.0.0/24", "fd00::1", 0, false},
		{"10.96.0.0/12", "10.111.255.254", 1048573, true},
		{"0.0.0.0/0", "255.255.255.254", 1<<32 - 3, true},
		{"fd00::/112", "fd00::ffff", 65534, true}, // all-ones is usable in IPv6
		{"fd00::/112", "fd00::", 0, false},
		{"fd00::/127", "fd00::1", 0, true},
		{"fd00::/64", "fd00::ffff:ffff:ffff:ffff", math.MaxUint64 - 1, true},
		{"fd00::/63", "fd00:0:0:1::", 0, false}, // offset beyond uint64
		{"fd00::/64", "10.0.0.1", 0, false},
	}
	for _, tt := range tests {
		p, ip := netip.MustParsePrefix(tt.cidr), netip.MustParseAddr(tt.ip)
		off, ok := Offset(p, ip)
		if off != tt.off || ok != tt.ok {
			t.Errorf("Offset(%s, %s) = %d, %v; want %d, %v", tt.cidr, tt.ip, off, ok, tt.off, tt.ok)
		}
		if tt.ok {
			if got, ok := AddrAt(p, tt.off); !ok || got != ip {
				t.Errorf("AddrAt(%s, %d) = %v, %v; want %v, true", tt.cidr, tt.off, got, ok, ip)
			}
		}
	}
	if _, ok := AddrAt(netip.MustParsePrefix("10.0.0.0/24"), 254); ok {
		t.Errorf("AddrAt(10.0.0.0/24, 254) reported ok for the broadcast address")
	}
}

func TestUsable(t *testing.T) {
	tests := []struct {
		cidr, ip string
		want     bool
	}{
		{"10.96.0.0/24", "10.96.0.1", true},
		{"10.96.0.0/24", "10.96.0.254", true},
		{"10.96.0.0/24", "10.96.0.0", false},   // network
		{"10.96.0.0/24", "10.96.0.255", false}, // broadcast
		{"10.96.0.0/24", "10.96.1.1", false},
		{"10.96.0.0/24", "fd00::1", false},
		{"10.96.0.0/31", "10.96.0.1", false},
		{"10.96.0.0/32", "10.96.0.0", false},
		{"fd00::/112", "fd00::ffff", true}, // all-ones is usable in IPv6
		{"fd00::/112", "fd00::", false},
		{"fd00::/127", "fd00::1", true},
		{"fd00::/128", "fd00::", false},
		{"fd00::/63", "fd00:0:0:1::", true}, // beyond a uint64 offset, but usable
		{"fd00::/64", "10.0.0.1", false},
		{"fd00::/64", "fd00::1%eth0", false},
	}
	for _, tt := range tests {
		p, ip := netip.MustParsePrefix(tt.cidr), netip.MustParseAddr(tt.ip)
		if got := Usable(p, ip); got != tt.want {
			t.Errorf("Usable(%s, %s) = %v, want %v", tt.cidr, tt.ip, got, tt.want)
		}
		if off, ok := Offset(p, ip); ok && !Usable(p, ip) {
			t.Errorf("Offset(%s, %s) = %d, true, but Usable = false", tt.cidr, tt.ip, off)
		}
	}
	if Usable(netip.Prefix{}, netip.MustParseAddr("10.0.0.1")) || Usable(netip.MustParsePrefix("10.0.0.0/24"), netip.Addr{}) {
		t.Errorf("Usable of a zero Prefix or Addr = true, want false")
	}
}

func TestLast(t *testing.T) {
	tests := []struct{ cidr, want string }{
		{"10.96.0.0/24", "10.96.0.255"},
		{"10.96.0.0/12", "10.111.255.255"},
		{"10.0.0.1/32", "10.0.0.1"},
		{"0.0.0.0/0", "255.255.255.255"},
		{"fd00::/64", "fd00::ffff:ffff:ffff:ffff"},
		{"::/0", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"},
		{"fd00::1/128", "fd00::1"},
	}
	for _, tt := range tests {
		if got := Last(netip.MustParsePrefix(tt.cidr)); got != netip.MustParseAddr(tt.want) {
			t.Errorf("Last(%s) = %v, want %s", tt.cidr, got, tt.want)
		}
	}
}

func TestUint128RoundTripsAndCarries(t *testing.T) {
	ip := netip.MustParseAddr("fd00::ffff:ffff:ffff:ffff")
	if got := FromAddr(ip).Add64(1).Addr(false); got != netip.MustParseAddr("fd00:0:0:1::") {
		t.Errorf("carry into the high word: got %v", got)
	}
	if got := FromAddr(netip.MustParseAddr("fd00:0:0:1::")).Sub(FromAddr(ip)); got != (Uint128{Lo: 1}) {
		t.Errorf("borrow from the high word: got %+v", got)
	}
	for _, s := range []string{"0.0.0.0", "10.96.0.1", "255.255.255.255", "::", "fd00::1", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"} {
		a := netip.MustParseAddr(s)
		if got := FromAddr(a).Addr(a.Is4()); got != a {
			t.Errorf("FromAddr(%v).Addr() = %v", a, got)
		}
	}
	if (Uint128{Hi: 1}).Cmp(Uint128{Lo: math.MaxUint64}) != 1 || (Uint128{Lo: 1}).Cmp(Uint128{Lo: 1}) != 0 {
		t.Errorf("Cmp orders by the high word first")
	}
	if got := (Uint128{Hi: 1, Lo: 0}).Rsh(1); got != (Uint128{Lo: 1 << 63}) {
		t.Errorf("Rsh(1) = %+v", got)
	}
	if got := (Uint128{Hi: 4}).Rsh(66); got != (Uint128{Lo: 1}) {
		t.Errorf("Rsh(66) = %+v", got)
	}
}
