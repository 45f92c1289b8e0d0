package ipmath

import (
	"encoding/binary"
	"math"
	"math/bits"
	"net/netip"
)

// HostBits returns the number of host bits of p: 32 or 128 minus the prefix length.
// An invalid p returns 0.
func HostBits(p netip.Prefix) int {
	if !p.IsValid() {
		return 0
	}
	return p.Addr().BitLen() - p.Bits()
}

// Size returns the number of usable addresses of p, as kube-apiserver counts them: the network
// address is never usable, and neither is the IPv4 broadcast address; the IPv6 all-ones address is.
// So a /24 has 254, a /31 or /32 none, an IPv6 /112 65535, a /127 one and a /128 none. Sizes that
// do not fit in a uint64 (IPv6 prefixes shorter than /64) saturate at math.MaxUint64.
func Size(p netip.Prefix) uint64 {
	if !p.IsValid() {
		return 0
	}
	hb := HostBits(p)
	if hb >= 64 {
		// 2^hb - 1 (IPv6, no broadcast) is at least 2^64 - 1.
		return math.MaxUint64
	}
	n := uint64(1) << hb
	if p.Addr().Is4() {
		if n <= 2 {
			return 0
		}
		return n - 2
	}
	return n - 1
}

// BandOffset returns the number of offsets at the start of p reserved for the static band
// (KEP-3070): 0 when p has at most 16 addresses, else 2^hostbits/16 clamped to [16, 256]. So a /28
// has 0, a /27 and a /24 16, a /22 64, a /20 and anything wider 256, except a /0 and a /1, which
// have 0 as in kube-apiserver (whose range size is 0 past 31 IPv4 or 127 IPv6 host bits); an IPv6
// /124 0, /122 16 and /118 64, and likewise 0 for ::/0 and ::/1. AllocateNext prefers offsets at or
// above it.
func BandOffset(p netip.Prefix) uint64 {
	const (
		minOffset = 16
		maxOffset = 256
		step      = 16
	)
	if !p.IsValid() {
		return 0
	}
	hb := HostBits(p)
	if hb <= 4 { // 2^hb <= 16
		return 0
	}
	if hb >= p.Addr().BitLen()-1 { // kube-apiserver's range size is 0 for a /0 and a /1
		return 0
	}
	if hb >= 12 { // 2^hb/16 >= 256
		return maxOffset
	}
	return max(uint64(1)<<hb/step, minOffset)
}

// Network returns the network address of p.
func Network(p netip.Prefix) netip.Addr { return p.Masked().Addr() }

// Last returns the last address of p: the IPv4 broadcast address or the IPv6 all-ones address.
func Last(p netip.Prefix) netip.Addr {
	if !p.IsValid() {
		return netip.Addr{}
	}
	u := FromAddr(Network(p))
	hb := HostBits(p)
	return u.Or(Uint128{}.Not().Rsh(uint(128 - hb)).maskTo(p.Addr().Is4())).Addr(p.Addr().Is4())
}

// Usable reports whether p can hand out ip: ip lies inside p (so it is valid, unzoned and of p's
// family) and is neither p's network address nor, for IPv4, its broadcast address. The IPv6
// all-ones address is usable. Usable is the one home of this rule; unlike [Offset] it holds for
// every address of an IPv6 prefix shorter than /64 too.
func Usable(p netip.Prefix, ip netip.Addr) bool {
	_, ok := distance(p, ip)
	return ok
}

// Offset returns the offset of ip in p (ip minus the network address minus one) and reports
// whether ip is a usable address of p (see [Usable]) whose offset fits in a uint64. The network
// address, the IPv4 broadcast address, addresses outside p and addresses of the other family
// report false.
func Offset(p netip.Prefix, ip netip.Addr) (uint64, bool) {
	d, ok := distance(p, ip)
	if !ok || d.Hi != 0 {
		return 0, false
	}
	return d.Lo - 1, true
}

