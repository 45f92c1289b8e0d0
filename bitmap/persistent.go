package bitmap

import (
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

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/internal/ipmath"
)

var _ allocator.Interface = (*Persistent)(nil)

// ErrOutcomeUnknown means a write to the Store failed in a way that leaves it unknown whether it
// was stored, for example because etcd went away before it answered. The operations of that write
// report failure, but their addresses may be held in the store without an owner: a leak, which a
// repair pass finds, never a duplicate. A caller that gives up while its write is in flight gets it
// too (wrapping its context's error as well); see Persistent for how that write is undone.
var ErrOutcomeUnknown = errors.New("bitmap: outcome of the write is unknown")

var errClosed = fmt.Errorf("%w: the persistent allocator is closed", allocator.ErrNotReady)

// Persistent is a bitmap allocator whose state lives in a Store, such as the etcd key that
// kube-apiserver keeps its own Service IP bitmap in, so that several allocators (in one process or
// many) share one range without handing out an address twice.
//
// Every operation restores the stored snapshot when the local copy is stale, applies the
// operation to a copy of it, and stores the result with compare-and-swap on the revision read;
// it adopts the result only once the store has accepted it. A revision conflict reloads the
// snapshot and retries after a random backoff, at most WithMaxAttempts times; then the operation
// fails with an error wrapping ErrConflict.
//
// Concurrent calls in one process are committed together (group commit): while one
// compare-and-swap is in flight, new calls queue up; then every queued operation is applied, in
// arrival order, to one copy, which is stored with a single compare-and-swap, and each caller gets
// its own result (an operation that fails, say with allocator.ErrAllocated, fails
// alone). No lock is held across a Store call, so Has, All, Used, Free, CIDR and DryRun answer at
// once from the last state the allocator read or wrote; they do not see writes of other
// allocators until the next operation or Refresh.
//
// A caller's context bounds its wait, whatever the other callers of its batch do. A caller whose
// context ends before its operation is being stored returns the context's error at once, and the
// operation is dropped. One whose context ends while a Store write including its operation is in
// flight returns at once with an error wrapping both ErrOutcomeUnknown and the context's error; if
// that write is then stored, the allocator releases the address of such an Allocate or
// AllocateNext in a later batch, so that an address nobody was told about does not stay taken. A
// Store call is canceled only when every caller in its batch has given up. A Store error other than a conflict is followed by a fencing
// write (the old snapshot again, with compare-and-swap on the old revision): if that succeeds the
// operations failed and nothing was stored; if not, they fail with an error wrapping
// ErrOutcomeUnknown. So an error that does not wrap ErrOutcomeUnknown always means that the
// operation changed nothing in the store.
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
	pending  []*op      // operations waiting for a batch, in arrival order
	inFlight bool       // a lead goroutine is running; it takes the pending operations in batches
	closed   bool
}

