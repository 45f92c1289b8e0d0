package servicecidr

import (
	"net/netip"
	"slices"
)

// PrefixUsage is the occupancy of one ServiceCIDR prefix, as its per-CIDR allocator counts it.
type PrefixUsage struct {
	// Prefix is the prefix, as in spec.cidrs (masked, canonical).
	Prefix netip.Prefix
	// Used is the number of allocated addresses Prefix can allocate (its network and IPv4
	// broadcast address excluded), whichever prefix each was allocated through, so that an
	// address in two overlapping prefixes counts in both.
	Used uint64
	// Free is the number of addresses of Prefix that are not allocated, whether or not the
	// prefix is ready.
	Free uint64
	// Ready reports whether some ServiceCIDR holding Prefix is ready.
	Ready bool
}

// Usage returns the occupancy of every prefix the Allocator has a per-CIDR allocator for, ready or
// not, in ascending order (by address, then shorter first). A prefix appears once Run has created
// its allocator and disappears once no ServiceCIDR holds it any more; ServiceCIDRs that share a
// prefix share its entry.
//
// As in kube-apiserver, where each ServiceCIDR prefix has an allocator of its own, prefixes are
// counted separately: unlike Used and Free of the Allocator, which count every address once, the
// sums over Usage count an address once per prefix that contains it. Usage holds no lock while it
// asks the per-CIDR allocators and makes no API call.
func (a *Allocator) Usage() []PrefixUsage {
	vs := a.views(func(*entry) bool { return true })
	out := make([]PrefixUsage, len(vs))
	for i, v := range vs {
		out[i] = PrefixUsage{Prefix: v.prefix, Used: v.alloc.Used(), Free: v.alloc.Free(), Ready: v.ready}
	}
	slices.SortFunc(out, func(x, y PrefixUsage) int { return comparePrefix(x.Prefix, y.Prefix) })
	return out
}

// PrefixOf returns the prefix through which Allocate reserves ip and Release frees it: the
// outermost prefix of a ready ServiceCIDR that can allocate ip, or, if none is ready, the
// outermost known prefix that can. It reports false if no prefix the Allocator knows can allocate
// ip (or ip is invalid). Like Usage, it is what kube-apiserver labels an allocation's metrics
// with: the prefix of the allocator that made it.
func (a *Allocator) PrefixOf(ip netip.Addr) (netip.Prefix, bool) {
	if !ip.IsValid() {
		return netip.Prefix{}, false
	}
	vs := a.containing(ip)
	if len(vs) == 0 {
		return netip.Prefix{}, false
	}
	return home(vs).prefix, true
}
