package clusterip

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/internal/allocbase"
	"github.com/kube-ipam/clusterip/internal/ipmath"
	"github.com/kube-ipam/clusterip/internal/sharedread"
	"github.com/kube-ipam/clusterip/ipaddress"
)

var _ allocator.Interface = (*DualWriteAllocator)(nil)

const (
	// confirmTimeout bounds the read of an IPAddress object whose create had an ambiguous answer;
	// like an undo, it runs even when the caller's context is done.
	confirmTimeout = 10 * time.Second

	// maxSkips is how many addresses AllocateNext takes from the bitmap and gives back, because
	// the primary holds them already, before it lets the primary choose instead. Such addresses
	// are rare (a peer that frees the bit before its IPAddress object, or an IPAddress-only peer),
	// so reaching the bound means the bitmap is far behind the IPAddress objects.
	maxSkips = 64

	// maxRechecks bounds how many addresses AllocateNext tries again before it answers
	// allocator.ErrFull: those it passed over because the primary held them (whose objects a read
	// may show gone: the primary's informer had not delivered the delete) and those whose bits
	// were set when the primary offered them (bits a peer may have given back since). Each costs a
	// read, and a dual write if the address turns out free; there are a handful at most.
	maxRechecks = 8

	// maxFallbacks is how many addresses the primary may choose inside the bitmap's window, only to
	// find their bits held by a Legacy peer, before AllocateNext reports the range full. Each costs
	// an IPAddress create and delete. A servicecidr primary offers such addresses only from a
	// ServiceCIDR that contains the window (see allocateFromPrimary).
	maxFallbacks = 16
)

// DualWriteAllocator is the allocator of one IP family in DualWrite mode: a primary allocator (the
// servicecidr allocator, which records IPAddress objects) and a bitmap mirror of the family's flag
// range, kept so that every address inside the mirror's window held by the primary is also set in
// the bitmap, which is all that Legacy peers read.
//
// The package documentation says which addresses the mirror covers (its window) and in which
// order the two writes go, so that a Legacy peer never sees a free bit for an address the primary
// holds.
//
// A DualWriteAllocator is safe for concurrent use; the zero value is not usable (see
// NewDualWrite). It holds no lock across a call to either allocator or to the API server.
type DualWriteAllocator struct {
	primary allocator.Interface
	mirror  allocator.Interface
	window  netip.Prefix                              // the mirror's range
	slots   uint64                                    // the mirror's slots: offsets [0, slots) of window
	client  kubernetes.Interface                      // reads back IPAddress objects after ambiguous creates; may be nil
	objects sharedread.Reads[map[netip.Addr]struct{}] // allocateGivenBack's Lists, shared by the callers that find the window full

	skipped    atomic.Uint64
	undone     atomic.Uint64
	undoFailed atomic.Uint64
	kept       atomic.Uint64
	confirmed  atomic.Uint64
	refused    atomic.Uint64
}

// DualWriteOption configures NewDualWrite.
type DualWriteOption func(*DualWriteAllocator)

// WithClient reads IPAddress objects through client when a create's answer does not say whether
// the object was stored, so that an allocation the server did store is not reported as failed.
// Default none: such an allocation fails and its bit stays set, a leak that repair frees. A nil
// client keeps the default.
func WithClient(client kubernetes.Interface) DualWriteOption {
	return func(d *DualWriteAllocator) {
		if client != nil {
			d.client = client
		}
	}
}

// NewDualWrite returns the dual-write allocator of primary and mirror, which must serve the same
// IP family; mirror must have a range (a non-zero CIDR), normally a *bitmap.Persistent of the
// family's flag range. Close closes both.
func NewDualWrite(primary, mirror allocator.Interface, opts ...DualWriteOption) (*DualWriteAllocator, error) {
	if primary == nil || mirror == nil {
		return nil, errors.New("clusterip: NewDualWrite: nil allocator")
	}
	w := mirror.CIDR()
	if err := allocator.CheckPrefix(w); err != nil {
		return nil, fmt.Errorf("clusterip: NewDualWrite: the bitmap mirror's range: %w", err)
	}
	if got, want := primary.Family(), mirror.Family(); got != want {
		return nil, fmt.Errorf("clusterip: NewDualWrite: primary serves %s, bitmap mirror %s", got, want)
	}
	slots := ipmath.Size(w)
	if w.Addr().Is6() {
		slots = min(slots, bitmap.MaxIPv6Slots)
	}
	d := &DualWriteAllocator{primary: primary, mirror: mirror, window: w, slots: slots}
	for _, opt := range opts {
		if opt != nil {
			opt(d)
		}
	}
	return d, nil
}

