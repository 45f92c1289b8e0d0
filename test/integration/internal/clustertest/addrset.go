package clustertest

import (
	"net/netip"
	"slices"

	"k8s.io/apimachinery/pkg/util/sets"
)

// Addrs returns the addresses of s in ascending order. (sets.List needs an ordered type, and
// netip.Addr orders by its Compare method.)
func Addrs(s sets.Set[netip.Addr]) []netip.Addr {
	ips := s.UnsortedList()
	slices.SortFunc(ips, netip.Addr.Compare)
	return ips
}

// Sorted returns the addresses of s in ascending order, as strings (for readable diffs).
func Sorted(s sets.Set[netip.Addr]) []string {
	ips := Addrs(s)
	out := make([]string, len(ips))
	for i, ip := range ips {
		out[i] = ip.String()
	}
	return out
}

// Within returns the addresses of s that have a slot in a bitmap of r ([InBitmapWindow]).
func Within(s sets.Set[netip.Addr], r netip.Prefix) sets.Set[netip.Addr] {
	out := sets.New[netip.Addr]()
	for ip := range s {
		if InBitmapWindow(r, ip) {
			out.Insert(ip)
		}
	}
	return out
}
