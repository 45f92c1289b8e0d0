package bitmap

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"net/netip"
	"sync"

	corev1 "k8s.io/api/core/v1"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/internal/allocbase"
	"github.com/kube-ipam/clusterip/internal/ipmath"
)

var _ allocator.Interface = (*Persistent)(nil)

var errClosed = fmt.Errorf("%w: the persistent allocator is closed", allocator.ErrNotReady)

// Persistent is a bitmap allocator whose state lives in a Store, such as the etcd key that
// kube-apiserver keeps its own Service IP bitmap in, so that several allocators (in one process or
// many) share one range without handing out an address twice.
//
// Every operation is stored with compare-and-swap on the revision it read, and concurrent calls in
// one process are committed together; the package documentation describes the retries, the group
// commit, how a caller's context bounds its wait and what ErrOutcomeUnknown means.
//
// A Persistent is safe for concurrent use. Create one with NewPersistent; the zero Persistent is
// not usable.
type Persistent struct {
	cidr   netip.Prefix
	family corev1.IPFamily
	store  Store
	opts   persistentOptions

	mu       sync.Mutex // guards every field below
	cur      *Allocator // the last known state; never changed once published, only replaced
	rev      int64      // the revision cur was read at or written as
	stale    bool       // cur may be older than the store: read it before the next write
	loadErr  error      // why the last snapshot read was not adopted, until one is (LoadError)
	pending  []*op      // operations waiting for a batch, in arrival order
	inFlight bool       // a lead goroutine is running; it takes the pending operations in batches
	closed   bool

	stats persistentCounters // read by Stats without mu
}

// NewPersistent returns an allocator for cidr whose state lives in store.
//
// If nothing is stored, it stores an empty bitmap (create-if-absent; if another allocator creates
// one first, it uses that). A stored snapshot that cannot be decoded makes it fail with an error
// wrapping ErrCorrupt. A stored snapshot of another range (kube-apiserver's
// --service-cluster-ip-range changed) does not, as it does not stop kube-apiserver from starting:
// the allocator starts empty, and every operation (and Refresh) reads the store again and fails
// with a *RangeMismatchError, whose text begins with kube-apiserver's "the provided range does not
// match the current range", until the store holds a snapshot of cidr, which in Legacy mode
// kube-apiserver's repair loop (or package repair's) writes on its first pass. The stored value is
// never overwritten by NewPersistent or by an operation that fails so. cidr must be acceptable to New and, for
// IPv4, have at most MaxPersistentHostBits host bits (a /12 or longer); otherwise NewPersistent
// returns an *allocator.PrefixError without touching the store.
//
// A nil store or a nil Option is an error matching allocator.ErrInvalid, and so is a Store that
// reports itself invalid on its first Get (such as an etcdstore.Store without a client).
// Options are those of New (every Option is a PersistentOption) plus WithMaxAttempts,
// WithBackoff, WithMaxBatch and WithoutBatching.
// NewPersistent starts no goroutine (operations are committed by a goroutine that lives only
// while some are queued or being stored); the store is not closed by Close.
func NewPersistent(ctx context.Context, cidr netip.Prefix, store Store, opts ...PersistentOption) (*Persistent, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: bitmap: NewPersistent: nil Store", allocator.ErrInvalid)
	}
	o, err := buildPersistentOptions(opts)
	if err != nil {
		return nil, err
	}
	a, err := newAllocator(cidr, o.rand)
	if err != nil {
		return nil, err
	}
	if err := CheckStorable(cidr); err != nil {
		return nil, err
	}
	p := &Persistent{
		cidr:   cidr,
		family: a.family,
		store:  store,
		opts:   o.persist,
		cur:    a,
	}
	s, rev, err := store.Get(ctx)
	if err != nil {
		return nil, fmt.Errorf("bitmap: read stored snapshot of %s: %w", cidr, err)
	}
	if rev == 0 {
		newRev, cerr := store.Update(ctx, 0, a.Snapshot())
		if cerr == nil {
			p.rev = newRev
			return p, nil
		}
		// Someone else created it first, or the outcome of ours is unknown. An empty bitmap is
		// the same whoever wrote it, so whatever is stored now is what to use.
		var ce *ConflictError
		if errors.As(cerr, &ce) && ce.Rev != 0 {
			s, rev = ce.Current, ce.Rev
		} else if s, rev, err = store.Get(ctx); err != nil {
			return nil, fmt.Errorf("bitmap: create stored snapshot of %s: %w; then read it: %w", cidr, cerr, err)
		} else if rev == 0 {
			return nil, fmt.Errorf("bitmap: create stored snapshot of %s: %w", cidr, cerr)
		}
	}
	if err := p.adopt(s, rev); err != nil {
		var mismatch *RangeMismatchError
		if errors.As(err, &mismatch) {
			// kube-apiserver starts over a bitmap of another range too: p stays stale, so every
			// operation reads the store again, and fails until the stored range is cidr.
			return p, nil
		}
		return nil, err
	}
	return p, nil
}

