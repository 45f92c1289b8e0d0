package ipaddress

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/pager"
	"k8s.io/klog/v2"

	"github.com/kube-ipam/clusterip/allocator"
)

// maxUnseen bounds how many addresses allocateUnseen tries: the addresses a consistent List
// shows free while the index does not are those whose deletes the informer has not delivered
// yet, a handful at most.
const maxUnseen = 16

// allocateUnseen is AllocateNext's last step once the index has no free address, for a call made
// at called. The index follows an informer, which may not have shown another writer's delete
// yet, so the range may have a free address the index calls allocated; answering ErrFull from it
// would refuse a create while an address is free. allocateUnseen reads every IPAddress object in one consistent List
// (from the API server, never from a cache) and tries to create the addresses of the range it
// does not show, dynamic band first. It returns allocator.ErrFull only when the List shows every
// address of the range or each address tried turned out to exist: the range was full, address by
// address, at an instant of the call. An error of the List is returned wrapped, not as ErrFull,
// since it tells nothing of the range. Callers that find the index full at once share Lists
// (a.full), so a full range costs the API server one List at a time, not one per create.
func (a *Allocator) allocateUnseen(ctx context.Context, owner allocator.Owner, called time.Time) (netip.Addr, error) {
	held, err := a.full.Since(ctx, called, a.listOffsets)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("ipaddress: %s looks full; confirming it: %w", a.cidr, err)
	}
	logger := klog.FromContext(ctx)
	for _, off := range unseen(held, a.size, a.band, maxUnseen) {
		if err := a.readyErr(); err != nil {
			return netip.Addr{}, err
		}
		if err := a.begin(ctx, off, true); err != nil {
			return netip.Addr{}, err
		}
		ip := a.addrAt(off)
		err := a.create(ctx, off, ip, owner)
		switch {
		case err == nil:
			logger.V(2).Info("Allocated an IP the informer had not shown free yet", "ip", ip, "owner", owner)
			return ip, nil
		case apierrors.IsAlreadyExists(err):
			continue
		}
		logger.V(2).Info("Creating IPAddress failed", "ip", ip, "err", err)
		return netip.Addr{}, fmt.Errorf("ipaddress: create IPAddress %s: %w", ip, err)
	}
	return netip.Addr{}, allocator.ErrFull
}

// listOffsets returns, sorted, the offsets of the range that have an IPAddress object, read in
// pages of one consistent List with client-go's tools/pager.
func (a *Allocator) listOffsets(ctx context.Context) ([]uint64, error) {
	var held []uint64
	p := pager.New(func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		return a.client.List(ctx, opts)
	})
	err := p.EachListItem(ctx, metav1.ListOptions{}, func(obj runtime.Object) error {
		if ipa, ok := obj.(*networkingv1.IPAddress); ok {
			if off, ok := a.offsetOfName(ipa.Name); ok {
				held = append(held, off)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.Sort(held)
	return slices.Compact(held), nil
}

// unseen returns up to n offsets of [0, size) that are not in held (sorted, without duplicates),
// those of the dynamic band [band, size) first, each band in ascending order. It walks the gaps
// between held offsets, so its cost follows len(held) and n, not size.
func unseen(held []uint64, size, band uint64, n int) []uint64 {
	var out []uint64
	gaps := func(lo, hi uint64) {
		next := lo
		i, _ := slices.BinarySearch(held, lo)
		for next < hi && len(out) < n {
			if i < len(held) && held[i] == next {
				i++
				next++
				continue
			}
			out = append(out, next)
			next++
		}
	}
	gaps(band, size)
	gaps(0, band)
	return out
}
