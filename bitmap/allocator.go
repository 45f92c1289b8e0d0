package bitmap

import (
	"context"
	"fmt"
	"iter"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/internal/allocbase"
	"github.com/kube-ipam/clusterip/internal/bitset"
	"github.com/kube-ipam/clusterip/internal/ipmath"
)

// MaxIPv6Slots is the number of addresses an IPv6 bitmap holds at most, as in kube-apiserver:
// network+1 … network+0xffff. Addresses above them are outside the bitmap's range.
const MaxIPv6Slots = 65535

// MinIPv4Bits is the shortest IPv4 prefix a bitmap accepts: a /8 already takes 2 MiB.
// A Persistent allocator accepts less: see MaxPersistentHostBits.
const MinIPv4Bits = 8

// MaxPersistentHostBits is the most host bits an IPv4 range of a Persistent allocator may have:
// 20, a /12, kube-apiserver's own cap on --service-cluster-ip-range for its bitmap. A wider range
// fits in memory (New accepts down to MinIPv4Bits) but its snapshot, up to 2 MiB, is more than
// kube-apiserver would ever store or read at its key, and more than etcd's default request limit
// (1.5 MiB) for a /8. IPv6 ranges need no cap: their bitmap holds at most MaxIPv6Slots.
const MaxPersistentHostBits = 20

var _ allocator.Interface = (*Allocator)(nil)

// Allocator is the in-memory bitmap allocator of one Service CIDR. Its context arguments are
// ignored: no method blocks.
//
// An Allocator is safe for concurrent use. Create one with New; the zero Allocator is not usable.
type Allocator struct {
	cidr   netip.Prefix
	family corev1.IPFamily
	max    int            // number of slots
	band   int            // offsets [0, band) form the static band
	base   ipmath.Uint128 // the address of offset 0: network+1

	mu   sync.Mutex // guards set and rand
	set  *bitset.Set
	rand *rand.Rand
}

// New returns an empty allocator for cidr. cidr must pass allocator.CheckPrefix and, for IPv4, be
// no shorter than MinIPv4Bits; otherwise New returns an *allocator.PrefixError. A nil Option is an
// error matching allocator.ErrInvalid.
func New(cidr netip.Prefix, opts ...Option) (*Allocator, error) {
	o, err := buildOptions(opts)
	if err != nil {
		return nil, err
	}
	return newAllocator(cidr, o.rand)
}

func newAllocator(cidr netip.Prefix, r *rand.Rand) (*Allocator, error) {
	if err := allocator.CheckPrefix(cidr); err != nil {
		return nil, err
	}
	if cidr.Addr().Is4() && cidr.Bits() < MinIPv4Bits {
		return nil, &allocator.PrefixError{Prefix: cidr, Reason: fmt.Sprintf("too large for a bitmap (shorter than /%d)", MinIPv4Bits)}
	}
	size := ipmath.Size(cidr)
	family := corev1.IPv4Protocol
	if cidr.Addr().Is6() {
		family = corev1.IPv6Protocol
		size = min(size, MaxIPv6Slots)
	}
	return &Allocator{
		cidr:   cidr,
		family: family,
		max:    int(size),
		band:   int(min(ipmath.BandOffset(cidr), size)),
		base:   ipmath.FromAddr(cidr.Addr()).Add64(1),
		set:    bitset.New(int(size)),
		rand:   r,
	}, nil
}

// Clone returns an independent allocator with the same range and allocations, and a random source
// seeded from a's.
func (a *Allocator) Clone() *Allocator {
	a.mu.Lock()
	defer a.mu.Unlock()
	return &Allocator{
		cidr:   a.cidr,
		family: a.family,
		max:    a.max,
		band:   a.band,
		base:   a.base,
		set:    a.set.Clone(),
		rand:   rand.New(rand.NewPCG(a.rand.Uint64(), a.rand.Uint64())),
	}
}

// CIDR returns the range the allocator serves.
func (a *Allocator) CIDR() netip.Prefix { return a.cidr }

// Family returns IPv4Protocol or IPv6Protocol.
func (a *Allocator) Family() corev1.IPFamily { return a.family }

// Size returns the number of addresses the allocator can hand out, Used()+Free(): the usable
// addresses of the range, 254 for a /24, but at most 65535 for IPv6, whose bitmap is capped as
// kube-apiserver caps it (ipaddress.Allocator.Size counts every usable address).
func (a *Allocator) Size() uint64 { return uint64(a.max) }

// StaticBand returns the number of offsets, counted from the start of the range, that form the
// static band AllocateNext uses only when the dynamic band is full (KEP-3070).
func (a *Allocator) StaticBand() uint64 { return uint64(a.band) }

