package ipaddress

import (
	"context"
	"fmt"
	"iter"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	networkingv1informers "k8s.io/client-go/informers/networking/v1"
	"k8s.io/client-go/kubernetes"
	networkingv1client "k8s.io/client-go/kubernetes/typed/networking/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/internal/allocbase"
	"github.com/kube-ipam/clusterip/internal/freeindex"
	"github.com/kube-ipam/clusterip/internal/ipmath"
	"github.com/kube-ipam/clusterip/internal/sharedread"
)

var _ allocator.Interface = (*Allocator)(nil)

// MinIPv6Bits is the shortest IPv6 prefix an Allocator serves: the offsets of a /64 just fit in a
// uint64. Shorter prefixes are rejected with an *allocator.PrefixError.
const MinIPv6Bits = 64

// Allocator allocates the addresses of one CIDR as IPAddress objects. Create one with New; the zero
// Allocator is not usable. An Allocator is safe for concurrent use; it holds no lock across API
// calls, and concurrent calls on the same address wait for each other.
type Allocator struct {
	cidr          netip.Prefix
	family        corev1.IPFamily
	size          uint64 // usable offsets: offset i is network+1+i
	band          uint64 // offsets [0, band) form the static band
	client        networkingv1client.IPAddressInterface
	informer      cache.SharedIndexInformer
	reg           cache.ResourceEventHandlerRegistration
	managedBy     string
	assumeTimeout time.Duration
	serverDryRun  bool
	logger        klog.Logger
	now           func() time.Time

	ready  atomic.Bool // SetReady's switch
	closed atomic.Bool

	mu       sync.Mutex // guards rand, index, pending, expiry, rechecks, gen, staleEvents and events
	rand     *rand.Rand
	index    freeindex.Set       // allocated offsets: the informer's view overlaid with pending writes
	pending  map[uint64]*pending // offsets with a write in flight or assumed
	expiry   []expiryEntry       // assumptions in deadline order (a FIFO: the timeout is constant)
	rechecks []expiryEntry       // assumed deletes contradicted by the informer, in deadline order
	gen      uint64              // last assumption generation handed out

	staleEvents uint64 // informer events ignored as older than an assumed write (for tests and logs)
	events      uint64 // informer events of the range taken by the handler (for tests)

	full sharedread.Reads[[]uint64] // the Lists that confirm a full index (listOffsets), shared by the callers that find it full
}

// New returns an Allocator for cidr that reads IPAddress objects from informer and writes them with
// client. It registers an event handler on informer, which Close removes, and starts no goroutine;
// the caller starts the informer (for example with a SharedInformerFactory). Until the handler has
// received the informer's initial list, Allocate and AllocateNext return allocator.ErrNotReady.
//
// cidr must pass allocator.CheckPrefix and, for IPv6, be a /64 or longer (MinIPv6Bits); IPv4
// prefixes of any length up to /0 are served. Otherwise New returns an *allocator.PrefixError. A nil
// client or informer (a nil interface or a nil pointer in one) is an error matching
// allocator.ErrInvalid, never a panic; nil Options are ignored.
func New(cidr netip.Prefix, client kubernetes.Interface, informer networkingv1informers.IPAddressInformer, opts ...Option) (*Allocator, error) {
	if err := allocator.CheckPrefix(cidr); err != nil {
		return nil, err
	}
	if cidr.Addr().Is6() && cidr.Bits() < MinIPv6Bits {
		return nil, &allocator.PrefixError{Prefix: cidr, Reason: fmt.Sprintf("IPv6 ranges shorter than /%d are not supported", MinIPv6Bits)}
	}
	if isNil(client) || isNil(informer) {
		return nil, fmt.Errorf("ipaddress: New needs a client and an IPAddress informer: %w", allocator.ErrInvalid)
	}
	ipc := client.NetworkingV1()
	if isNil(ipc) {
		return nil, fmt.Errorf("ipaddress: New: the client has no networking.k8s.io/v1 client: %w", allocator.ErrInvalid)
	}
	inf := informer.Informer()
	if isNil(inf) {
		return nil, fmt.Errorf("ipaddress: New: the IPAddress informer has no shared informer: %w", allocator.ErrInvalid)
	}
	o := buildOptions(opts)
	family := corev1.IPv4Protocol
	if cidr.Addr().Is6() {
		family = corev1.IPv6Protocol
	}
	size := ipmath.Size(cidr)
	a := &Allocator{
		cidr:          cidr,
		family:        family,
		size:          size,
		band:          min(ipmath.BandOffset(cidr), size),
		client:        ipc.IPAddresses(),
		informer:      inf,
		managedBy:     o.managedBy,
		assumeTimeout: o.assumeTimeout,
		serverDryRun:  o.serverDryRun,
		logger:        o.logger.WithValues("cidr", cidr.String()),
		now:           o.now,
		rand:          o.rand,
		pending:       make(map[uint64]*pending),
	}
	a.ready.Store(o.ready)
	reg, err := a.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { a.onEvent(nil, obj, true) },
		UpdateFunc: func(old, obj any) { a.onEvent(old, obj, true) },
		DeleteFunc: func(obj any) { a.onEvent(nil, obj, false) },
	})
	if err != nil {
		return nil, fmt.Errorf("ipaddress: register informer handler: %w", err)
	}
	a.reg = reg
	return a, nil
}