// distance returns ip minus the network address of p and reports whether ip is usable in p.
func distance(p netip.Prefix, ip netip.Addr) (Uint128, bool) {
	if !p.IsValid() || !ip.IsValid() || ip.Zone() != "" || !p.Contains(ip) {
		return Uint128{}, false
	}
	d := FromAddr(ip).Sub(FromAddr(Network(p)))
	if d == (Uint128{}) {
		return Uint128{}, false // the network address
	}
	if ip.Is4() && d.Lo > Size(p) {
		return Uint128{}, false // the broadcast address
	}
	return d, true
}

// AddrAt returns the address at offset off of p (the network address plus one plus off) and
// reports whether it is a usable address of p.
func AddrAt(p netip.Prefix, off uint64) (netip.Addr, bool) {
	if !p.IsValid() || off >= Size(p) {
		return netip.Addr{}, false
	}
	is4 := p.Addr().Is4()
	return FromAddr(Network(p)).Add64(off).Add64(1).Addr(is4), true
}

// Uint128 is an unsigned 128-bit integer, the numeric value of an address.
// The zero value is 0. Uint128 is a comparable value.
type Uint128 struct {
	Hi, Lo uint64
}

// FromAddr returns the numeric value of ip; an IPv4 address is its 32-bit value.
func FromAddr(ip netip.Addr) Uint128 {
	if ip.Is4() {
		b := ip.As4()
		return Uint128{Lo: uint64(binary.BigEndian.Uint32(b[:]))}
	}
	b := ip.As16()
	return Uint128{Hi: binary.BigEndian.Uint64(b[:8]), Lo: binary.BigEndian.Uint64(b[8:])}
}

// Addr returns u as an IPv4 address (its low 32 bits) if is4, else as an IPv6 address.
func (u Uint128) Addr(is4 bool) netip.Addr {
	if is4 {
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], uint32(u.Lo))
		return netip.AddrFrom4(b)
	}
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], u.Hi)
	binary.BigEndian.PutUint64(b[8:], u.Lo)
	return netip.AddrFrom16(b)
}

// Add64 returns u+n, wrapping modulo 2^128.
func (u Uint128) Add64(n uint64) Uint128 {
	lo, carry := bits.Add64(u.Lo, n, 0)
	return Uint128{Hi: u.Hi + carry, Lo: lo}
}

// Sub returns u-v, wrapping modulo 2^128.
func (u Uint128) Sub(v Uint128) Uint128 {
	lo, borrow := bits.Sub64(u.Lo, v.Lo, 0)
	return Uint128{Hi: u.Hi - v.Hi - borrow, Lo: lo}
}

// Or returns u|v.
func (u Uint128) Or(v Uint128) Uint128 { return Uint128{Hi: u.Hi | v.Hi, Lo: u.Lo | v.Lo} }

// Not returns ^u.
func (u Uint128) Not() Uint128 { return Uint128{Hi: ^u.Hi, Lo: ^u.Lo} }

// Rsh returns u>>n.
func (u Uint128) Rsh(n uint) Uint128 {
	switch {
	case n >= 128:
		return Uint128{}
	case n >= 64:
		return Uint128{Lo: u.Hi >> (n - 64)}
	case n == 0:
		return u
	}
	return Uint128{Hi: u.Hi >> n, Lo: u.Lo>>n | u.Hi<<(64-n)}
}

// Cmp returns -1, 0 or +1 as u is less than, equal to or greater than v.
func (u Uint128) Cmp(v Uint128) int {
	switch {
	case u.Hi < v.Hi:
		return -1
	case u.Hi > v.Hi:
		return 1
	case u.Lo < v.Lo:
		return -1
	case u.Lo > v.Lo:
		return 1
	}
	return 0
}

// maskTo clears the bits above 32 when is4, so that IPv4 host masks stay 32-bit values.
func (u Uint128) maskTo(is4 bool) Uint128 {
	if is4 {
		return Uint128{Lo: u.Lo & math.MaxUint32}
	}
	return u
}
