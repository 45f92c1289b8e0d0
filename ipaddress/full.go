package ipaddress

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"
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
// (heldSince), so a full range costs the API server one List at a time, not one per create.
func (a *Allocator) allocateUnseen(ctx context.Context, owner allocator.Owner, called time.Time) (netip.Addr, error) {
	held, err := a.heldSince(ctx, called)
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

// fullLists coalesces the Lists that confirm a full index: at most one is in flight, and every
// caller that waits for it and was called no later than it started uses its result.
type fullLists struct {
	mu      sync.Mutex
	flight  *listFlight // the List in flight; nil if none
	waiting int         // callers waiting for a List another caller started (for tests)
}

// listFlight is one List of fullLists: when it started, and, once done is closed, what it read.
type listFlight struct {
	start time.Time
	done  chan struct{}
	held  []uint64 // shared by every caller that uses it: read only
	err   error
}

// heldSince returns listOffsets' offsets as read by a List that started at or after since, so
// that what it shows held was held at an instant after since. It starts that List, or waits for
// the one in flight: if that one started before since, or failed, it then starts or joins the
// next. The error is that of the caller's own List, or ctx's.
func (a *Allocator) heldSince(ctx context.Context, since time.Time) ([]uint64, error) {
	fl := &a.full
	for {
		fl.mu.Lock()
		f := fl.flight
		if f == nil {
			f = &listFlight{start: time.Now(), done: make(chan struct{})}
			fl.flight = f
			fl.mu.Unlock()
			f.held, f.err = a.listOffsets(ctx)
			fl.mu.Lock()
			fl.flight = nil
			fl.mu.Unlock()
			close(f.done)
			return f.held, f.err
		}
		fl.waiting++
		fl.mu.Unlock()
		var err error
		select {
		case <-f.done:
		case <-ctx.Done():
			err = ctx.Err()
		}
		fl.mu.Lock()
		fl.waiting--
		fl.mu.Unlock()
		if err != nil {
			return nil, err
		}
		if f.err == nil && !f.start.Before(since) {
			return f.held, nil
		}
	}
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
