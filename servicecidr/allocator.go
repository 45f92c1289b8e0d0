package servicecidr

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"iter"
	"math"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	networkingv1informers "k8s.io/client-go/informers/networking/v1"
	"k8s.io/client-go/kubernetes"
	networkingv1listers "k8s.io/client-go/listers/networking/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/internal/allocbase"
	"github.com/kube-ipam/clusterip/internal/ipmath"
	"github.com/kube-ipam/clusterip/ipaddress"
)

// ErrNotManaged is matched by the error of a Release that found an IPAddress for the address in
// no ServiceCIDR the Allocator knows, created by someone else (another managed-by label, or no
// parentRef), and left it in place.
var ErrNotManaged = errors.New("servicecidr: IPAddress not managed by this allocator")

var _ allocator.Interface = (*Allocator)(nil)

// releaseTimeout bounds the Release that undoes an allocation whose ServiceCIDR stopped being
// ready while it was being made; it runs even when the caller's context is done.
const releaseTimeout = 30 * time.Second

// Allocator allocates Service ClusterIPs of one IP family from every ready ServiceCIDR, through one
// per-CIDR allocator for each distinct prefix. ServiceCIDRs that share a prefix share its
// allocator, which lives until the last of them is gone.
//
// The zero Allocator is not usable; use New. An Allocator is safe for concurrent use. Until Run has
// reconciled a ready ServiceCIDR it serves nothing: Allocate and AllocateNext return
// allocator.ErrNotReady.
type Allocator struct {
	family    corev1.IPFamily
	client    kubernetes.Interface // nil only with a test's in-memory per-CIDR allocators
	managedBy string               // the managed-by label value of the IPAddresses it creates
	cidrs     cache.SharedIndexInformer
	ips       cache.SharedIndexInformer
	lister    networkingv1listers.ServiceCIDRLister
	factory   allocatorFactory

	started   atomic.Bool                                  // Run has been called
	synced    atomic.Bool                                  // Run has reconciled the informer's cache once
	hasSynced atomic.Bool                                  // HasSynced has returned true
	queue     workqueue.TypedRateLimitingInterface[string] // set by Run before any handler runs

	skipped sync.Map // "uid/name/cidr" of each ServiceCIDR CIDR logged as not servable

	mu      sync.RWMutex // guards entries and closed
	entries map[netip.Prefix]*entry
	closed  bool
}

// entry is the per-CIDR allocator of one prefix and the ServiceCIDRs that hold it. Its fields are
// guarded by Allocator.mu.
type entry struct {
	prefix netip.Prefix
	alloc  cidrAllocator
	refs   map[string]bool // ServiceCIDR name → whether that ServiceCIDR is ready
	ready  bool            // whether any ServiceCIDR in refs is ready
}

// view is a copy of an entry taken under Allocator.mu, used after the lock is released.
type view struct {
	prefix netip.Prefix
	alloc  cidrAllocator
	ready  bool
}

// New returns an Allocator of family (corev1.IPv4Protocol or corev1.IPv6Protocol) that serves the
// ServiceCIDRs seen by cidrs and records addresses as IPAddress objects written with client and
// read through ips. It registers both informers with their factory, so start the factory after
// New; it starts no goroutines itself. Call Run to start serving.
func New(family corev1.IPFamily, client kubernetes.Interface, cidrs networkingv1informers.ServiceCIDRInformer, ips networkingv1informers.IPAddressInformer, opts ...Option) (*Allocator, error) {
	if family != corev1.IPv4Protocol && family != corev1.IPv6Protocol {
		return nil, fmt.Errorf("servicecidr: unknown IP family %q", family)
	}
	if cidrs == nil || ips == nil {
		return nil, errors.New("servicecidr: nil informer")
	}
	o := options{managedBy: ipaddress.DefaultManagedBy}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if o.factory == nil {
		if client == nil {
			return nil, errors.New("servicecidr: nil client")
		}
		// The Allocator's managed-by value goes last, so that an ipaddress.WithManagedBy in
		// WithIPAddressOptions cannot label objects that Release would not recognise.
		ipOpts := append(slices.Clone(o.ipaddresses), ipaddress.WithManagedBy(o.managedBy))
		o.factory = ipaddressFactory(client, ips, ipOpts)
	}
	return &Allocator{
		family:    family,
		client:    client,
		managedBy: o.managedBy,
		cidrs:     cidrs.Informer(),
		ips:       ips.Informer(),
		lister:    cidrs.Lister(),
		factory:   o.factory,
		entries:   map[netip.Prefix]*entry{},
	}, nil
}