// CheckStorable returns an *allocator.PrefixError if the bitmap of cidr is too large to keep in a
// Store: an IPv4 range with more than MaxPersistentHostBits host bits. It does not check what New
// checks.
func CheckStorable(cidr netip.Prefix) error {
	if cidr.Addr().Is4() && ipmath.HostBits(cidr) > MaxPersistentHostBits {
		return &allocator.PrefixError{Prefix: cidr, Reason: fmt.Sprintf(
			"too large to store: kube-apiserver keeps a bitmap of at most %d host bits (/%d); use a /%d or a longer prefix",
			MaxPersistentHostBits, 32-MaxPersistentHostBits, 32-MaxPersistentHostBits)}
	}
	return nil
}

// CIDR returns the range the allocator serves.
func (p *Persistent) CIDR() netip.Prefix { return p.cidr }

// Family returns IPv4Protocol or IPv6Protocol.
func (p *Persistent) Family() corev1.IPFamily { return p.family }

// Revision returns the store revision of the state Has, All, Used and Free answer from.
func (p *Persistent) Revision() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rev
}

// current returns the last known state. The caller must not change it.
func (p *Persistent) current() *Allocator {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cur
}

// Has reports whether ip was allocated in the last known state.
func (p *Persistent) Has(ip netip.Addr) bool { return p.current().Has(ip) }

// All yields the addresses allocated in the last known state, in ascending order.
func (p *Persistent) All() iter.Seq[netip.Addr] { return p.current().All() }

// Used returns the number of addresses allocated in the last known state.
func (p *Persistent) Used() uint64 { return p.current().Used() }

// Free returns the number of addresses free in the last known state.
func (p *Persistent) Free() uint64 { return p.current().Free() }

// DryRun returns a view that checks calls against the last known state, as the in-memory
// Allocator's DryRun does, and never reads or writes the store.
func (p *Persistent) DryRun() allocator.Interface {
	return persistentDryRun{allocbase.DryRunView{R: p}, p}
}

// Close makes every later operation, and every one still queued, fail with an error wrapping
// allocator.ErrNotReady. An operation being stored finishes normally. Close does not close the
// store and returns nil.
func (p *Persistent) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	kept := p.pending[:0]
	for _, o := range p.pending {
		if o.taken || o.undo {
			kept = append(kept, o)
			continue
		}
		o.finish(netip.Addr{}, errClosed)
	}
	clear(p.pending[len(kept):])
	p.pending = kept
	return nil
}

// Refresh reads the stored snapshot and adopts it if it is newer than the last known state, so
// that Has, All, Used and Free reflect other allocators' writes. It returns a *RangeMismatchError
// (matching allocator.ErrMismatchedNetwork) if the store holds another range, an error wrapping
// ErrCorrupt if it holds garbage, and one wrapping allocator.ErrNotReady if nothing is stored.
func (p *Persistent) Refresh(ctx context.Context) error {
	_, err := p.refresh(ctx)
	return err
}

// refresh reads the stored snapshot, adopts it (see adopt) and returns its revision.
func (p *Persistent) refresh(ctx context.Context) (int64, error) {
	s, rev, err := p.store.Get(ctx)
	if err != nil {
		return 0, fmt.Errorf("bitmap: read stored snapshot of %s: %w", p.cidr, err)
	}
	return rev, p.adopt(s, rev)
}

