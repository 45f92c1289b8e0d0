package bitmap

import (
	"context"
	"net/netip"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/internal/allocbase"
)

// dryRun answers as its allocator would and changes nothing.
type dryRun struct {
	allocbase.DryRunView
	a *Allocator
}

func (d dryRun) Allocate(_ context.Context, ip netip.Addr, _ allocator.Owner) error {
	off, err := d.a.offsetOf(ip)
	if err != nil {
		return err
	}
	d.a.mu.Lock()
	defer d.a.mu.Unlock()
	if d.a.set.Has(off) {
		return allocator.ErrAllocated
	}
	return nil
}

func (d dryRun) AllocateNext(_ context.Context, _ allocator.Owner) (netip.Addr, error) {
	d.a.mu.Lock()
	defer d.a.mu.Unlock()
	off, ok := d.a.pickLocked()
	if !ok {
		return netip.Addr{}, allocator.ErrFull
	}
	return d.a.addrAt(off), nil
}

func (d dryRun) DryRun() allocator.Interface { return d }