// serving reports whether v can allocate now: its ServiceCIDR is ready and so is its allocator.
func (v view) serving() bool { return v.ready && v.alloc.Ready() }

// views copies the entries for which keep returns true, outermost prefix first.
func (a *Allocator) views(keep func(*entry) bool) []view {
	a.mu.RLock()
	vs := make([]view, 0, len(a.entries))
	for _, e := range a.entries {
		if keep(e) {
			vs = append(vs, view{prefix: e.prefix, alloc: e.alloc, ready: e.ready})
		}
	}
	a.mu.RUnlock()
	slices.SortFunc(vs, func(x, y view) int {
		if c := cmp.Compare(x.prefix.Bits(), y.prefix.Bits()); c != 0 {
			return c
		}
		return x.prefix.Addr().Compare(y.prefix.Addr())
	})
	return vs
}

// containing returns the entries that can allocate ip, outermost prefix first. Going through the
// outermost one keeps Used and Free, which count outermost prefixes, exact at once; the allocators
// of the prefixes inside learn of the change from the informer.
func (a *Allocator) containing(ip netip.Addr) []view {
	return a.views(func(e *entry) bool { return ipmath.Usable(e.prefix, ip) })
}

// home returns the view of vs (the views containing one address, outermost first) through which
// that address is allocated and released: the outermost that is serving, else the outermost. As
// Allocate and AllocateNext write through it, its index is the one that holds their writes before
// the informer shows them.
func home(vs []view) view {
	for _, v := range vs {
		if v.serving() {
			return v
		}
	}
	return vs[0]
}

// servable reports whether some ready ServiceCIDR can allocate ip now.
func (a *Allocator) servable(ip netip.Addr) bool {
	a.mu.RLock()
	defer a.mu.RUnlock()
	for _, e := range a.entries {
		if e.ready && ipmath.Usable(e.prefix, ip) {
			return true
		}
	}
	return false
}

// current reports whether v's allocator is still the one serving its prefix and is ready.
func (a *Allocator) current(v view) bool {
	a.mu.RLock()
	defer a.mu.RUnlock()
	e := a.entries[v.prefix]
	return e != nil && e.alloc == v.alloc && e.ready
}

// topLevel returns the views whose prefix is inside no other prefix of vs. Prefixes nest or are
// disjoint, so the result is disjoint and covers every address of vs.
func topLevel(vs []view) []view {
	var top []view
	for _, v := range vs {
		inside := false
		for _, w := range vs {
			if w.prefix.Bits() < v.prefix.Bits() && w.prefix.Contains(v.prefix.Addr()) {
				inside = true
				break
			}
		}
		if !inside {
			top = append(top, v)
		}
	}
	slices.SortFunc(top, func(x, y view) int { return x.prefix.Addr().Compare(y.prefix.Addr()) })
	return top
}

// readyErr returns an error matching allocator.ErrNotReady until Run has reconciled the
// ServiceCIDRs of the informer's synced cache once: until then the Allocator cannot tell an
// address out of range from one in a ServiceCIDR it has not seen yet.
func (a *Allocator) readyErr() error {
	if !a.synced.Load() {
		return fmt.Errorf("servicecidr: %s ServiceCIDRs not synced yet: %w", a.family, allocator.ErrNotReady)
	}
	return nil
}

func (a *Allocator) notInRange(ip netip.Addr) error {
	return &allocator.NotInRangeError{IP: ip}
}

// undo releases ip, which a per-CIDR allocator gave out just as its ServiceCIDR stopped being
// ready. It runs even when ctx is done, since the address would otherwise leak.
func (a *Allocator) undo(ctx context.Context, alloc cidrAllocator, ip netip.Addr) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	if err := alloc.Release(ctx, ip); err != nil {
		klog.FromContext(ctx).Error(err, "Could not release an address allocated from a ServiceCIDR that stopped being ready; repair will free it", "ip", ip)
	}
}