// Primary returns the allocator of IPAddress objects.
func (d *DualWriteAllocator) Primary() allocator.Interface { return d.primary }

// Mirror returns the bitmap mirror.
func (d *DualWriteAllocator) Mirror() allocator.Interface { return d.mirror }

// InWindow reports whether ip has a slot in the bitmap mirror, so that holding it takes a bit as
// well as an IPAddress object.
func (d *DualWriteAllocator) InWindow(ip netip.Addr) bool {
	if allocator.CheckAddr(ip) != nil {
		return false
	}
	off, ok := ipmath.Offset(d.window, ip)
	return ok && off < d.slots
}

// DualWriteStats counts what a DualWriteAllocator did besides plain dual writes.
type DualWriteStats struct {
	// Skipped counts addresses AllocateNext passed over in the bitmap because the primary held
	// them already (its IPAddress object still existed, as far as it knew), without setting their
	// bits if the mirror has AllocateNextSkipping and taking them and giving them back otherwise,
	// and addresses it gave back because their creates found the object or the primary could not
	// serve them. An address passed over again, in a compare-and-swap retried after a conflict,
	// may be counted again.
	Skipped uint64
	// Undone counts first writes undone after the second failed, skips included.
	Undone uint64
	// UndoFailed counts undos that failed themselves, each leaving one address in one store only
	// (a leak that repair frees).
	UndoFailed uint64
	// Kept counts bits left set after an IPAddress create whose outcome stayed unknown (each a
	// possible leak that repair frees), and after one that found another owner's object.
	Kept uint64
	// Confirmed counts IPAddress creates with an ambiguous answer that a read showed stored for
	// the owner: allocations that stood.
	Confirmed uint64
	// Refused counts addresses the primary chose inside the window whose bits were held (a Legacy
	// peer's or stale bits): each cost an IPAddress create and delete. They are among Skipped and
	// Undone too.
	Refused uint64
}

// Stats returns the counts so far.
func (d *DualWriteAllocator) Stats() DualWriteStats {
	return DualWriteStats{
		Skipped: d.skipped.Load(), Undone: d.undone.Load(), UndoFailed: d.undoFailed.Load(),
		Kept: d.kept.Load(), Confirmed: d.confirmed.Load(), Refused: d.refused.Load(),
	}
}

// refused reports whether err, from the primary's Allocate, says that no IPAddress object was
// stored: the allocators' own refusals (taken, out of range, not ready, invalid input), and API
// answers in the 4xx class, which the server gives before it writes (Conflict and AlreadyExists,
// Invalid, Forbidden, TooManyRequests...) except 408. Anything else (a 5xx, among them 504
// Timeout and 500 errors from storage, a transport error with no answer, the caller's context
// ending while the request was out) leaves the outcome unknown.
func refused(err error) bool {
	var nir *allocator.NotInRangeError
	var addrErr *allocator.AddrError
	var ownerErr *allocator.OwnerError
	switch {
	case errors.Is(err, allocator.ErrAllocated), errors.Is(err, allocator.ErrNotReady),
		errors.Is(err, allocator.ErrFull), errors.Is(err, allocator.ErrMismatchedNetwork),
		errors.As(err, &nir), errors.As(err, &addrErr), errors.As(err, &ownerErr):
		return true
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		code := status.Status().Code
		return code >= 400 && code < 500 && code != http.StatusRequestTimeout
	}
	return false
}

// createOutcome is what a read of the IPAddress object of an ambiguous create showed.
type createOutcome int

const (
	outcomeUnknown createOutcome = iota // no object, or the read failed: the create may yet land
	outcomeOurs                         // the object exists for the owner: the allocation stands
	outcomeOthers                       // the object exists for another owner
)