// NewPersistent returns an allocator for cidr whose state lives in store.
//
// If nothing is stored, it stores an empty bitmap (create-if-absent; if another allocator creates
// one first, it uses that). A stored snapshot of another range makes it fail with an error wrapping
// allocator.ErrMismatchedNetwork, and one that cannot be decoded with an error wrapping ErrCorrupt;
// the stored value is never overwritten in either case. cidr must be acceptable to New and, for
// IPv4, have at most MaxPersistentHostBits host bits (a /12 or longer); otherwise NewPersistent
// returns an *allocator.PrefixError without touching the store.
//
// A nil store or a nil Option is an error matching allocator.ErrInvalid, and so is a Store that
// reports itself invalid on its first Get (such as an etcdstore.Store without a client).
// Options are those of New plus WithMaxAttempts, WithBackoff, WithMaxBatch and WithoutBatching.
// NewPersistent starts no goroutine (operations are committed by a goroutine that lives only
// while some are queued or being stored); the store is not closed by Close.
func NewPersistent(ctx context.Context, cidr netip.Prefix, store Store, opts ...Option) (*Persistent, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: bitmap: NewPersistent: nil Store", allocator.ErrInvalid)
	}
	o, err := buildOptions(opts)
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
		opts:   o.persist.withDefaults(),
		cur:    a,
	}
	s, rev, err := store.Get(ctx)
	if err != nil {
		return nil, fmt.Errorf("bitmap: read stored snapshot of %s: %w", cidr, err)
	}
	if rev == 0 {
		rs, data := a.Snapshot()
		newRev, cerr := store.Update(ctx, 0, Snapshot{Range: rs, Data: data})
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
func (p *Persistent) DryRun() allocator.Interface { return persistentDryRun{p} }

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
// that Has, All, Used and Free reflect other allocators' writes. It returns an error wrapping
// allocator.ErrMismatchedNetwork or ErrCorrupt if the store holds another range or garbage, and
// one wrapping allocator.ErrNotReady if nothing is stored.
func (p *Persistent) Refresh(ctx context.Context) error {
	s, rev, err := p.store.Get(ctx)
	if err != nil {
		return fmt.Errorf("bitmap: read stored snapshot of %s: %w", p.cidr, err)
	}
	return p.adopt(s, rev)
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

// Release frees ip in the store. It returns nil if ip is not allocated in the stored state or is
// not one of the bitmap's addresses, an *allocator.AddrError for an invalid, zoned or IPv4-mapped
// ip, and an error as for Allocate if the store could not be updated.
func (p *Persistent) Release(ctx context.Context, ip netip.Addr) error {
	if _, err := p.current().offsetOf(ip); err != nil {
		if _, bad := err.(*allocator.AddrError); bad {
			return err
		}
		return nil
	}
	_, err := p.submit(ctx, &op{kind: opRelease, ip: ip})
	return err
}

type opKind uint8

const (
	opAllocate opKind = iota
	opAllocateNext
	opRelease
)

// op is one queued operation. The caller waits for done; ip and err are final once it is closed.
type op struct {
	ctx  context.Context
	kind opKind
	ip   netip.Addr // the address of Allocate and Release; the result of AllocateNext
	err  error

	// Guarded by Persistent.mu.
	taken     bool // in a batch: the caller may not simply remove it from the queue
	writing   bool // a Store write that includes its effect is in flight
	abandoned bool // the caller has returned without its result
	undo      bool // a release the committer queued for an abandoned allocation; no caller waits

	done   chan struct{} // closed by finish
	cancel func()        // releases ctx, for an undo op; nil otherwise

	// Results of applying the op to the current attempt's copy; final only if that copy is stored.
	tryIP  netip.Addr
	tryErr error
}

func (o *op) finish(ip netip.Addr, err error) {
	o.ip, o.err = ip, err
	close(o.done)
	if o.cancel != nil {
		o.cancel()
	}
}

// submit queues o and returns its result once it is finished, or at once if ctx ends first. A
// caller that gives up while a write including o is in flight gets an error wrapping both
// ErrOutcomeUnknown and ctx's error; the committer undoes o's allocation if that write is stored.
// The batches are committed by a goroutine of their own (see lead), so that a caller never waits
// for Store calls that do not include its operation.
func (p *Persistent) submit(ctx context.Context, o *op) (netip.Addr, error) {
	o.ctx = ctx
	o.done = make(chan struct{})
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return netip.Addr{}, errClosed
	}
	if err := ctx.Err(); err != nil {
		p.mu.Unlock()
		return netip.Addr{}, err
	}
	p.enqueueLocked(o)
	p.mu.Unlock()
	select {
	case <-o.done:
		return o.ip, o.err
	case <-ctx.Done():
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-o.done: // finished meanwhile (or failed by Close)
		return o.ip, o.err
	default:
	}
	if !o.taken {
		if i := slices.Index(p.pending, o); i >= 0 {
			p.pending = slices.Delete(p.pending, i, i+1)
		}
		return netip.Addr{}, ctx.Err()
	}
	// The committer drops an abandoned op before its next write; one being written is undone
	// after the write if that is stored (see settle).
	o.abandoned = true
	if o.writing {
		return netip.Addr{}, fmt.Errorf("%w: %s: the caller gave up while it was being stored: %w", ErrOutcomeUnknown, p.cidr, ctx.Err())
	}
	return netip.Addr{}, ctx.Err()
}

// enqueueLocked appends o to the queue and starts a committer if none is running.
func (p *Persistent) enqueueLocked(o *op) {
	p.pending = append(p.pending, o)
	if !p.inFlight {
		p.inFlight = true
		go p.lead()
	}
}

// undoTimeout bounds the Store calls of a release that undoes an abandoned allocation. If the
// store does not take it within that time, the address stays allocated without an owner (a leak
// that repair finds), as after a write whose outcome is unknown.
const undoTimeout = time.Minute

// lead commits batches of queued operations, in arrival order, until none is left.
func (p *Persistent) lead() {
	for {
		p.mu.Lock()
		if len(p.pending) == 0 {
			p.inFlight = false
			p.mu.Unlock()
			return
		}
		n := min(len(p.pending), p.opts.maxBatch)
		batch := slices.Clone(p.pending[:n])
		rest := copy(p.pending, p.pending[n:])
		clear(p.pending[rest:])
		p.pending = p.pending[:rest]
		for _, o := range batch {
			o.taken = true
		}
		closed := p.closed
		p.mu.Unlock()

		if closed {
			// Undo ops are still committed: their addresses would leak otherwise.
			undos := batch[:0]
			for _, o := range batch {
				if o.undo {
					undos = append(undos, o)
					continue
				}
				o.finish(netip.Addr{}, errClosed)
			}
			if batch = undos; len(batch) == 0 {
				continue
			}
		}
		p.commit(batch[0].ctx, batch)
	}
}

// batchContext returns a context for the Store calls of batch that keeps parent's values and ends
// when the contexts of all of batch's callers have ended, and a function to release it.
func batchContext(parent context.Context, batch []*op) (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(parent))
	var left atomic.Int64
	left.Store(int64(len(batch)))
	stops := make([]func() bool, len(batch))
	for i, o := range batch {
		stops[i] = context.AfterFunc(o.ctx, func() {
			if left.Add(-1) == 0 {
				cancel()
			}
		})
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}

// commit stores the effect of batch with as few compare-and-swaps as it can and finishes every op.
func (p *Persistent) commit(parent context.Context, batch []*op) {
	ctx, release := batchContext(parent, batch)
	defer release()

	live := batch
	var freshRev int64 // the newest revision read from the store during this commit; 0 if none
	attempts := 0
	for {
		live = dropCanceled(live)
		if len(live) == 0 {
			return
		}
		p.mu.Lock()
		base, rev, stale := p.cur, p.rev, p.stale
		p.mu.Unlock()
		if stale {
			s, r, err := p.store.Get(ctx)
			if err != nil {
				failAll(live, fmt.Errorf("bitmap: read stored snapshot of %s: %w", p.cidr, err))
				return
			}
			if err := p.adopt(s, r); err != nil {
				failAll(live, err)
				return
			}
			freshRev = max(freshRev, r)
			continue
		}

		next := base.Clone()
		if !apply(next, live) {
			// Nothing to write, but the answers (already allocated, full, nothing to release) come
			// from the local state: confirm that it is current before giving them. A state at least
			// as new as one read during this commit needs no confirmation; an older one may have
			// been brought back by a concurrent Refresh that adopted it while the state was stale.
			if freshRev != 0 && rev >= freshRev {
				finishAll(live)
				return
			}
			s, r, err := p.store.Get(ctx)
			if err != nil {
				failAll(live, fmt.Errorf("bitmap: read stored snapshot of %s: %w", p.cidr, err))
				return
			}
			if r == rev {
				finishAll(live)
				return
			}
			if err := p.adopt(s, r); err != nil {
				failAll(live, err)
				return
			}
			freshRev = max(freshRev, r)
			continue
		}

		if !p.startWrite(live) {
			continue // a caller gave up after its op was applied: apply the others again
		}
		rs, data := next.Snapshot()
		newRev, err := p.store.Update(ctx, rev, Snapshot{Range: rs, Data: data})
		if err == nil {
			p.publish(next, newRev)
			p.endWrite(live, true, nil)
			return
		}
		attempts++
		if !errors.Is(err, ErrConflict) {
			p.endWrite(live, false, p.fence(ctx, base, rev, err))
			return
		}
		p.endWrite(live, false, nil)
		var ce *ConflictError
		if errors.As(err, &ce) {
			if aerr := p.adopt(ce.Current, ce.Rev); aerr != nil {
				failAll(live, aerr)
				return
			}
			freshRev = max(freshRev, ce.Rev)
		} else {
			p.markStale()
		}
		if attempts >= p.opts.maxAttempts {
			failAll(live, fmt.Errorf("bitmap: %s: gave up after %d attempts: %w", p.cidr, attempts, err))
			return
		}
		p.sleep(ctx, attempts)
	}
}

// startWrite marks ops as being written, unless one of them was abandoned since it was applied:
// then it marks none and reports false.
func (p *Persistent) startWrite(ops []*op) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, o := range ops {
		if o.abandoned {
			return false
		}
	}
	for _, o := range ops {
		o.writing = true
	}
	return true
}

