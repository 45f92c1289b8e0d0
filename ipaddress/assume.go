package ipaddress

import (
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-ipam/clusterip/internal/informerutil"
	"github.com/kube-ipam/clusterip/internal/ipmath"
)

// The index is the informer's view of the range overlaid with the Allocator's own writes:
//
//   - While a write on an address is in flight the address is pending and busy: a create has
//     already marked it allocated (so no other local caller picks it), a delete leaves it as it was,
//     and informer events for it are recorded but not applied.
//   - When the write succeeds, its outcome is assumed: an address we created counts as allocated,
//     one we deleted as free, until an informer event shows the write or something newer. Events
//     that are older (an informer running behind; say the Delete of the object we released, arriving
//     after we created the address again) are ignored. The object's UID tells ours from another, and
//     resource versions, compared as numbers, tell newer from older.
//   - Where the objects have neither (client-go's fake clientset gives none; nor does an
//     AlreadyExists, or a Delete of an object the informer had not shown), the index counts: each
//     write of ours that changed the address owes one transition (an Add or a Delete; an Update
//     is none), one more where the server must have changed in between (a Create or a NotFound
//     where we knew of an object, a Delete or an AlreadyExists where we knew of none), and the
//     assumption holds until the handler has taken every transition owed. The handler takes an
//     address's events in the server's order, so the last one owed is our write's; any earlier
//     one, the stale Add or Delete of an earlier round of ours, is ignored.
//   - A Delete that gets NotFound for an address of which neither the informer nor an earlier write
//     showed an object changed nothing, and is assumed nothing: the index takes the informer's state.
//     After an earlier write of ours that is still assumed (a second Release, faster than the
//     informer), the NotFound confirms it and the assumption stays, still ignoring the events of
//     the object we deleted; likewise an AlreadyExists for an address we created keeps our create.
//   - An assumed delete that an informer event contradicts, when the event cannot be told stale (an
//     object other than the one we deleted, with no resource version to order it by, or the object
//     we deleted was unknown), is held only for recheckDelay: then the index takes the informer
//     cache's state, so an object the informer holds shows within a second.
//   - An assumption the informer has not caught up with after the assume timeout is dropped, and
//     the index takes the informer cache's state for the address.
//   - When the write fails, the address takes the last state the informer reported for it.
//   - "The informer's state" is always its cache's, never the event at hand: a shared informer
//     updates its cache before it hands an event to the handler, so the cache is never behind the
//     events taken and may be ahead of them. An event that arrives when nothing is assumed, or
//     that settles an assumption, sets the address from the cache, so a stale event still on its
//     way cannot make an address we freed look allocated.
//
// Every step costs O(1) map operations: nothing scans the index.

// pending is the state of one address with a write in flight or assumed.
type pending struct {
	busy bool          // a write is in flight
	done chan struct{} // closed when the write in flight settles

	// The assumption, when not busy.
	present bool      // created (true) or deleted (false)
	uid     types.UID // created: our object; deleted: the object we deleted, if known
	rv      uint64    // resourceVersion of that object, if known
	gen     uint64    // identifies the assumption in the expiry queue

	// prior reports whether an assumption was held when the write in flight began; present, uid
	// and rv still describe it until the write settles.
	prior bool

	// Deleted object, recorded when a delete begins.
	delUID types.UID
	delRV  uint64

	// The last informer event for the address since the write began.
	seen bool
	last event

	// recheck reports whether the assumption is queued for a recheck after recheckDelay.
	recheck bool

	// Counting, for assumptions without a UID or resource version to tell events apart by (see
	// anonymous): srv is the state of the address on the server after our last write, as far as
	// we know; owed is the number of transitions (adds and deletes) the handler has still to
	// take before it shows that state; early counts those it took while a write was in flight
	// and nothing was owed, which the write's own transition may account for when it settles.
	srv   bool
	owed  uint32
	early uint32
}

// recheckDelay bounds how long an assumed delete hides an object that an informer event shows and
// that cannot be told from a stale one (see unordered).
const recheckDelay = time.Second