// Allocate reserves ip for owner through the outermost ready ServiceCIDR that contains it. It
// returns allocator.ErrNotReady until Run has reconciled the ServiceCIDRs once, a range-less
// *allocator.NotInRangeError (matching allocator.ErrMismatchedNetwork) if no
// ServiceCIDR of the family can allocate ip, allocator.ErrNotReady if only ServiceCIDRs that are
// not ready can, allocator.ErrAllocated if ip is taken, and an *allocator.AddrError for an invalid,
// zoned or IPv4-mapped ip.
func (a *Allocator) Allocate(ctx context.Context, ip netip.Addr, owner allocator.Owner) error {
	if err := allocator.CheckAddr(ip); err != nil {
		return err
	}
	if err := a.readyErr(); err != nil {
		return err
	}
	vs := a.containing(ip)
	if len(vs) == 0 {
		return a.notInRange(ip)
	}
	for _, v := range vs {
		if !v.serving() {
			continue
		}
		err := v.alloc.Allocate(ctx, ip, owner)
		switch {
		case err == nil:
			if a.servable(ip) {
				return nil
			}
			a.undo(ctx, v.alloc, ip)
		case errors.Is(err, allocator.ErrNotReady):
		case ctx.Err() == nil && !a.current(v):
			// Its ServiceCIDR went away during the call; another may still serve ip.
		default:
			return err
		}
	}
	return fmt.Errorf("servicecidr: %s is only in ServiceCIDRs that are not ready: %w", ip, allocator.ErrNotReady)
}

// AllocateNext reserves a free address for owner from a ready ServiceCIDR, chosen at random with a
// weight proportional to its free space, and returns it. Only outermost ready prefixes are chosen:
// they hold every address of the prefixes inside them. Full and not-ready ServiceCIDRs are
// skipped; any other error is returned at once. It returns allocator.ErrFull if every ready
// ServiceCIDR is full and allocator.ErrNotReady if none is ready. No lock is held while a
// per-CIDR allocator works, so concurrent callers proceed in parallel.
func (a *Allocator) AllocateNext(ctx context.Context, owner allocator.Owner) (netip.Addr, error) {
	return a.allocateNext(ctx, owner, false, netip.Prefix{})
}

// allocateNext is AllocateNext, as a dry run if dryRun is set, from the ready prefixes that are
// not inside skip (the zero Prefix skips none). Ready prefixes that are all inside skip count as
// full.
func (a *Allocator) allocateNext(ctx context.Context, owner allocator.Owner, dryRun bool, skip netip.Prefix) (netip.Addr, error) {
	if err := a.readyErr(); err != nil {
		return netip.Addr{}, err
	}
	cands := topLevel(a.views(func(e *entry) bool { return e.ready && e.alloc.Ready() }))
	full := false
	if skip.IsValid() {
		n := len(cands)
		cands = slices.DeleteFunc(cands, func(v view) bool { return prefixWithin(v.prefix, skip) })
		full = n > 0 && len(cands) == 0
	}
	for len(cands) > 0 {
		i := pick(cands)
		v := cands[i]
		cands = slices.Delete(cands, i, i+1)
		if !v.alloc.Ready() {
			continue
		}
		var (
			ip  netip.Addr
			err error
		)
		if dryRun {
			ip, err = v.alloc.DryRun().AllocateNext(ctx, owner)
		} else {
			ip, err = v.alloc.AllocateNext(ctx, owner)
		}
		switch {
		case err == nil:
			if a.servable(ip) {
				return ip, nil
			}
			if !dryRun {
				a.undo(ctx, v.alloc, ip)
			}
		case errors.Is(err, allocator.ErrFull):
			full = true
		case errors.Is(err, allocator.ErrNotReady):
		case ctx.Err() == nil && !a.current(v):
			// Its ServiceCIDR went away during the call: try the others.
		default:
			return netip.Addr{}, err
		}
	}
	if full {
		return netip.Addr{}, fmt.Errorf("servicecidr: every ready %s ServiceCIDR is full: %w", a.family, allocator.ErrFull)
	}
	return netip.Addr{}, fmt.Errorf("servicecidr: no ready %s ServiceCIDR: %w", a.family, allocator.ErrNotReady)
}

// pick returns the index of a random view, weighted by free addresses. Views with none free are
// picked only when no view has any, so that their allocators can report ErrFull themselves.
func pick(vs []view) int {
	ws := make([]float64, len(vs))
	var total float64
	for i, v := range vs {
		ws[i] = float64(v.alloc.Free())
		total += ws[i]
	}
	if total == 0 {
		return rand.IntN(len(vs))
	}
	r := rand.Float64() * total
	last := 0
	for i, w := range ws {
		if w == 0 {
			continue
		}
		if r < w {
			return i
		}
		r -= w
		last = i
	}
	return last // rounding left r just above the sum
}