// Allocate reserves ip in the store. It returns allocator.ErrAllocated if ip is taken in the
// stored state, an *allocator.NotInRangeError or *allocator.AddrError (without touching the
// store) for an address the bitmap does not serve, and an error wrapping the Store's error,
// ErrConflict or ErrOutcomeUnknown if the store could not be updated.
func (p *Persistent) Allocate(ctx context.Context, ip netip.Addr, _ allocator.Owner) error {
	if _, err := p.current().offsetOf(ip); err != nil {
		return err
	}
	_, err := p.submit(ctx, &op{kind: opAllocate, ip: ip})
	return err
}

// AllocateNext reserves a free address in the store, preferring the dynamic band, and returns
// it. If none is free in the stored state it returns the zero Addr and allocator.ErrFull; other
// failures are as for Allocate.
func (p *Persistent) AllocateNext(ctx context.Context, _ allocator.Owner) (netip.Addr, error) {
	return p.submit(ctx, &op{kind: opAllocateNext})
}

// AllocateNextSkipping is AllocateNext that passes over the free addresses skip refuses, in the
// same compare-and-swap as the pick: it reserves the first free address, in AllocateNext's order,
// for which skip reports false, and never writes the bit of an address skip refuses. If every
// free address of the stored state is refused, or none is free, it returns the zero Addr and
// allocator.ErrFull and writes nothing. A nil skip refuses none; other failures are as for
// Allocate.
//
// skip is called by the goroutine that commits the operation, not the caller's, possibly for
// several stored states (after a revision conflict) and after the caller has given up, so it must
// be safe for concurrent use, quick, and must not call p. Its cost is one AllocateNext step per
// address refused, paid in each attempt.
func (p *Persistent) AllocateNextSkipping(ctx context.Context, skip func(netip.Addr) bool) (netip.Addr, error) {
	return p.submit(ctx, &op{kind: opAllocateNext, skip: skip})
}

// Release frees ip in the store. It returns nil if ip is not allocated in the stored state or is
// not one of the bitmap's addresses, an *allocator.AddrError for an invalid, zoned or IPv4-mapped
// ip, and an error as for Allocate if the store could not be updated.
func (p *Persistent) Release(ctx context.Context, ip netip.Addr) error {
	if _, err := p.current().offsetOf(ip); err != nil {
		return allocbase.ReleaseNotServed(err)
	}
	_, err := p.submit(ctx, &op{kind: opRelease, ip: ip})
	return err
}

// adopt makes the stored snapshot s at rev the last known state, unless a newer state is already
// known.
func (p *Persistent) adopt(s Snapshot, rev int64) error {
	if rev == 0 {
		err := fmt.Errorf("%w: no snapshot of %s is stored", allocator.ErrNotReady, p.cidr)
		p.markUnloaded(err)
		return err
	}
	next := p.current().Clone()
	if err := next.Restore(s); err != nil {
		if mismatch := (*RangeMismatchError)(nil); !errors.As(err, &mismatch) {
			err = fmt.Errorf("bitmap: stored snapshot at revision %d: %w", rev, err)
		} // else as is: it begins with kube-apiserver's text, which callers pass on
		p.markUnloaded(err)
		return err
	}
	p.publish(next, rev)
	return nil
}

// LoadError returns why the last snapshot the allocator read from its store could not be
// adopted, or nil if it was adopted or a snapshot has been written since: a *RangeMismatchError
// (matching allocator.ErrMismatchedNetwork) while the store holds another range, as after
// --service-cluster-ip-range changed (see NewPersistent), an error matching allocator.ErrNotReady
// if nothing was stored, or one wrapping ErrCorrupt. While it is not nil, every operation reads
// the store again first. LoadError does no I/O: Refresh, or any operation, reads the store again
// and updates it; a failed read (etcd unreachable) leaves it as it was.
func (p *Persistent) LoadError() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.loadErr
}

// publish makes a the last known state at rev, unless a newer state is already known.
func (p *Persistent) publish(a *Allocator, rev int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if rev < p.rev && !p.stale {
		return
	}
	p.cur, p.rev, p.stale, p.loadErr = a, rev, false, nil
}

func (p *Persistent) markStale() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stale = true
}

// markUnloaded marks the state stale because the stored snapshot could not be adopted, for err.
func (p *Persistent) markUnloaded(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stale, p.loadErr = true, err
}