// event is what an informer event says about one address.
type event struct {
	present bool
	uid     types.UID
	rv      uint64
	// update reports whether the event is an Update, which changes an object the informer holds
	// and not whether it holds one; replaced, whether that Update's object has another UID than
	// the one it replaces (an informer that lists again folds a delete and an add into one Update).
	update, replaced bool
}

// flips returns the number of transitions between absent and present that e stands for.
func (e event) flips() uint32 {
	switch {
	case !e.update:
		return 1
	case e.replaced:
		return 2
	}
	return 0
}

// anonymous reports whether the assumption has neither a UID nor a resource version to tell its
// object's events from those of other objects at the same address: client-go's fake clientset
// gives objects neither, and an AlreadyExists or a Delete of an object the informer had not shown
// tells us neither. Such an assumption is settled by counting (see pending.owed): the handler
// takes the events of an address in the order the server wrote them, so it has shown our last
// write once it has taken as many transitions as we know the server made.
func (p *pending) anonymous() bool { return p.uid == "" && p.rv == 0 }

// caughtUp reports whether e, the last event the handler took, shows the assumed write or
// something newer.
func (p *pending) caughtUp(e event) bool {
	if p.anonymous() {
		// Any event of the address looks alike, the stale ones of an earlier round of ours
		// included, so only the count tells.
		return p.owed == 0
	}
	newer := p.rv != 0 && e.rv > p.rv && e.uid != p.uid
	if p.present {
		// Our object (added, updated or deleted since), or a newer one.
		return (p.uid != "" && e.uid == p.uid) || newer
	}
	// The deletion of the object we deleted, or a newer object. An add or update of the object we
	// deleted is stale.
	return (!e.present && (p.uid == "" || e.uid == p.uid)) || newer
}

// wrote counts the transitions of a write that left the address present (or not) on the server:
// one for a write that changed it, none for one that found it so already, and one more wherever
// the server must have changed it in between without our knowing (an AlreadyExists or a Delete
// where we knew of no object, a NotFound or a Create where we knew of one).
func (p *pending) wrote(present, changed bool) {
	var n uint32
	if changed {
		n++
	}
	if changed && p.srv == present || !changed && p.srv != present {
		n++ // someone else changed it first
	}
	p.srv = present
	p.owed += n
	taken := min(p.early, p.owed)
	p.owed -= taken
	p.early = 0
}

// took counts the transitions of an event the handler took.
func (p *pending) took(e event) {
	n := e.flips()
	taken := min(n, p.owed)
	p.owed -= taken
	if p.busy {
		p.early += n - taken
	}
}

// unordered reports whether e contradicts the assumed delete p without being provably stale: it
// shows an object present that is not the one we deleted (or we did not know which that was) and
// that resource versions cannot order against it. Resource versions are compared only when both
// are decimal numbers, as kube-apiserver's etcd revisions are.
func (p *pending) unordered(e event) bool {
	if p.present || !e.present {
		return false
	}
	if p.uid != "" && e.uid == p.uid {
		return false // the object we deleted: stale
	}
	if p.anonymous() && e.uid == "" && e.rv == 0 {
		// Nothing tells objects apart (client-go's fake clientset): the count settles the
		// assumption (see caughtUp), and an object created after our delete comes after the
		// transitions we count.
		return false
	}
	return p.rv == 0 || e.rv == 0
}

// writeKind is the outcome of a write.
type writeKind int

const (
	writeFailed   writeKind = iota // unknown outcome
	writeCreated                   // Create succeeded
	writeExists                    // Create: AlreadyExists
	writeDeleted                   // Delete succeeded
	writeNotFound                  // Delete: NotFound
)

type writeResult struct {
	kind writeKind
	uid  types.UID
	rv   uint64
}

type expiryEntry struct {
	off      uint64
	gen      uint64
	deadline time.Time
}

// beginLocked starts a write on off and returns nil, or returns the channel that closes when the
// write already in flight on off settles. A create marks off allocated at once.
func (a *Allocator) beginLocked(off uint64, create bool) <-chan struct{} {
	p := a.pending[off]
	if p != nil && p.busy {
		return p.done
	}
	if p == nil {
		// Counting starts from the index: with nothing pending it is the informer's state.
		p = &pending{srv: a.index.Has(off)}
		a.pending[off] = p
	}
	if !create {
		p.delUID, p.delRV = a.deletingLocked(off, p)
	}
	p.prior = p.gen != 0
	p.busy, p.done, p.seen, p.gen, p.recheck, p.early = true, make(chan struct{}), false, 0, false, 0
	if create {
		a.index.Add(off)
	}
	return nil
}