// endWrite marks ops as no longer being written and, if the write was stored or failed with
// failure, finishes them, under the lock so that a caller giving up meanwhile sees its result. If
// the write was stored, it queues a release of the address of every allocation among them whose
// caller gave up while it was in flight: that caller was told the outcome is unknown, so nobody
// holds the address. After a conflict (stored false, failure nil) the ops stay in the batch.
func (p *Persistent) endWrite(ops []*op, stored bool, failure error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, o := range ops {
		o.writing = false
		switch {
		case failure != nil:
			o.finish(netip.Addr{}, failure)
		case stored:
			if o.abandoned && o.tryErr == nil && (o.kind == opAllocate || o.kind == opAllocateNext) {
				ctx, cancel := context.WithTimeout(context.WithoutCancel(o.ctx), undoTimeout)
				p.enqueueLocked(&op{ctx: ctx, cancel: cancel, kind: opRelease, ip: o.tryIP, undo: true, done: make(chan struct{})})
			}
			if o.tryErr != nil {
				o.finish(netip.Addr{}, o.tryErr)
			} else {
				o.finish(o.tryIP, nil)
			}
		}
	}
}

// apply applies every op to a, recording each result in the op, and reports whether a changed.
func apply(a *Allocator, ops []*op) bool {
	changed := false
	for _, o := range ops {
		o.tryIP, o.tryErr = netip.Addr{}, nil
		switch o.kind {
		case opAllocate:
			o.tryErr = a.Allocate(o.ctx, o.ip, allocator.Owner{})
			o.tryIP = o.ip
			changed = changed || o.tryErr == nil
		case opAllocateNext:
			o.tryIP, o.tryErr = a.AllocateNext(o.ctx, allocator.Owner{})
			changed = changed || o.tryErr == nil
		case opRelease:
			if a.Has(o.ip) {
				o.tryErr = a.Release(o.ctx, o.ip)
				changed = true
			}
			o.tryIP = o.ip
		}
	}
	return changed
}