// confirm reads the IPAddress object of ip after a create whose answer was ambiguous (cause),
// even when ctx is done. Finding no object proves nothing: a create answered by a timeout may
// still be stored after the read, so only an object found decides.
func (d *DualWriteAllocator) confirm(ctx context.Context, ip netip.Addr, owner allocator.Owner, cause error) createOutcome {
	logger := klog.FromContext(ctx)
	if d.client == nil {
		logger.Info("IPAddress create had an ambiguous answer; keeping its bit for repair", "ip", ip, "err", cause)
		return outcomeUnknown
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), confirmTimeout)
	defer cancel()
	obj, err := d.client.NetworkingV1().IPAddresses().Get(cctx, ip.String(), metav1.GetOptions{})
	switch {
	case err != nil:
		logger.Info("IPAddress create had an ambiguous answer, and reading the object failed; keeping its bit for repair", "ip", ip, "err", cause, "readErr", err)
		return outcomeUnknown
	case ipaddress.HasParent(obj, owner):
		return outcomeOurs
	}
	logger.Info("IPAddress create had an ambiguous answer, and the object has another parent; keeping its bit", "ip", ip, "err", cause, "parentRef", obj.Spec.ParentRef)
	return outcomeOthers
}

// settle ends a dual write whose bit for ip is set and whose IPAddress create returned err: it
// clears the bit again if the create was refused, and otherwise confirms the outcome, keeping the
// bit unless the object is known absent. It returns nil if the allocation stands.
func (d *DualWriteAllocator) settle(ctx context.Context, ip netip.Addr, owner allocator.Owner, err error) error {
	if refused(err) {
		d.giveBackBit(ctx, ip)
		return err
	}
	switch d.confirm(ctx, ip, owner, err) {
	case outcomeOurs:
		d.confirmed.Add(1)
		return nil
	case outcomeOthers:
		d.kept.Add(1)
		bitKept(ctx, ip)
		return fmt.Errorf("clusterip: %s: its IPAddress belongs to another owner (after %v): %w", ip, err, allocator.ErrAllocated)
	}
	d.kept.Add(1)
	bitKept(ctx, ip)
	return fmt.Errorf("clusterip: %s: the IPAddress create's outcome is unknown, so its bit stays set for repair: %w", ip, err)
}

// undo runs release(ip) to take back the first half of a dual write, even when ctx is done, and
// reports whether it did; what names the store for the log.
func (d *DualWriteAllocator) undo(ctx context.Context, what string, ip netip.Addr, release func(context.Context, netip.Addr) error) bool {
	d.undone.Add(1)
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), allocator.UndoTimeout)
	defer cancel()
	if err := release(uctx, ip); err != nil {
		d.undoFailed.Add(1)
		klog.FromContext(ctx).Error(err, "Could not undo half of a dual write; repair will free the address", "ip", ip, "store", what)
		return false
	}
	return true
}

// giveBackBit clears the bit this call set for ip and, once it is clear, reports it to the
// call's DualWriteTrace.
func (d *DualWriteAllocator) giveBackBit(ctx context.Context, ip netip.Addr) {
	if d.undo(ctx, "bitmap", ip, d.mirror.Release) {
		bitGivenBack(ctx, ip)
	}
}

// Allocate reserves ip for owner. Inside the bitmap's window it sets the bit first and then creates
// the IPAddress object, clearing the bit again if the create is refused (and keeping it if the
// create's outcome is unknown, see the package documentation); outside it asks the primary
// alone. A bit that is already set gives allocator.ErrAllocated, whether the address is ours or a
// Legacy peer's; an owner without a Resource or a Name gives an *allocator.OwnerError before any
// bit is written; the errors are otherwise those of the two allocators (see allocator.Interface).
func (d *DualWriteAllocator) Allocate(ctx context.Context, ip netip.Addr, owner allocator.Owner) error {
	if err := allocator.CheckAddr(ip); err != nil {
		return err
	}
	if err := allocator.CheckOwner(owner); err != nil {
		return err
	}
	if !d.InWindow(ip) {
		return d.primary.Allocate(ctx, ip, owner)
	}
	if err := d.mirror.Allocate(ctx, ip, owner); err != nil {
		switch {
		case errors.Is(err, allocator.ErrAllocated):
			return fmt.Errorf("clusterip: %s is set in the bitmap of %s: %w", ip, d.window, err)
		case errors.Is(err, allocator.ErrMismatchedNetwork):
			return err // a bitmap of another range: its text is kube-apiserver's answer
		}
		return fmt.Errorf("clusterip: set %s in the bitmap of %s: %w", ip, d.window, err)
	}
	if err := d.primary.Allocate(ctx, ip, owner); err != nil {
		return d.settle(ctx, ip, owner, err)
	}
	return nil
}