// deletingLocked returns the object a delete beginning on off removes, as far as the Allocator
// knows, to tell its stale events from newer ones: our own object if we created it and the
// informer has not shown it; the object an earlier delete of ours removed, if that is assumed and
// the informer cache shows nothing newer (a second Release, faster than the informer: the
// informer's events of that object are still to come, and stale); else the informer cache's.
func (a *Allocator) deletingLocked(off uint64, p *pending) (types.UID, uint64) {
	if p.gen != 0 && p.present {
		return p.uid, p.rv
	}
	obj, ok := a.cached(off)
	var c event
	if ok {
		c = event{present: true, uid: obj.UID, rv: parseRV(obj.ResourceVersion)}
	}
	if p.gen != 0 && (!ok || !p.caughtUp(c)) {
		return p.uid, p.rv
	}
	return c.uid, c.rv
}

// settleLocked ends the write in flight on off with its outcome.
func (a *Allocator) settleLocked(off uint64, r writeResult) {
	p := a.pending[off]
	if p == nil || !p.busy {
		return
	}
	p.busy = false
	close(p.done)
	p.done = nil
	if r.kind == writeNotFound && !p.prior && p.delUID == "" && p.delRV == 0 {
		// Nobody knew of an object for the address, and the server holds none: the Delete changed
		// nothing, so assume nothing. An object added since is newer and counts at once. With an
		// assumption held (say our earlier Release, which the informer has not shown), the
		// NotFound confirms it, and it goes on ignoring the stale events still to come.
		delete(a.pending, off)
		a.setInformerLocked(off)
		return
	}
	switch r.kind {
	case writeCreated, writeExists:
		p.wrote(true, r.kind == writeCreated)
	case writeDeleted, writeNotFound:
		p.wrote(false, r.kind == writeDeleted)
	}
	switch r.kind {
	case writeCreated:
		p.present, p.uid, p.rv = true, r.uid, r.rv
	case writeExists:
		if !(p.prior && p.present) {
			// Someone's object: we cannot tell its events from older ones.
			p.present, p.uid, p.rv = true, "", 0
		}
		// Else the object we created, which the informer has not shown: keep telling its events.
	case writeDeleted, writeNotFound:
		// NotFound: the object the informer showed is gone all the same, and its stale events
		// are told from a newer object's as after our own delete.
		p.present, p.uid, p.rv = false, p.delUID, p.delRV
	default:
		// Unknown outcome: keep what was assumed before, unless the informer has caught up with it;
		// else believe the informer.
		if p.prior && !(p.seen && p.caughtUp(p.last)) {
			a.assumeLocked(off, p)
			return
		}
		delete(a.pending, off)
		a.setInformerLocked(off)
		return
	}
	if p.anonymous() && p.owed == 0 {
		// The handler has taken every transition we know of: the informer shows our write.
		delete(a.pending, off)
		a.setInformerLocked(off)
		return
	}
	if p.seen {
		if p.caughtUp(p.last) {
			delete(a.pending, off)
			a.setInformerLocked(off)
			return
		}
		a.staleEvents++ // the informer's last word on off predates our write
	}
	a.assumeLocked(off, p)
	if p.seen && p.unordered(p.last) {
		a.recheckLocked(off, p)
	}
}

// setInformerLocked gives off the informer's state: its cache's, which is never behind the events
// the handler has taken (a shared informer updates its cache before it hands an event on) and
// may be ahead of them, when a stale event is still on its way to the handler.
func (a *Allocator) setInformerLocked(off uint64) {
	_, ok := a.cached(off)
	a.setLocked(off, ok)
}

// recheckLocked queues p's assumption to be dropped after recheckDelay (or the assume timeout, if
// shorter), unless the informer settles it first.
func (a *Allocator) recheckLocked(off uint64, p *pending) {
	if p.recheck {
		return
	}
	p.recheck = true
	a.rechecks = append(a.rechecks, expiryEntry{off: off, gen: p.gen, deadline: a.now().Add(min(recheckDelay, a.assumeTimeout))})
}