// offsetOf returns the slot of ip, or an error if ip is bad input or outside the bitmap. It is
// ipmath.Offset with the range's constants precomputed, for the hot path.
func (a *Allocator) offsetOf(ip netip.Addr) (int, error) {
	if err := allocator.CheckAddr(ip); err != nil {
		return 0, err
	}
	if d := ipmath.FromAddr(ip).Sub(a.base); ip.Is4() == a.cidr.Addr().Is4() && d.Hi == 0 && d.Lo < uint64(a.max) {
		return int(d.Lo), nil // an address below base wraps around to a huge d
	}
	return 0, &allocator.NotInRangeError{IP: ip, Range: a.cidr}
}

func (a *Allocator) addrAt(off int) netip.Addr {
	return a.base.Add64(uint64(off)).Addr(a.cidr.Addr().Is4())
}

// Allocate reserves ip, which may lie in either band. It returns allocator.ErrAllocated if ip is
// taken, an *allocator.NotInRangeError if ip is not one of the bitmap's slots (outside the range,
// the network or IPv4 broadcast address, or above the IPv6 cap) and an *allocator.AddrError for an
// invalid, zoned or IPv4-mapped ip.
func (a *Allocator) Allocate(_ context.Context, ip netip.Addr, _ allocator.Owner) error {
	off, err := a.offsetOf(ip)
	if err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.set.Add(off) {
		return allocator.ErrAllocated
	}
	return nil
}

// AllocateNext reserves a free address and returns it: one of the dynamic band if any is free,
// else one of the static band. Inside a band it starts at a random offset and takes the next free
// one, wrapping around. If the bitmap is full it returns the zero Addr and allocator.ErrFull.
// It does not allocate memory and costs a few word operations at any fill.
func (a *Allocator) AllocateNext(_ context.Context, _ allocator.Owner) (netip.Addr, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	off, ok := a.pickLocked()
	if !ok {
		return netip.Addr{}, allocator.ErrFull
	}
	a.set.Add(off)
	return a.addrAt(off), nil
}

// AllocateNextSkipping is AllocateNext that passes over the free addresses skip refuses: it
// visits the free addresses in AllocateNext's order (the dynamic band from a random start,
// wrapping, then the static band) and reserves the first for which skip reports false, leaving
// the refused ones free. If every free address is refused, or none is free, it returns the zero
// Addr and allocator.ErrFull and changes nothing. A nil skip refuses none. skip is called with
// the allocator locked, at most once per free address, so it must be quick and must not call a;
// the cost is one AllocateNext step per address refused.
//
// A DualWrite allocator passes its primary's Has, so that it never sets, even for a moment, the
// bit of an address the primary holds: another bitmap reader would find that bit taken.
func (a *Allocator) AllocateNextSkipping(_ context.Context, skip func(netip.Addr) bool) (netip.Addr, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	off, ok := a.pickSkippingLocked(skip)
	if !ok {
		return netip.Addr{}, allocator.ErrFull
	}
	a.set.Add(off)
	return a.addrAt(off), nil
}

// pickLocked chooses the offset AllocateNext would take.
func (a *Allocator) pickLocked() (int, bool) {
	return a.pickSkippingLocked(nil)
}

// pickSkippingLocked chooses the offset AllocateNextSkipping would take.
func (a *Allocator) pickSkippingLocked(skip func(netip.Addr) bool) (int, bool) {
	if a.set.Len() >= a.max {
		return 0, false
	}
	var skipOff func(uint64) bool
	if skip != nil {
		skipOff = func(off uint64) bool { return skip(a.addrAt(int(off))) }
	}
	off, ok := ipmath.PickOffsetSkipping(a.set, uint64(a.max), uint64(a.band), a.rand, skipOff)
	return int(off), ok
}

// Release frees ip. It returns nil if ip is not allocated or outside the bitmap, and an
// *allocator.AddrError for an invalid, zoned or IPv4-mapped ip.
func (a *Allocator) Release(_ context.Context, ip netip.Addr) error {
	off, err := a.offsetOf(ip)
	if err != nil {
		return allocbase.ReleaseNotServed(err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.set.Remove(off)
	return nil
}

// Has reports whether ip is allocated.
func (a *Allocator) Has(ip netip.Addr) bool {
	off, err := a.offsetOf(ip)
	if err != nil {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.set.Has(off)
}

// All yields the allocated addresses in ascending order, as they were when iteration started.
func (a *Allocator) All() iter.Seq[netip.Addr] {
	a.mu.Lock()
	offs := slices.Collect(a.set.All())
	a.mu.Unlock()
	return func(yield func(netip.Addr) bool) {
		for _, off := range offs {
			if !yield(a.addrAt(off)) {
				return
			}
		}
	}
}

// Used returns the number of allocated addresses.
func (a *Allocator) Used() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return uint64(a.set.Len())
}

// Free returns the number of addresses still free.
func (a *Allocator) Free() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return uint64(a.max - a.set.Len())
}

// DryRun returns a view of a that checks calls against its current state and changes nothing.
func (a *Allocator) DryRun() allocator.Interface { return dryRun{allocbase.DryRunView{R: a}, a} }

// Close does nothing and returns nil; an in-memory allocator holds no resources.
func (a *Allocator) Close() error { return nil }