// AllocateNext reserves a free address for owner and returns it. It takes a free bit of the
// bitmap's window first and then creates that address's IPAddress object. An address whose
// object the primary still holds (a peer freed the bit before deleting the object, or an
// IPAddress-only peer holds it) is passed over: with a mirror that has AllocateNextSkipping (both
// bitmap allocators do) inside the compare-and-swap that takes the bit, so that its bit is never
// set, even for a moment, since another bitmap reader would then find it taken; with another
// mirror its bit is taken and given back. An address whose create finds the object there, or
// that no ready ServiceCIDR serves, is given back and another taken, never reported as an error.
// Once the window has no free bit (even if its addresses have no IPAddress objects, as a Legacy
// peer's Services leave them), or the primary cannot serve it, the primary chooses an address of
// a ServiceCIDR outside the window; one it chooses inside the window is kept only if its bit can
// be set.
//
// It returns allocator.ErrFull only when no address was free at some instant of the call: before
// it does, it tries again (up to maxRechecks) the addresses it passed over whose IPAddress
// objects a read from the API server shows gone (needs WithClient), and those the primary offered
// whose bits a fresh read of the bitmap shows cleared, since a peer's transient bit or a lagging
// informer is no full range. Last, it reads every IPAddress object in one consistent List and
// waits up to 375 ms for the bits set without an object to be given back (a peer's dual write
// holds one for a moment; a Legacy peer's stays). A failed read is returned as an error, not as
// ErrFull. Other errors
// of the two allocators are returned at once. While the stored bitmap is of another range than
// the mirror's (the flag range changed; see bitmap.NewPersistent), it takes an address from the
// primary alone, as kube-apiserver v1.33 does when its bitmap fails. An owner without a Resource
// or a Name gives an *allocator.OwnerError before any bit is written.
func (d *DualWriteAllocator) AllocateNext(ctx context.Context, owner allocator.Owner) (netip.Addr, error) {
	if err := allocator.CheckOwner(owner); err != nil {
		return netip.Addr{}, err
	}
	if r, ok := d.primary.(interface{ Ready() bool }); ok && !r.Ready() {
		return d.primary.AllocateNext(ctx, owner) // reports why it cannot serve, and writes no bit
	}
	passed := &passedOver{}
	defer func() { d.skipped.Add(passed.total()) }()
	takeBit := func(ctx context.Context) (netip.Addr, error) { return d.mirror.AllocateNext(ctx, owner) }
	if m, ok := d.mirror.(skippingMirror); ok {
		takeBit = func(ctx context.Context) (netip.Addr, error) {
			return m.AllocateNextSkipping(ctx, func(ip netip.Addr) bool {
				if d.primary.Has(ip) {
					passed.add(ip)
					return true
				}
				return false
			})
		}
	}
	for skips := 0; skips < maxSkips; skips++ {
		ip, err := takeBit(ctx)
		if errors.Is(err, allocator.ErrFull) {
			break
		}
		if errors.Is(err, allocator.ErrMismatchedNetwork) {
			// The stored bitmap is of another range (the flag changed): as kube-apiserver v1.33
			// does, take an address from the ServiceCIDRs alone, with no bit to write.
			return d.primary.AllocateNext(ctx, owner)
		}
		if err != nil {
			return netip.Addr{}, fmt.Errorf("clusterip: take a free bit of %s: %w", d.window, err)
		}
		if d.primary.Has(ip) {
			// Its IPAddress object still exists as far as the primary knows (a mirror that cannot
			// pass it over took it, or the primary learnt of it meanwhile): give it back untried.
			passed.add(ip)
			d.giveBackBit(ctx, ip)
			continue
		}
		err = d.primary.Allocate(ctx, ip, owner)
		if err == nil {
			return ip, nil
		}
		if err = d.settle(ctx, ip, owner, err); err == nil {
			return ip, nil
		}
		if errors.Is(err, allocator.ErrAllocated) {
			d.skipped.Add(1)
			continue
		}
		var nir *allocator.NotInRangeError
		if errors.As(err, &nir) || errors.Is(err, allocator.ErrNotReady) && ctx.Err() == nil {
			// No ready ServiceCIDR serves this part of the flag range: let the primary choose
			// from those that are ready.
			d.skipped.Add(1)
			break
		}
		return netip.Addr{}, err
	}
	ip, refusedBits, err := d.allocateFromPrimary(ctx, owner)
	if !errors.Is(err, allocator.ErrFull) {
		return ip, err
	}
	return d.recheck(ctx, owner, passed.addrs(), refusedBits, err)
}

