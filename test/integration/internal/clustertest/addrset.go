package clustertest

import (
	"net/netip"
	"slices"
)

// AddrSet is a set of addresses. The zero AddrSet (nil) is empty and can be read, not written.
type AddrSet map[netip.Addr]bool

// SetOf returns the set of ips.
func SetOf(ips ...netip.Addr) AddrSet {
	s := AddrSet{}
	for _, ip := range ips {
		s[ip] = true
	}
	return s
}

// Union returns a new set holding s and every address of ips.
func (s AddrSet) Union(ips ...netip.Addr) AddrSet {
	out := s.Clone()
	for _, ip := range ips {
		out[ip] = true
	}
	return out
}

// Clone returns a copy of s.
func (s AddrSet) Clone() AddrSet {
	out := AddrSet{}
	for ip := range s {
		out[ip] = true
	}
	return out
}

// Within returns the addresses of s that have a slot in a bitmap of r ([InBitmapWindow]).
func (s AddrSet) Within(r netip.Prefix) AddrSet {
	out := AddrSet{}
	for ip := range s {
		if InBitmapWindow(r, ip) {
			out[ip] = true
		}
	}
	return out
}

// Equal reports whether s and o hold the same addresses.
func (s AddrSet) Equal(o AddrSet) bool {
	if len(s) != len(o) {
		return false
	}
	for ip := range s {
		if !o[ip] {
			return false
		}
	}
	return true
}

// Addrs returns the addresses of s in ascending order.
func (s AddrSet) Addrs() []netip.Addr {
	ips := make([]netip.Addr, 0, len(s))
	for ip := range s {
		ips = append(ips, ip)
	}
	slices.SortFunc(ips, netip.Addr.Compare)
	return ips
}

// Sorted returns the addresses of s in ascending order, as strings (for readable diffs).
func (s AddrSet) Sorted() []string {
	ips := s.Addrs()
	out := make([]string, len(ips))
	for i, ip := range ips {
		out[i] = ip.String()
	}
	return out
}