// Release frees ip through the prefix Allocate would reserve it through (see PrefixOf): the
// outermost ready ServiceCIDR that contains it, or the outermost one if none is ready, deleting
// its IPAddress whoever created it. So the allocator that AllocateNext and Has ask has seen the
// release at once, even where a prefix inside another one serves while the outer one is not
// ready. Releasing an address that is not allocated returns nil; an invalid, zoned or
// IPv4-mapped ip returns an *allocator.AddrError.
//
// When no ServiceCIDR the Allocator knows contains ip (its ServiceCIDR was deleted without the
// LifecycleController, its finalizer was removed by hand, or Run has not synced yet), Release
// reads the IPAddress named after ip from the API server and deletes it if it is one of ours: it
// has the managed-by label of the Allocator (see WithManagedBy) and a parentRef. The delete
// carries the UID read, so an object created again under that name meanwhile is left alone. An
// IPAddress that is not ours is left in place and Release returns an error matching
// ErrNotManaged; API errors are wrapped with %w. Release never returns nil while an IPAddress of
// ours for ip remains.
func (a *Allocator) Release(ctx context.Context, ip netip.Addr) error {
	if err := allocator.CheckAddr(ip); err != nil {
		return err
	}
	if vs := a.containing(ip); len(vs) > 0 {
		return home(vs).alloc.Release(ctx, ip)
	}
	return a.releaseUnknown(ctx, ip)
}

