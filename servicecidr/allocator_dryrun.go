package servicecidr

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/internal/allocbase"
)

// dryRun is the Allocator seen through DryRun: it validates like the Allocator and changes nothing.
type dryRun struct {
	allocbase.DryRunView
	a *Allocator
}

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
	return d.a.allocateNext(ctx, owner, true, netip.Prefix{})
}

// AllocateNextOutside returns an address Allocator.AllocateNextOutside could return now, without
// reserving it.
func (d dryRun) AllocateNextOutside(ctx context.Context, owner allocator.Owner, p netip.Prefix) (netip.Addr, error) {
	return d.a.allocateNext(ctx, owner, true, p.Masked())
}

func (d dryRun) DryRun() allocator.Interface { return d }
