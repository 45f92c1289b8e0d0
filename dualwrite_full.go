package clusterip

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/klog/v2"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/ipaddress"
)

// bitWaits are the pauses before each fresh read of the bitmap while AllocateNext waits for a
// bit with no IPAddress object to be given back: 375 ms in all. A peer's dual write holds such a
// bit for one create and one compare-and-swap (its create found the object there, or was
// refused); a Legacy peer's bit stays, and then the wait is the whole cost of the answer ErrFull.
var bitWaits = [...]time.Duration{25 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond}

// allocateGivenBack is AllocateNext's last step once every bit of the window is set and neither
// the primary nor the rechecked addresses had room. A bit with no IPAddress object is held by a
// Legacy peer, by a peer's dual write that will give it back, or by nobody (a leak repair frees);
// while a peer holds it for a moment the range is not full, and answering ErrFull would refuse a
// create while an address is free. When the primary's informer shows such a bit (a window whose
// every bit has an object costs no API call), allocateGivenBack reads every IPAddress object in one
// consistent List (needs WithClient and a mirror that can read its stored state again; callers
// that find the window full at once share Lists, so a tenant who keeps creating Services against
// a full range costs the API server one List at a time, not one per create), finds the
// bits set without an object (at most maxRechecks, leaving out tried), and reads the bitmap again
// after each of bitWaits; the first of those addresses whose bit was given back and whose dual
// write succeeds is returned. Otherwise the answer is full: each address had a bit at an instant
// of the call. A failed read is returned as an error of its own.
func (d *DualWriteAllocator) allocateGivenBack(ctx context.Context, owner allocator.Owner, tried []netip.Addr, full error) (netip.Addr, error) {
	r, ok := d.mirror.(refresher)
	if !ok || d.client == nil || !d.hasBareBit(tried) {
		return netip.Addr{}, full
	}
	since := time.Now()
	if err := r.Refresh(ctx); err != nil {
		return netip.Addr{}, fmt.Errorf("clusterip: the bitmap of %s looked full; reading it again: %w", d.window, err)
	}
	objects, err := d.objects.Since(ctx, since, d.listObjects)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("clusterip: the bitmap of %s looked full; reading the IPAddress objects: %w", d.window, err)
	}
	var bare []netip.Addr // bits set with no object
	for ip := range d.mirror.All() {
		if _, ok := objects[ip]; ok || slices.Contains(tried, ip) {
			continue
		}
		if bare = append(bare, ip); len(bare) == maxRechecks {
			break
		}
	}
	logger := klog.FromContext(ctx)
	for _, wait := range bitWaits {
		if len(bare) == 0 {
			break
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return netip.Addr{}, fmt.Errorf("clusterip: waiting for bits of %s to be given back: %w", d.window, ctx.Err())
		case <-t.C:
		}
		if err := r.Refresh(ctx); err != nil {
			return netip.Addr{}, fmt.Errorf("clusterip: the bitmap of %s looked full; reading it again: %w", d.window, err)
		}
		for i := 0; i < len(bare); {
			ip := bare[i]
			if d.mirror.Has(ip) {
				i++
				continue
			}
			bare = slices.Delete(bare, i, i+1)
			got, err := d.tryAddr(ctx, ip, owner)
			if err != nil {
				return netip.Addr{}, err
			}
			if got {
				logger.V(2).Info("Allocated an address whose bit a peer gave back before answering full", "ip", ip, "owner", owner)
				return ip, nil
			}
		}
	}
	return netip.Addr{}, full
}

// listObjects returns the addresses of the window that have an IPAddress object, read in one
// consistent List.
func (d *DualWriteAllocator) listObjects(ctx context.Context) (map[netip.Addr]struct{}, error) {
	objects := make(map[netip.Addr]struct{})
	err := ipaddress.List(ctx, d.client, func(o *networkingv1.IPAddress) error {
		if ip, err := netip.ParseAddr(o.Name); err == nil && d.InWindow(ip) {
			objects[ip] = struct{}{}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return objects, nil
}

// hasBareBit reports whether the mirror has a bit set, other than those of tried, whose address
// the primary does not hold as far as its informer shows: the cheap test, with no API call, that
// spares a full window whose every bit has an object the List of allocateGivenBack.
func (d *DualWriteAllocator) hasBareBit(tried []netip.Addr) bool {
	for ip := range d.mirror.All() {
		if !d.primary.Has(ip) && !slices.Contains(tried, ip) {
			return true
		}
	}
	return false
}

// tryAddr makes one dual write of ip for owner, as AllocateNext's last steps do for an address a
// read showed free. It reports whether ip is now the owner's: false with a nil error if the
// address was taken meanwhile (its bit set, or its object there), an error otherwise.
func (d *DualWriteAllocator) tryAddr(ctx context.Context, ip netip.Addr, owner allocator.Owner) (bool, error) {
	err := d.mirror.Allocate(ctx, ip, owner)
	switch {
	case errors.Is(err, allocator.ErrAllocated):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("clusterip: set %s in the bitmap of %s: %w", ip, d.window, err)
	}
	if err = d.primary.Allocate(ctx, ip, owner); err != nil {
		err = d.settle(ctx, ip, owner, err)
	}
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, allocator.ErrAllocated):
		return false, nil
	}
	return false, err
}
