package bitmap

import (
	"context"
	"net/netip"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/internal/allocbase"
)

// persistentDryRun answers as its Persistent's last known state would and changes nothing.
type persistentDryRun struct {
	allocbase.DryRunView
	p *Persistent
}

func (d persistentDryRun) Allocate(ctx context.Context, ip netip.Addr, owner allocator.Owner) error {
	return d.p.current().DryRun().Allocate(ctx, ip, owner)
}

func (d persistentDryRun) AllocateNext(ctx context.Context, owner allocator.Owner) (netip.Addr, error) {
	return d.p.current().DryRun().AllocateNext(ctx, owner)
}

func (d persistentDryRun) DryRun() allocator.Interface { return d }