// dropCanceled finishes the ops whose callers have given up and returns the others. It must only
// be called while no Store call that includes them is in flight.
func dropCanceled(ops []*op) []*op {
	live := ops[:0:0]
	for _, o := range ops {
		if err := o.ctx.Err(); err != nil {
			o.finish(netip.Addr{}, err)
			continue
		}
		live = append(live, o)
	}
	return live
}

func finishAll(ops []*op) {
	for _, o := range ops {
		if o.tryErr != nil {
			o.finish(netip.Addr{}, o.tryErr)
			continue
		}
		o.finish(o.tryIP, nil)
	}
}

func failAll(ops []*op, err error) {
	for _, o := range ops {
		o.finish(netip.Addr{}, err)
	}
}

// fence settles the outcome of an Update of base's successor at rev that failed with cause (not a
// conflict): it stores base again at rev. If that succeeds, the failed write can never be applied
// later and the error says the write failed; otherwise its outcome is unknown.
func (p *Persistent) fence(ctx context.Context, base *Allocator, rev int64, cause error) error {
	failed := fmt.Errorf("bitmap: store snapshot of %s: %w", p.cidr, cause)
	if ctx.Err() == nil {
		rs, data := base.Snapshot()
		if newRev, err := p.store.Update(ctx, rev, Snapshot{Range: rs, Data: data}); err == nil {
			p.publish(base, newRev)
			return failed
		}
	}
	p.markStale()
	return fmt.Errorf("%w: %w", ErrOutcomeUnknown, failed)
}

// adopt makes the stored snapshot s at rev the last known state, unless a newer state is already
// known.
func (p *Persistent) adopt(s Snapshot, rev int64) error {
	if rev == 0 {
		p.markStale()
		return fmt.Errorf("%w: no snapshot of %s is stored", allocator.ErrNotReady, p.cidr)
	}
	next := p.current().Clone()
	if err := next.Restore(s.Range, s.Data); err != nil {
		p.markStale()
		return fmt.Errorf("bitmap: stored snapshot at revision %d: %w", rev, err)
	}
	p.publish(next, rev)
	return nil
}

// publish makes a the last known state at rev, unless a newer state is already known.
func (p *Persistent) publish(a *Allocator, rev int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if rev < p.rev && !p.stale {
		return
	}
	p.cur, p.rev, p.stale = a, rev, false
}

func (p *Persistent) markStale() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stale = true
}

// sleep waits before attempt n+1, or until ctx ends. The first retry is immediate: a conflict
// usually brings the current state along, and a loser that waited would lose again to a writer
// that does not. Later ones wait a random time (full jitter) whose bound doubles per attempt up to
// the maximum.
func (p *Persistent) sleep(ctx context.Context, n int) {
	if n < 2 {
		return
	}
	bound := p.opts.backoff
	for i := 2; i < n && bound < p.opts.maxBackoff; i++ {
		bound = min(bound, p.opts.maxBackoff/2) * 2 // never overflows
	}
	bound = min(bound, p.opts.maxBackoff, math.MaxInt64-1) // rand.N needs bound+1 > 0
	t := time.NewTimer(rand.N(bound + 1))
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

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