// skippingMirror is a bitmap mirror that takes the next free bit passing over the addresses a
// predicate refuses, in the compare-and-swap that sets it, as bitmap.Persistent and
// bitmap.Allocator do.
type skippingMirror interface {
	AllocateNextSkipping(ctx context.Context, skip func(netip.Addr) bool) (netip.Addr, error)
}

// refresher is a bitmap mirror that can read its stored state again, as bitmap.Persistent can.
type refresher interface {
	Refresh(ctx context.Context) error
}

// passedOver records the addresses one AllocateNext passed over because the primary held them.
// Its methods are safe for concurrent use: a bitmap.Persistent calls its predicate from the
// goroutine that commits the operation. The zero value is empty.
type passedOver struct {
	mu    sync.Mutex   // guards the fields below
	first []netip.Addr // the first maxRechecks distinct addresses
	more  uint64       // addresses passed over beyond them, each time (a retried compare-and-swap asks again)
}

func (p *passedOver) add(ip netip.Addr) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case slices.Contains(p.first, ip):
	case len(p.first) < maxRechecks:
		p.first = append(p.first, ip)
	default:
		p.more++
	}
}

// addrs returns the first addresses passed over, at most maxRechecks.
func (p *passedOver) addrs() []netip.Addr {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.first)
}

// total returns how many addresses were passed over.
func (p *passedOver) total() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return uint64(len(p.first)) + p.more
}

// recheck is AllocateNext's last step once neither the bitmap nor the primary had a free address
// (full, the primary's ErrFull). Two kinds of addresses may have been free all the same: passed,
// those passed over because the primary held them, whose objects the primary's informer may show
// after their delete (a read from the API server tells); and refusedBits, those the primary
// offered whose bits were set, by a peer that may have given them back since (a fresh read of
// the bitmap tells). recheck reads once, then tries a dual write on each address the reads show
// free, at most maxRechecks in all, and returns the first that succeeds; when none does, it
// waits for the bits without an object (allocateGivenBack). A failed read is an error of its own.
func (d *DualWriteAllocator) recheck(ctx context.Context, owner allocator.Owner, passed, refusedBits []netip.Addr, full error) (netip.Addr, error) {
	var cands []netip.Addr
	if r, ok := d.mirror.(refresher); ok && len(refusedBits) > 0 {
		if err := r.Refresh(ctx); err != nil {
			return netip.Addr{}, fmt.Errorf("clusterip: the bitmap of %s looked full; reading it again: %w", d.window, err)
		}
		for _, ip := range refusedBits {
			if !d.mirror.Has(ip) && !d.primary.Has(ip) {
				cands = append(cands, ip)
			}
		}
	}
	if d.client != nil {
		for _, ip := range passed {
			if len(cands) >= maxRechecks {
				break
			}
			if d.mirror.Has(ip) || slices.Contains(cands, ip) {
				continue
			}
			_, err := d.client.NetworkingV1().IPAddresses().Get(ctx, ip.String(), metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				cands = append(cands, ip) // deleted; the primary's informer has not shown it yet
			case err != nil:
				return netip.Addr{}, fmt.Errorf("clusterip: %s looked held by an IPAddress; reading it: %w", ip, err)
			}
		}
	}
	logger := klog.FromContext(ctx)
	cands = cands[:min(len(cands), maxRechecks)]
	for _, ip := range cands {
		got, err := d.tryAddr(ctx, ip, owner)
		if err != nil {
			return netip.Addr{}, err
		}
		if got {
			logger.V(2).Info("Allocated an address that looked held before answering full", "ip", ip, "owner", owner)
			return ip, nil
		}
	}
	return d.allocateGivenBack(ctx, owner, cands, full)
}