// CIDR returns the range the Allocator serves.
func (a *Allocator) CIDR() netip.Prefix { return a.cidr }

// Family returns IPv4Protocol or IPv6Protocol.
func (a *Allocator) Family() corev1.IPFamily { return a.family }

// Size returns the number of addresses the allocator can hand out, Used()+Free(): the usable
// addresses of the range, 254 for a /24, 2^64-1 for an IPv6 /64 (bitmap.Allocator.Size caps IPv6
// at 65535).
func (a *Allocator) Size() uint64 { return a.size }

// StaticBand returns the number of offsets, counted from the start of the range, that form the
// static band AllocateNext uses only when the dynamic band is full (KEP-3070).
func (a *Allocator) StaticBand() uint64 { return a.band }

// SetReady sets the readiness switch: while it is off, Allocate and AllocateNext return
// allocator.ErrNotReady; Release, Has and the counters keep working. Package servicecidr mirrors its
// ServiceCIDR's readiness with it.
func (a *Allocator) SetReady(ready bool) { a.ready.Store(ready) }

// Ready reports whether the Allocator can allocate: its switch is on (see SetReady), its informer
// handler has received the initial list, and it is not closed.
func (a *Allocator) Ready() bool {
	return a.ready.Load() && !a.closed.Load() && a.reg.HasSynced()
}

// HasSynced reports whether the Allocator's informer handler has received the informer's initial
// list, as client-go's cache.ResourceEventHandlerRegistration.HasSynced does: until then
// Allocate and AllocateNext return allocator.ErrNotReady whatever SetReady says. Once true it
// stays true.
func (a *Allocator) HasSynced() bool { return a.reg.HasSynced() }

func (a *Allocator) readyErr() error {
	switch {
	case a.closed.Load():
		return fmt.Errorf("%w: allocator for %s is closed", allocator.ErrNotReady, a.cidr)
	case !a.reg.HasSynced():
		return fmt.Errorf("%w: IPAddress informer for %s has not synced", allocator.ErrNotReady, a.cidr)
	case !a.ready.Load():
		return fmt.Errorf("%w: range %s is not ready", allocator.ErrNotReady, a.cidr)
	}
	return nil
}

// offsetOf returns the offset of ip, or an *allocator.AddrError for bad input or an
// *allocator.NotInRangeError for an address the range does not serve.
func (a *Allocator) offsetOf(ip netip.Addr) (uint64, error) {
	if err := allocator.CheckAddr(ip); err != nil {
		return 0, err
	}
	off, ok := ipmath.Offset(a.cidr, ip)
	if !ok {
		return 0, &allocator.NotInRangeError{IP: ip, Range: a.cidr}
	}
	return off, nil
}

func (a *Allocator) addrAt(off uint64) netip.Addr {
	ip, _ := ipmath.AddrAt(a.cidr, off)
	return ip
}

// create creates the IPAddress of ip and settles the pending write on off.
func (a *Allocator) create(ctx context.Context, off uint64, ip netip.Addr, owner allocator.Owner) error {
	obj, err := a.client.Create(ctx, ObjectFor(ip, owner, a.managedBy), metav1.CreateOptions{})
	r := writeResult{kind: writeFailed}
	switch {
	case err == nil:
		r = writeResult{kind: writeCreated, uid: obj.UID, rv: parseRV(obj.ResourceVersion)}
	case apierrors.IsAlreadyExists(err):
		r.kind = writeExists
	}
	a.mu.Lock()
	a.settleLocked(off, r)
	a.mu.Unlock()
	return err
}

