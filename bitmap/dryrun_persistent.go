package bitmap

import (
	"context"
	"iter"
	"net/netip"

	corev1 "k8s.io/api/core/v1"

	"github.com/kube-ipam/clusterip/allocator"
)

// persistentDryRun answers as its Persistent's last known state would and changes nothing.
type persistentDryRun struct{ p *Persistent }

func (d persistentDryRun) Allocate(ctx context.Context, ip netip.Addr, owner allocator.Owner) error {
	return d.p.current().DryRun().Allocate(ctx, ip, owner)
}

func (d persistentDryRun) AllocateNext(ctx context.Context, owner allocator.Owner) (netip.Addr, error) {
	return d.p.current().DryRun().AllocateNext(ctx, owner)
}

func (d persistentDryRun) Release(ctx context.Context, ip netip.Addr) error {
	return d.p.current().DryRun().Release(ctx, ip)
}

func (d persistentDryRun) Has(ip netip.Addr) bool      { return d.p.Has(ip) }
func (d persistentDryRun) All() iter.Seq[netip.Addr]   { return d.p.All() }
func (d persistentDryRun) CIDR() netip.Prefix          { return d.p.CIDR() }
func (d persistentDryRun) Family() corev1.IPFamily     { return d.p.Family() }
func (d persistentDryRun) Used() uint64                { return d.p.Used() }
func (d persistentDryRun) Free() uint64                { return d.p.Free() }
func (d persistentDryRun) DryRun() allocator.Interface { return d }
func (d persistentDryRun) Close() error                { return nil }