// outsideAllocator is a primary that can choose an address outside a prefix, as
// servicecidr.Allocator does.
type outsideAllocator interface {
	AllocateNextOutside(ctx context.Context, owner allocator.Owner, p netip.Prefix) (netip.Addr, error)
}

// allocateFromPrimary lets the primary choose an address, for when the bitmap's window is full or
// not served: from the ServiceCIDRs outside the window if the primary can tell them apart (so
// that a window full of a Legacy peer's bits costs nothing while another ServiceCIDR has room),
// else from any. An address inside the window (from a primary that cannot, or from a ServiceCIDR
// that contains the window, such as an IPv6 flag range wider than the bitmap) is kept only if its
// bit can be set too; otherwise its IPAddress is deleted again, which is safe whatever the bitmap's
// answer was, since a bit without an object is a leak and never a duplicate.
//
// It also returns the distinct addresses the primary offered whose bits were set (at most
// maxFallbacks), for AllocateNext's recheck.
func (d *DualWriteAllocator) allocateFromPrimary(ctx context.Context, owner allocator.Owner) (netip.Addr, []netip.Addr, error) {
	next := d.primary.AllocateNext
	// Only a window the bitmap covers whole may be skipped: the rest of an IPv6 flag range wider
	// than the bitmap's slots lives in the primary alone, in the ServiceCIDR of the window itself.
	if o, ok := d.primary.(outsideAllocator); ok && d.slots == ipmath.Size(d.window) {
		next = func(ctx context.Context, owner allocator.Owner) (netip.Addr, error) {
			return o.AllocateNextOutside(ctx, owner, d.window)
		}
	}
	var refusedBits []netip.Addr
	for range maxFallbacks {
		ip, err := next(ctx, owner)
		if err != nil {
			return netip.Addr{}, refusedBits, err
		}
		if !d.InWindow(ip) {
			return ip, nil, nil
		}
		err = d.mirror.Allocate(ctx, ip, owner)
		if err == nil {
			return ip, nil, nil
		}
		d.undo(ctx, "IPAddress", ip, d.primary.Release)
		if !errors.Is(err, allocator.ErrAllocated) {
			return netip.Addr{}, nil, fmt.Errorf("clusterip: set %s in the bitmap of %s: %w", ip, d.window, err)
		}
		// A Legacy peer's bit (or a stale one, or a peer's for a moment): never taken over.
		d.skipped.Add(1)
		d.refused.Add(1)
		if !slices.Contains(refusedBits, ip) {
			refusedBits = append(refusedBits, ip)
		}
	}
	return netip.Addr{}, refusedBits, fmt.Errorf("clusterip: every free address the ServiceCIDRs offered is held in the bitmap of %s: %w", d.window, allocator.ErrFull)
}

// Release frees ip: it deletes the IPAddress object first and then, inside the window, clears the
// bit, so that no Legacy peer sees the address free while the object exists. If the object cannot
// be deleted the bit stays set. Releasing an address that is not allocated returns nil, and so
// does a release whose bitmap is stored for another range (nothing of the mirror's is there).
func (d *DualWriteAllocator) Release(ctx context.Context, ip netip.Addr) error {
	if err := allocator.CheckAddr(ip); err != nil {
		return err
	}
	if err := d.primary.Release(ctx, ip); err != nil {
		return err
	}
	if !d.InWindow(ip) {
		return nil
	}
	if err := d.mirror.Release(ctx, ip); err != nil && !errors.Is(err, allocator.ErrMismatchedNetwork) {
		return fmt.Errorf("clusterip: %s: IPAddress deleted, but clearing its bit in %s failed: %w", ip, d.window, err)
	}
	return nil
}