// assumeLocked holds p's outcome for off until the informer shows it or the assume timeout passes.
func (a *Allocator) assumeLocked(off uint64, p *pending) {
	a.gen++
	p.gen = a.gen
	a.setLocked(off, p.present)
	a.expiry = append(a.expiry, expiryEntry{off: off, gen: p.gen, deadline: a.now().Add(a.assumeTimeout)})
}

// expireLocked drops the assumptions older than the assume timeout, and those due for a recheck,
// giving their addresses the informer cache's state. It pops the expired heads of the two queues
// (each is in deadline order, as its delay is constant): O(1) amortized.
func (a *Allocator) expireLocked() {
	if len(a.expiry) == 0 && len(a.rechecks) == 0 {
		return
	}
	now := a.now()
	a.expiry = a.expireQueueLocked(a.expiry, now, "Informer did not show a write in time, using its cache")
	a.rechecks = a.expireQueueLocked(a.rechecks, now, "Informer shows an object newer than our delete may be, using its cache")
}

// expireQueueLocked drops the assumptions of q due by now and returns what is left of q.
func (a *Allocator) expireQueueLocked(q []expiryEntry, now time.Time, msg string) []expiryEntry {
	n := 0
	for _, e := range q {
		if e.deadline.After(now) {
			break
		}
		n++
		p := a.pending[e.off]
		if p == nil || p.busy || p.gen != e.gen {
			continue // settled by the informer, or superseded by a newer write
		}
		delete(a.pending, e.off)
		a.setInformerLocked(e.off)
		a.logger.V(4).Info(msg, "ip", a.addrAt(e.off), "allocated", a.index.Has(e.off))
	}
	if n == 0 {
		return q
	}
	clear(q[:n])
	q = q[n:]
	if len(q) == 0 {
		return nil // let the backing array go
	}
	return q
}

// setLocked marks off allocated or free.
func (a *Allocator) setLocked(off uint64, present bool) {
	if present {
		a.index.Add(off)
	} else {
		a.index.Remove(off)
	}
}

// cached returns the informer cache's IPAddress for off.
func (a *Allocator) cached(off uint64) (*networkingv1.IPAddress, bool) {
	obj, ok, err := a.informer.GetIndexer().GetByKey(a.addrAt(off).String())
	if err != nil || !ok {
		return nil, false
	}
	ip, ok := obj.(*networkingv1.IPAddress)
	return ip, ok
}

// onEvent applies an informer event: an IPAddress added or updated (present) or deleted. For an
// update, old is the object it replaces; else nil.
func (a *Allocator) onEvent(old, obj any, present bool) {
	ipa, ok := informerutil.ObjectFrom[*networkingv1.IPAddress](obj)
	if !ok || ipa == nil {
		return
	}
	off, ok := a.offsetOfName(ipa.Name)
	if !ok {
		return
	}
	e := event{present: present, uid: ipa.UID, rv: parseRV(ipa.ResourceVersion), update: old != nil}
	if prev, ok := old.(*networkingv1.IPAddress); ok && prev != nil && prev.UID != ipa.UID {
		e.replaced = true
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.events++
	a.expireLocked()
	a.applyLocked(off, e)
}

// applyLocked applies the informer event e for off.
func (a *Allocator) applyLocked(off uint64, e event) {
	p := a.pending[off]
	if p == nil {
		// The cache, not e: e may be stale, with the cache already past it.
		a.setInformerLocked(off)
		return
	}
	p.took(e)
	p.seen, p.last = true, e
	if p.busy {
		return
	}
	if !p.caughtUp(e) {
		a.staleEvents++
		if p.unordered(e) {
			a.recheckLocked(off, p)
		}
		return
	}
	delete(a.pending, off)
	a.setInformerLocked(off)
}

// offsetOfName returns the offset of the address an IPAddress is named after, if it is a usable
// address of the range written canonically (as the API server requires).
func (a *Allocator) offsetOfName(name string) (uint64, bool) {
	ip, err := parseCanonical(name)
	if err != nil {
		return 0, false
	}
	return ipmath.Offset(a.cidr, ip)
}