// releaseUnknown deletes the IPAddress of ip, which no ServiceCIDR the Allocator knows contains,
// if it is ours; see Release.
func (a *Allocator) releaseUnknown(ctx context.Context, ip netip.Addr) error {
	if a.client == nil {
		return nil // in-memory per-CIDR allocators (tests): there are no objects
	}
	ipas := a.client.NetworkingV1().IPAddresses()
	obj, err := ipas.Get(ctx, ip.String(), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("servicecidr: release %s, in no known ServiceCIDR: get its IPAddress: %w", ip, err)
	}
	if !a.ours(obj) {
		return fmt.Errorf("servicecidr: release %s: its IPAddress is in no known ServiceCIDR and has managed-by label %q and parentRef %v, not ours (%q and a parentRef); left in place: %w",
			ip, obj.Labels[networkingv1.LabelManagedBy], obj.Spec.ParentRef, a.managedBy, ErrNotManaged)
	}
	uid := obj.UID
	err = ipas.Delete(ctx, obj.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	logger := klog.FromContext(ctx)
	switch {
	case err == nil:
		logger.V(2).Info("Released an IP in no known ServiceCIDR", "ip", ip)
		return nil
	case apierrors.IsNotFound(err):
		return nil
	case apierrors.IsConflict(err):
		// The UID precondition failed: the object read is gone, and the one there now was
		// created by another allocation.
		logger.V(2).Info("The IPAddress of a released IP was replaced meanwhile; leaving the new one", "ip", ip)
		return nil
	}
	return fmt.Errorf("servicecidr: release %s, in no known ServiceCIDR: delete its IPAddress: %w", ip, err)
}

// ours reports whether the Allocator would have created ipa: it carries the Allocator's managed-by
// label and a parentRef.
func (a *Allocator) ours(ipa *networkingv1.IPAddress) bool {
	return ipa.Labels[networkingv1.LabelManagedBy] == a.managedBy && ipa.Spec.ParentRef != nil
}

// Has reports whether ip is allocated in any ServiceCIDR of the family, ready or not. Every
// prefix containing ip sees the same IPAddress object; Has asks the allocator that ip is
// allocated and released through (see PrefixOf), which has seen the Allocator's own writes
// before the informer shows them to the others.
func (a *Allocator) Has(ip netip.Addr) bool {
	if allocator.CheckAddr(ip) != nil {
		return false
	}
	vs := a.containing(ip)
	if len(vs) == 0 {
		return false
	}
	return home(vs).alloc.Has(ip)
}

// All yields every allocated address in every ServiceCIDR of the family, ready or not, once and
// in ascending order. It walks the outermost prefixes, which hold every address of the prefixes
// inside them.
func (a *Allocator) All() iter.Seq[netip.Addr] {
	top := topLevel(a.views(func(*entry) bool { return true }))
	return func(yield func(netip.Addr) bool) {
		for _, v := range top {
			for ip := range v.alloc.All() {
				if !yield(ip) {
					return
				}
			}
		}
	}
}

// CIDR returns the zero Prefix: an Allocator serves many.
func (a *Allocator) CIDR() netip.Prefix { return netip.Prefix{} }

// Family returns the IP family the Allocator serves.
func (a *Allocator) Family() corev1.IPFamily { return a.family }

// Used returns the number of allocated addresses in every ServiceCIDR of the family, ready or not,
// counting each address once however many prefixes contain it.
func (a *Allocator) Used() uint64 {
	var n uint64
	for _, v := range topLevel(a.views(func(*entry) bool { return true })) {
		n = addSat(n, v.alloc.Used())
	}
	return n
}

// Free returns the number of addresses that can still be allocated from ready ServiceCIDRs,
// counting each once: a prefix inside another ready one adds nothing. It saturates at
// math.MaxUint64.
func (a *Allocator) Free() uint64 {
	var n uint64
	for _, v := range topLevel(a.views(func(e *entry) bool { return e.ready })) {
		n = addSat(n, v.alloc.Free())
	}
	return n
}

func addSat(x, y uint64) uint64 {
	if s := x + y; s >= x {
		return s
	}
	return math.MaxUint64
}

// ReadyCIDRs returns the prefixes the Allocator can allocate from now, in ascending order: those
// of ready ServiceCIDRs whose allocator is ready too.
func (a *Allocator) ReadyCIDRs() []netip.Prefix {
	var ps []netip.Prefix
	for _, v := range a.views(func(e *entry) bool { return e.ready }) {
		if v.alloc.Ready() {
			ps = append(ps, v.prefix)
		}
	}
	slices.SortFunc(ps, comparePrefix)
	return ps
}

// comparePrefix orders prefixes by address, then shorter first.
func comparePrefix(x, y netip.Prefix) int {
	if c := x.Addr().Compare(y.Addr()); c != 0 {
		return c
	}
	return cmp.Compare(x.Bits(), y.Bits())
}

// Ready reports whether the Allocator can allocate from at least one ServiceCIDR.
func (a *Allocator) Ready() bool { return len(a.ReadyCIDRs()) > 0 }

// HasSynced reports whether the Allocator has caught up with the API server once, as client-go's
// cache.InformerSynced does for an informer: the ServiceCIDR and IPAddress informers have synced,
// Run has reconciled every ServiceCIDR of the family in the cache, and the per-CIDR allocator of
// each prefix found has received the IPAddress informer's initial list. It is false before Run.
//
// HasSynced becomes true even when no ServiceCIDR of the family exists, where Ready stays false:
// after HasSynced, a false Ready means that no ServiceCIDR of the family can be allocated from
// (none exists, each is not ready or being deleted, or its prefix cannot be served), not that the
// Allocator has yet to see them; only a ServiceCIDR added since may take a moment longer. Once
// true it stays true, as an informer's does, also after Close. It is cheap enough to poll.
func (a *Allocator) HasSynced() bool {
	if a.hasSynced.Load() {
		return true
	}
	if !a.synced.Load() || !a.ips.HasSynced() {
		return false
	}
	a.mu.RLock()
	for _, e := range a.entries {
		if s, ok := e.alloc.(interface{ HasSynced() bool }); ok && !s.HasSynced() {
			a.mu.RUnlock()
			return false
		}
	}
	a.mu.RUnlock()
	a.hasSynced.Store(true)
	return true
}

// DryRun returns a view of the Allocator that validates every call as the Allocator would but
// changes nothing; see allocator.Interface.
func (a *Allocator) DryRun() allocator.Interface { return dryRun{allocbase.DryRunView{R: a}, a} }

// Close closes every per-CIDR allocator. Afterwards the Allocator serves nothing and Run, if still
// running, adds no more; Close is idempotent.
func (a *Allocator) Close() error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil
	}
	a.closed = true
	es := a.entries
	a.entries = map[netip.Prefix]*entry{}
	a.mu.Unlock()
	var errs []error
	for _, e := range es {
		e.alloc.SetReady(false)
		if err := e.alloc.Close(); err != nil {
			errs = append(errs, fmt.Errorf("servicecidr: close allocator of %s: %w", e.prefix, err))
		}
	}
	return errors.Join(errs...)
}
