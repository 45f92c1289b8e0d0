package bitmap

import (
	"context"
	"iter"
	"net/netip"

	corev1 "k8s.io/api/core/v1"

	"github.com/kube-ipam/clusterip/allocator"
)

// dryRun answers as its allocator would and changes nothing.
type dryRun struct{ a *Allocator }

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

func (d dryRun) Release(_ context.Context, ip netip.Addr) error {
	if err := allocator.CheckAddr(ip); err != nil {
		return err
	}
	return nil
}

func (d dryRun) Has(ip netip.Addr) bool      { return d.a.Has(ip) }
func (d dryRun) All() iter.Seq[netip.Addr]   { return d.a.All() }
func (d dryRun) CIDR() netip.Prefix          { return d.a.CIDR() }
func (d dryRun) Family() corev1.IPFamily     { return d.a.Family() }
func (d dryRun) Used() uint64                { return d.a.Used() }
func (d dryRun) Free() uint64                { return d.a.Free() }
func (d dryRun) DryRun() allocator.Interface { return d }
func (d dryRun) Close() error                { return nil }