// Has reports whether ip is held: by the primary, or by a bit of the window (a Legacy peer's bit
// counts, since Allocate refuses it).
func (d *DualWriteAllocator) Has(ip netip.Addr) bool {
	return d.primary.Has(ip) || (d.InWindow(ip) && d.mirror.Has(ip))
}

// All yields every address Has reports, once and in ascending order.
func (d *DualWriteAllocator) All() iter.Seq[netip.Addr] {
	return mergeSorted(d.primary.All(), d.mirror.All())
}

// mergeSorted yields the union of two ascending sequences, in ascending order.
func mergeSorted(a, b iter.Seq[netip.Addr]) iter.Seq[netip.Addr] {
	return func(yield func(netip.Addr) bool) {
		nextB, stop := iter.Pull(b)
		defer stop()
		vb, okB := nextB()
		for va := range a {
			for okB && vb.Less(va) {
				if !yield(vb) {
					return
				}
				vb, okB = nextB()
			}
			if okB && vb == va {
				vb, okB = nextB()
			}
			if !yield(va) {
				return
			}
		}
		for okB {
			if !yield(vb) {
				return
			}
			vb, okB = nextB()
		}
	}
}

// CIDR returns the zero Prefix: the primary serves every ServiceCIDR of the family.
func (d *DualWriteAllocator) CIDR() netip.Prefix { return netip.Prefix{} }

// Family returns the IP family both allocators serve.
func (d *DualWriteAllocator) Family() corev1.IPFamily { return d.primary.Family() }

// Used returns the number of addresses the primary holds. Bits a Legacy peer holds without an
// IPAddress object are not counted (counting them would cost a walk of the bitmap).
func (d *DualWriteAllocator) Used() uint64 { return d.primary.Used() }

// Free returns the number of addresses the primary can still allocate.
func (d *DualWriteAllocator) Free() uint64 { return d.primary.Free() }

// DryRun returns a view that checks calls against both allocators and changes nothing.
func (d *DualWriteAllocator) DryRun() allocator.Interface {
	return dualWriteDryRun{DryRunView: allocbase.DryRunView{R: d}, d: d}
}

// Close closes the primary and the mirror.
func (d *DualWriteAllocator) Close() error {
	return errors.Join(d.primary.Close(), d.mirror.Close())
}

// dualWriteDryRun answers as its DualWriteAllocator would and changes nothing. The read methods,
// Release (which only checks its input) and Close come from allocbase.DryRunView, as in every
// other backend's view.
type dualWriteDryRun struct {
	allocbase.DryRunView
	d *DualWriteAllocator
}

func (v dualWriteDryRun) Allocate(ctx context.Context, ip netip.Addr, owner allocator.Owner) error {
	if err := allocator.CheckAddr(ip); err != nil {
		return err
	}
	if v.d.InWindow(ip) {
		if err := v.d.mirror.DryRun().Allocate(ctx, ip, owner); err != nil {
			return err
		}
	}
	return v.d.primary.DryRun().Allocate(ctx, ip, owner)
}

func (v dualWriteDryRun) AllocateNext(ctx context.Context, owner allocator.Owner) (netip.Addr, error) {
	ip, err := v.d.mirror.DryRun().AllocateNext(ctx, owner)
	if err == nil && v.d.primary.DryRun().Allocate(ctx, ip, owner) == nil {
		return ip, nil
	}
	primary := v.d.primary.DryRun()
	next := primary.AllocateNext
	if o, ok := primary.(outsideAllocator); ok {
		next = func(ctx context.Context, owner allocator.Owner) (netip.Addr, error) {
			return o.AllocateNextOutside(ctx, owner, v.d.window)
		}
	}
	for range maxFallbacks {
		ip, err := next(ctx, owner)
		if err != nil || !v.d.InWindow(ip) || !v.d.mirror.Has(ip) {
			return ip, err
		}
	}
	return netip.Addr{}, allocator.ErrFull
}

func (v dualWriteDryRun) DryRun() allocator.Interface { return v }
