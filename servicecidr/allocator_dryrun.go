package servicecidr

import (
	"context"
	"fmt"
	"iter"
	"net/netip"

	corev1 "k8s.io/api/core/v1"

	"github.com/kube-ipam/clusterip/allocator"
)

// dryRun is the Allocator seen through DryRun: it validates like the Allocator and changes nothing.
type dryRun struct{ a *Allocator }

var _ allocator.Interface = dryRun{}

// Allocate reports what Allocator.Allocate would return for ip, without reserving it.
func (d dryRun) Allocate(ctx context.Context, ip netip.Addr, owner allocator.Owner) error {
	if err := allocator.CheckAddr(ip); err != nil {
		return err
	}
	if err := d.a.readyErr(); err != nil {
		return err
	}
	vs := d.a.containing(ip)
	if len(vs) == 0 {
		return d.a.notInRange(ip)
	}
	for _, v := range vs {
		if v.alloc.Has(ip) {
			return fmt.Errorf("servicecidr: %s: %w", ip, allocator.ErrAllocated)
		}
	}
	for _, v := range vs {
		if v.serving() {
			return v.alloc.DryRun().Allocate(ctx, ip, owner)
		}
	}
	return fmt.Errorf("servicecidr: %s is only in ServiceCIDRs that are not ready: %w", ip, allocator.ErrNotReady)
}

// AllocateNext returns an address Allocator.AllocateNext could return now, without reserving it.
func (d dryRun) AllocateNext(ctx context.Context, owner allocator.Owner) (netip.Addr, error) {
	return d.a.allocateNext(ctx, owner, true)
}

// Release validates ip and does nothing else.
func (d dryRun) Release(_ context.Context, ip netip.Addr) error { return allocator.CheckAddr(ip) }

func (d dryRun) Has(ip netip.Addr) bool      { return d.a.Has(ip) }
func (d dryRun) All() iter.Seq[netip.Addr]   { return d.a.All() }
func (d dryRun) CIDR() netip.Prefix          { return netip.Prefix{} }
func (d dryRun) Family() corev1.IPFamily     { return d.a.family }
func (d dryRun) Used() uint64                { return d.a.Used() }
func (d dryRun) Free() uint64                { return d.a.Free() }
func (d dryRun) DryRun() allocator.Interface { return d }
func (d dryRun) Close() error                { return nil }