// Allocate creates the IPAddress of ip for owner. ip may lie in either band. It returns an error
// matching both allocator.ErrAllocated and apierrors.IsAlreadyExists if the object exists, whoever
// created it; an *allocator.NotInRangeError if ip is outside the range, of the other family, or its
// network or IPv4 broadcast address; an *allocator.AddrError for an invalid, zoned or IPv4-mapped
// ip; an *allocator.OwnerError, before any API call, for an owner without a Resource or a Name
// (see allocator.CheckOwner); allocator.ErrNotReady while not Ready; and any other API error
// wrapped with %w.
func (a *Allocator) Allocate(ctx context.Context, ip netip.Addr, owner allocator.Owner) error {
	off, err := a.offsetOf(ip)
	if err != nil {
		return err
	}
	if err := allocator.CheckOwner(owner); err != nil {
		return err
	}
	if err := a.readyErr(); err != nil {
		return err
	}
	if err := a.begin(ctx, off, true); err != nil {
		return err
	}
	err = a.create(ctx, off, ip, owner)
	logger := klog.FromContext(ctx)
	switch {
	case err == nil:
		logger.V(4).Info("Allocated IP", "ip", ip, "owner", owner)
		return nil
	case apierrors.IsAlreadyExists(err):
		return fmt.Errorf("ipaddress: %s: %w (%w)", ip, allocator.ErrAllocated, err)
	}
	logger.V(2).Info("Creating IPAddress failed", "ip", ip, "err", err)
	return fmt.Errorf("ipaddress: create IPAddress %s: %w", ip, err)
}

// AllocateNext creates the IPAddress of a free address for owner and returns the address. It picks
// from the dynamic band if the index has a free address there, else from the static band; inside a
// band it starts at a random offset and takes the next free one, wrapping around. If the address
// turns out to exist already (the informer had not shown it yet), AllocateNext marks it allocated
// and picks another. Once the index has no free address left, it reads the IPAddress objects from
// the API server in one consistent List, started after the call and shared with the other callers
// waiting for it, and tries the addresses the List shows free (deletes the informer has not shown
// yet); it returns the zero Addr and allocator.ErrFull only when none is.
// So ErrFull means the range was full during the call, not that the informer was behind. Any
// other API error is returned at once, wrapped with %w, as are ctx's errors; allocator.ErrNotReady
// while not Ready; an *allocator.OwnerError, before any API call, for an owner without a Resource
// or a Name.
func (a *Allocator) AllocateNext(ctx context.Context, owner allocator.Owner) (netip.Addr, error) {
	if err := allocator.CheckOwner(owner); err != nil {
		return netip.Addr{}, err
	}
	called := time.Now()
	logger := klog.FromContext(ctx)
	for attempt := uint64(0); attempt < a.size; attempt++ {
		if err := a.readyErr(); err != nil {
			return netip.Addr{}, err
		}
		if err := ctx.Err(); err != nil {
			return netip.Addr{}, fmt.Errorf("ipaddress: allocate in %s: %w", a.cidr, err)
		}
		off, wait, ok := a.pickAndBegin()
		if !ok {
			return a.allocateUnseen(ctx, owner, called)
		}
		if wait != nil {
			// The picked address has a Release in flight; see how it ends, then pick again.
			if err := waitFor(ctx, wait); err != nil {
				return netip.Addr{}, err
			}
			continue
		}
		ip := a.addrAt(off)
		err := a.create(ctx, off, ip, owner)
		switch {
		case err == nil:
			logger.V(4).Info("Allocated IP", "ip", ip, "owner", owner, "attempts", attempt+1)
			return ip, nil
		case apierrors.IsAlreadyExists(err):
			logger.V(4).Info("IP already allocated, picking another", "ip", ip)
			continue
		}
		logger.V(2).Info("Creating IPAddress failed", "ip", ip, "err", err)
		return netip.Addr{}, fmt.Errorf("ipaddress: create IPAddress %s: %w", ip, err)
	}
	return netip.Addr{}, allocator.ErrFull
}

// pickAndBegin picks a free offset and starts a create on it. If the offset has a write in flight
// it returns the channel that closes when that write settles instead.
func (a *Allocator) pickAndBegin() (off uint64, wait <-chan struct{}, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.expireLocked()
	off, ok = a.pickLocked()
	if !ok {
		return 0, nil, false
	}
	return off, a.beginLocked(off, true), true
}

// pickLocked chooses the offset AllocateNext would take.
func (a *Allocator) pickLocked() (uint64, bool) {
	if a.index.Len() >= a.size {
		return 0, false
	}
	return ipmath.PickOffset(&a.index, a.size, a.band, a.rand)
}

// begin starts a write on off, waiting for one already in flight on it to settle first.
func (a *Allocator) begin(ctx context.Context, off uint64, create bool) error {
	for {
		a.mu.Lock()
		a.expireLocked()
		wait := a.beginLocked(off, create)
		a.mu.Unlock()
		if wait == nil {
			return nil
		}
		if err := waitFor(ctx, wait); err != nil {
			return err
		}
	}
}

func waitFor(ctx context.Context, ch <-chan struct{}) error {
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("ipaddress: waiting for a write in flight: %w", ctx.Err())
	}
}

