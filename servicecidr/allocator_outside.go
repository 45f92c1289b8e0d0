package servicecidr

import (
	"context"
	"net/netip"

	"github.com/kube-ipam/clusterip/allocator"
)

// AllocateNextOutside is AllocateNext restricted to the ready ServiceCIDR prefixes that are not
// inside p: a prefix equal to p or nested in it is never chosen, while one that contains p (or
// overlaps it without nesting) may still give an address of p. It returns allocator.ErrFull when
// every ready prefix outside p is full, or when the ready prefixes are all inside p. A DualWrite
// allocator uses it to serve from the other ServiceCIDRs once the bitmap of the flag range p has no
// free bit, rather than be offered addresses of p whose bits are held. A zero p excludes nothing.
func (a *Allocator) AllocateNextOutside(ctx context.Context, owner allocator.Owner, p netip.Prefix) (netip.Addr, error) {
	return a.allocateNext(ctx, owner, false, p.Masked())
}

// prefixWithin reports whether every address of q lies in p.
func prefixWithin(q, p netip.Prefix) bool {
	return q.Bits() >= p.Bits() && p.Contains(q.Addr())
}
