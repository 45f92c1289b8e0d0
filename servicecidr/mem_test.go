package servicecidr

import (
	"context"
	"errors"
	"iter"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/internal/ipmath"
)

// memStore is an in-memory stand-in for the IPAddress namespace that per-CIDR allocators share:
// one address, one owner, whatever prefix allocated it.
type memStore struct {
	mu  sync.Mutex
	ips map[netip.Addr]allocator.Owner
}

func newMemStore() *memStore { return &memStore{ips: map[netip.Addr]allocator.Owner{}} }

func (s *memStore) has(ip netip.Addr) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.ips[ip]
	return ok
}

// memFactory builds memAllocs over one memStore and remembers them.
type memFactory struct {
	store *memStore
	// hook, if set, runs at the start of every AllocateNext and Allocate, without locks held.
	hook func(a *memAlloc)

	mu   sync.Mutex
	made []*memAlloc
}

func newMemFactory() *memFactory { return &memFactory{store: newMemStore()} }

func (f *memFactory) new(_ klog.Logger, p netip.Prefix) (cidrAllocator, error) {
	if err := allocator.CheckPrefix(p); err != nil {
		return nil, err
	}
	a := &memAlloc{prefix: p, store: f.store, hook: f.hook}
	a.ready.Store(true)
	f.mu.Lock()
	f.made = append(f.made, a)
	f.mu.Unlock()
	return a, nil
}

// allocs returns every allocator made for p, oldest first.
func (f *memFactory) allocs(p netip.Prefix) []*memAlloc {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*memAlloc
	for _, a := range f.made {
		if a.prefix == p {
			out = append(out, a)
		}
	}
	return out
}

// memAlloc is a minimal per-CIDR allocator over a memStore: upper band first, lowest free offset
// first.
type memAlloc struct {
	prefix netip.Prefix
	store  *memStore
	hook   func(*memAlloc)
	ready  atomic.Bool
	closed atomic.Bool
}

var _ cidrAllocator = (*memAlloc)(nil)

var errClosed = errors.New("memAlloc: closed")

func (a *memAlloc) SetReady(r bool) { a.ready.Store(r) }
func (a *memAlloc) Ready() bool     { return a.ready.Load() && !a.closed.Load() }

func (a *memAlloc) check(ip netip.Addr) error {
	if err := allocator.CheckAddr(ip); err != nil {
		return err
	}
	if !ipmath.Usable(a.prefix, ip) {
		return &allocator.NotInRangeError{IP: ip, Range: a.prefix}
	}
	return nil
}

func (a *memAlloc) Allocate(_ context.Context, ip netip.Addr, owner allocator.Owner) error {
	if err := a.check(ip); err != nil {
		return err
	}
	if a.closed.Load() {
		return errClosed
	}
	if !a.ready.Load() {
		return allocator.ErrNotReady
	}
	if a.hook != nil {
		a.hook(a)
	}
	a.store.mu.Lock()
	defer a.store.mu.Unlock()
	if _, ok := a.store.ips[ip]; ok {
		return allocator.ErrAllocated
	}
	a.store.ips[ip] = owner
	return nil
}

func (a *memAlloc) next(take bool, owner allocator.Owner) (netip.Addr, error) {
	size, band := ipmath.Size(a.prefix), ipmath.BandOffset(a.prefix)
	a.store.mu.Lock()
	defer a.store.mu.Unlock()
	for _, r := range [][2]uint64{{band, size}, {0, band}} {
		for off := r[0]; off < r[1]; off++ {
			ip, _ := ipmath.AddrAt(a.prefix, off)
			if _, ok := a.store.ips[ip]; !ok {
				if take {
					a.store.ips[ip] = owner
				}
				return ip, nil
			}
		}
	}
	return netip.Addr{}, allocator.ErrFull
}

func (a *memAlloc) AllocateNext(_ context.Context, owner allocator.Owner) (netip.Addr, error) {
	if a.closed.Load() {
		return netip.Addr{}, errClosed
	}
	if !a.ready.Load() {
		return netip.Addr{}, allocator.ErrNotReady
	}
	if a.hook != nil {
		a.hook(a)
	}
	return a.next(true, owner)
}

func (a *memAlloc) Release(_ context.Context, ip netip.Addr) error {
	if err := allocator.CheckAddr(ip); err != nil {
		return err
	}
	if !ipmath.Usable(a.prefix, ip) {
		return nil
	}
	a.store.mu.Lock()
	defer a.store.mu.Unlock()
	delete(a.store.ips, ip)
	return nil
}

func (a *memAlloc) Has(ip netip.Addr) bool {
	return allocator.CheckAddr(ip) == nil && ipmath.Usable(a.prefix, ip) && a.store.has(ip)
}

func (a *memAlloc) list() []netip.Addr {
	a.store.mu.Lock()
	defer a.store.mu.Unlock()
	var out []netip.Addr
	for ip := range a.store.ips {
		if ipmath.Usable(a.prefix, ip) {
			out = append(out, ip)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

func (a *memAlloc) All() iter.Seq[netip.Addr] { return slices.Values(a.list()) }
func (a *memAlloc) CIDR() netip.Prefix        { return a.prefix }
func (a *memAlloc) Family() corev1.IPFamily   { return allocator.FamilyOf(a.prefix.Addr()) }
func (a *memAlloc) Used() uint64              { return uint64(len(a.list())) }
func (a *memAlloc) Free() uint64              { return ipmath.Size(a.prefix) - a.Used() }
func (a *memAlloc) DryRun() allocator.Interface {
	return memDryRun{a}
}
func (a *memAlloc) Close() error { a.closed.Store(true); return nil }

type memDryRun struct{ *memAlloc }

func (d memDryRun) Allocate(_ context.Context, ip netip.Addr, _ allocator.Owner) error {
	if err := d.check(ip); err != nil {
		return err
	}
	if !d.ready.Load() {
		return allocator.ErrNotReady
	}
	if d.store.has(ip) {
		return allocator.ErrAllocated
	}
	return nil
}

func (d memDryRun) AllocateNext(_ context.Context, owner allocator.Owner) (netip.Addr, error) {
	if !d.ready.Load() {
		return netip.Addr{}, allocator.ErrNotReady
	}
	return d.next(false, owner)
}

func (d memDryRun) Release(_ context.Context, ip netip.Addr) error { return allocator.CheckAddr(ip) }
func (d memDryRun) DryRun() allocator.Interface                    { return d }
func (d memDryRun) Close() error                                   { return nil }