// Release deletes the IPAddress of ip, whoever created it. It returns nil if there is none or ip
// is outside the range, an *allocator.AddrError for an invalid, zoned or IPv4-mapped ip, and any
// other API error wrapped with %w. It works while not Ready. A Release that finds no object for an
// address the informer did not show either, and of which no earlier write of ours is still
// awaiting the informer, leaves no trace: an IPAddress another writer creates afterwards counts as
// soon as the informer shows it. After our own earlier Release (a retry faster than the
// informer), it keeps that Release's record, so the informer's late events of the object deleted
// then cannot make the address look allocated.
func (a *Allocator) Release(ctx context.Context, ip netip.Addr) error {
	off, err := a.offsetOf(ip)
	if err != nil {
		return allocbase.ReleaseNotServed(err)
	}
	if err := a.begin(ctx, off, false); err != nil {
		return err
	}
	err = a.client.Delete(ctx, ip.String(), metav1.DeleteOptions{})
	r := writeResult{kind: writeFailed}
	switch {
	case err == nil:
		r.kind = writeDeleted
	case apierrors.IsNotFound(err):
		r.kind = writeNotFound
	}
	a.mu.Lock()
	a.settleLocked(off, r)
	a.mu.Unlock()
	logger := klog.FromContext(ctx)
	switch {
	case err == nil:
		logger.V(4).Info("Released IP", "ip", ip)
		return nil
	case apierrors.IsNotFound(err):
		return nil
	}
	logger.V(2).Info("Deleting IPAddress failed", "ip", ip, "err", err)
	return fmt.Errorf("ipaddress: delete IPAddress %s: %w", ip, err)
}

// Has reports whether ip is allocated as far as the Allocator knows: the informer's view, overlaid
// with its own writes that the informer has not shown yet. After the Allocator deleted ip's object,
// informer events of that object are ignored as stale; an object the informer shows that is newer
// (by resourceVersion) counts at once, and one it cannot tell from a stale one within a second.
// Where objects have no UID or resourceVersion (client-go's fake clientset), the Allocator's own
// write holds until the informer has shown as many adds and deletes of ip as it made.
func (a *Allocator) Has(ip netip.Addr) bool {
	off, err := a.offsetOf(ip)
	if err != nil {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.expireLocked()
	return a.index.Has(off)
}

// All yields the allocated addresses in ascending order, as they were when iteration started. It
// copies the index (O(n) for n allocated addresses, a memory copy) and sorts outside the lock.
func (a *Allocator) All() iter.Seq[netip.Addr] {
	a.mu.Lock()
	a.expireLocked()
	snap := a.index.Clone()
	a.mu.Unlock()
	return func(yield func(netip.Addr) bool) {
		for off := range snap.All() {
			if !yield(a.addrAt(off)) {
				return
			}
		}
	}
}

// Used returns the number of allocated addresses. It is a counter: O(1).
func (a *Allocator) Used() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.expireLocked()
	return a.index.Len()
}

// Free returns the number of addresses still free. It is a counter: O(1).
func (a *Allocator) Free() uint64 {
	return a.size - a.Used()
}

// DryRun returns a view of a that checks calls as a would and changes nothing: Allocate reports
// the error Allocate would return for an address already in the index or for bad input (and, with
// WithServerDryRun, asks the API server with a dry-run Create), AllocateNext returns an address
// that is free in the index now without reserving it, and Release only validates its input. Both
// reject an owner without a Resource or a Name, as Allocate and AllocateNext do.
func (a *Allocator) DryRun() allocator.Interface { return dryRun{allocbase.DryRunView{R: a}, a} }

// Close removes the informer event handler. Allocate and AllocateNext return allocator.ErrNotReady
// afterwards; the Allocator must not be used any more. Close is idempotent.
func (a *Allocator) Close() error {
	if a.closed.Swap(true) {
		return nil
	}
	if err := a.informer.RemoveEventHandler(a.reg); err != nil {
		return fmt.Errorf("ipaddress: remove informer handler: %w", err)
	}
	return nil
}

// isNil reports whether v is nil or an interface holding a nil pointer, map, slice, func or channel.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan, reflect.Interface:
		return rv.IsNil()
	}
	return false
}

// parseRV returns a resourceVersion as a number, or 0 if it is not one. Resource versions are
// opaque in the API; kube-apiserver's etcd storage uses etcd revisions, which increase with every
// write, and the Allocator compares them only to tell a stale informer event from a newer one.
func parseRV(rv string) uint64 {
	n, err := strconv.ParseUint(rv, 10, 64)
	if err != nil {
		return 0
	}
	return n
}
