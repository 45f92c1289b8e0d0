package bitmap

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"

	"github.com/kube-ipam/clusterip/allocator"
)

// The group-commit engine of Persistent: the queue of operations, the goroutine that commits them
// in batches, and the retries after a revision conflict.

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
	ip   netip.Addr            // the address of Allocate and Release; the result of AllocateNext
	skip func(netip.Addr) bool // AllocateNextSkipping's filter; nil for AllocateNext
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
	p.stats.batches.Add(1)

	live := batch
	var freshRev int64 // the newest revision read from the store during this commit; 0 if none
	attempts := 0
	blind, streak := 0, 0 // conflicts without the current state; those with it
	for {
		live = dropCanceled(live)
		if len(live) == 0 {
			return
		}
		p.mu.Lock()
		base, rev, stale := p.cur, p.rev, p.stale
		p.mu.Unlock()
		if stale {
			r, err := p.refresh(ctx)
			if err != nil {
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
		newRev, err := p.store.Update(ctx, rev, next.Snapshot())
		if err == nil {
			p.stats.writes.Add(1)
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
		p.stats.conflicts.Add(1)
		var ce *ConflictError
		if errors.As(err, &ce) {
			if aerr := p.adopt(ce.Current, ce.Rev); aerr != nil {
				failAll(live, aerr)
				return
			}
			freshRev = max(freshRev, ce.Rev)
			streak++
		} else {
			p.markStale()
			blind++
		}
		if attempts >= p.opts.maxAttempts {
			failAll(live, fmt.Errorf("bitmap: %s: gave up after %d attempts: %w", p.cidr, attempts, err))
			return
		}
		p.stats.retries.Add(1)
		p.sleep(ctx, backoffRound(blind, streak))
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
				ctx, cancel := context.WithTimeout(context.WithoutCancel(o.ctx), allocator.UndoTimeout)
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
			o.tryIP, o.tryErr = a.AllocateNextSkipping(o.ctx, o.skip)
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

// freeRetries is how many conflicts in a row that bring the current state along a batch retries at
// once before it starts to back off.
const freeRetries = 16

// backoffRound returns the round of backoff (see sleep) after blind conflicts that did not bring
// the current state along and informed ones that did. A loser that got the current state re-applies
// its operations on it at once, without a wait or a second read: it is then as fresh as the
// writer that won, and a wait would only hand the next round to a writer that does not wait, so
// that the same process would lose round after round (with a backoff from the second loss, three
// processes on one etcd key saw shares of 28–40% and a p99 of 70–85× the p50). Only a conflict
// that leaves the state to be read again, or a run of more than freeRetries informed losses, backs
// off.
func backoffRound(blind, informed int) int {
	n := blind
	if informed > freeRetries {
		n += informed - freeRetries + 1
	}
	return n
}

// sleep waits before the next attempt, in round n of backoff, or until ctx ends. Rounds 0 and 1
// are immediate; later ones wait a random time (full jitter) whose bound doubles per round, from
// the initial backoff up to the maximum.
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
