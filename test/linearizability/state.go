package linearizability

import (
	"slices"
	"sort"
	"strings"
)

// free is the holder of a free address in a state.
const free = "(free)"

// An address's state, as one caller sees it, is one of: free; held by an owner (its IPAddress
// object, and its bit for an owner that writes the bitmap); or free or held, with a set bit that
// nobody owns. A bit that nobody owns makes the address taken for callers that read the bitmap
// (Op.Bitmap: Legacy, DualWrite and kube-apiserver refuse it, as kube-apiserver v1.33 does) and
// is invisible to IPAddressOnly callers, which may take the address while it is set. It never
// lets anyone take an address that is held.
//
// A holder h carries a mark for the one bit of the address, saying who wrote it. "h" + ownBit:
// the holder's own, written when it took the address (Op.Bitmap) and cleared by its release.
// Bits set for nobody: "h" + leftBit: a bit left behind (Op.LeavesBit, Op.RefusalLeavesBit)
// that a Release from a caller that reads the bitmap clears. "h" + stuckBit: one that no
// Release clears, because kube-apiserver v1.33 set it while a release of the address that had
// already cleared its bit was still deleting the IPAddress object, or its repair loop deleted
// the object of a lost Service create and kept the bit (Op.RepairFrees). "h" + pendingBit: one
// that a caller holds while its operation runs and clears before it returns, in the Undo that
// follows the operation (Op.TransientBit, Op.ClearsBitLast); nothing else clears it, and an
// Undo that finds none does not fit, so the Undo cannot come before the step that set the bit
// and the bit is gone when the operation returns. "h" + takingBit(o): one that the allocation of
// owner o set before creating its IPAddress object (Op.SetsBitFirst), which o's Create turns into
// o's own holding; nothing else clears it. No mark: the bit is clear. A caller that reads
// the bitmap writes a bit only where it finds it clear; where it is set, it is refused without
// writing anything.
//
// A holder may also be marked releasing: its release (Op.ClearsBitFirst) has cleared its bit
// and not yet deleted its IPAddress object, which the Delete that follows does.
//
// An address may also be marked orphaned: an IPAddress object is there that no Service holds.
// kube-apiserver v1.33 deletes a Service and then releases its addresses, the bit first and the
// object second (Op.ClearsBitFirst); cut short in between (killed, or its etcd lost), it leaves
// the object behind for its repair loop, which deletes it once it is older than a minute. A
// Delete whose outcome is unknown may so leave the address free and orphaned. Callers that read
// IPAddress objects (IPAddressOnly, DualWrite, kube-apiserver, reservations) find it held;
// callers that read only the bitmap (Legacy) cannot see it and may take the address, beside the
// object, while its bit is clear: no two Services hold it. The mark stays until the Repair that
// the partition adds for each such Release ([orphanRepairOf]) clears it.
const (
	ownBit     = "+own"
	leftBit    = "+bit"
	stuckBit   = "+stuck"
	pendingBit = "+pending"
	releasing  = "+releasing"
	orphaned   = "+orphan"
)

// takingPrefix starts the mark of a bit set by an allocation for its owner before it creates
// the IPAddress object ([takingBit]).
const takingPrefix = "+taking("

// takingBit is the mark of a bit set for owner by an allocation with Op.SetsBitFirst.
func takingBit(owner string) string { return takingPrefix + owner + ")" }

// holding is one state an address may be in, parsed.
type holding struct {
	holder    string // free, or an owner
	bit       string // who wrote the bit: ownBit, leftBit, stuckBit, pendingBit, a takingBit; "" when it is clear
	releasing bool   // the holder's Op.ClearsBitFirst release is between its two halves
	orphan    bool   // an IPAddress object that no Service holds is there too (see orphaned)
}

func parseHolding(e string) holding {
	var x holding
	e, x.releasing = strings.CutSuffix(e, releasing)
	e, x.orphan = strings.CutSuffix(e, orphaned)
	if i := strings.Index(e, takingPrefix); i >= 0 {
		x.holder, x.bit = e[:i], e[i:]
		return x
	}
	for _, m := range []string{ownBit, stuckBit, leftBit, pendingBit} {
		if rest, ok := strings.CutSuffix(e, m); ok {
			e, x.bit = rest, m
			break
		}
	}
	x.holder = e
	return x
}

func (x holding) String() string {
	s := x.holder + x.bit
	if x.orphan {
		s += orphaned
	}
	if x.releasing {
		s += releasing
	}
	return s
}

// A state of the model is the set of the states one address may be in, given the outcomes that
// are unknown: sorted, distinct, joined by newlines; each is a [holding] as a string. A string,
// so that porcupine compares and hashes states as they are.

func stateOf(holders []string) string {
	sort.Strings(holders)
	return strings.Join(slices.Compact(holders), "\n")
}

// step applies op to every holder the address may have, and returns the holders it may have
// after; ok is false when no holder explains op's outcome.
func step(state string, op Op, allowLeftBits bool) (bool, string) {
	var next []string
	for _, e := range strings.Split(state, "\n") {
		x := parseHolding(e)
		h, mark := x.holder, x.bit
		if op.Kind == Repair && op.Owner == orphanRepairer {
			next = append(next, e) // nothing orphaned yet, or repaired later
			if x.orphan {
				x.orphan = false
				next = append(next, x.String()) // the orphaned object deleted
			}
			continue
		}
		start := len(next) // the holdings after op that follow from e; an orphaned object stays in each
		// seen is whether op's caller sees a bit; kept, the mark after op, when op does not
		// set the bit itself.
		seen := mark != "" && op.Bitmap
		kept := mark
		switch {
		case op.Bitmap && (mark == leftBit || mark == ownBit):
			kept = "" // a release from a caller that reads the bitmap clears it
		case mark == ownBit:
			kept = leftBit // a release that does not write the bitmap leaves the holder's bit
		}
		held := h != free || seen || x.orphan && seesObjects(op)
		objectThere := h != free || x.orphan // an IPAddress object is there, a Service's or orphaned
		released := free + kept
		taken := op.Owner + kept
		if op.Bitmap {
			taken = op.Owner + ownBit
		}
		// with returns the holding with the bit written by another than the holder.
		with := func(bit string) string { return holding{h, bit, x.releasing, false}.String() }
		// fallback is op's holding when it takes the address by its IPAddress object alone
		// (Op.FallsBackToObjects), which it can only do where nobody holds it: the bit stays
		// as it was, and one that no other Release would clear is cleared by the holder's,
		// since kube-apiserver's clears the bit whoever set it.
		fallback := ""
		if op.FallsBackToObjects && op.Kind == AllocateNext && h == free && !x.releasing && !x.orphan {
			fb := mark
			if fb == stuckBit {
				fb = leftBit
			}
			fallback = holding{op.Owner, fb, false, false}.String()
		}
		// writes is whether op's caller, which reads the bitmap, finds the bit clear and sets
		// it while the IPAddress object is there or not.
		writes := op.Bitmap && mark == ""
		leaves := op.LeavesBit && op.Bitmap
		refusalLeaves := allowLeftBits && op.RefusalLeavesBit && op.Bitmap
		switch {
		case op.Kind == GiveBack:
			if writes {
				next = append(next, with(pendingBit)) // the Undo clears it
			}
		case op.Kind == KeepBit:
			if writes {
				next = append(next, with(leftBit)) // a Release that reads the bitmap clears it
			}
		case op.Kind == Unreserve:
			switch {
			case isReservation(h):
				if op.Outcome != Refused {
					next = append(next, free+mark) // the object deleted, no bit touched
				}
				if op.Outcome == Unknown {
					next = append(next, e)
				}
			case h == free:
				if op.Outcome != Refused {
					next = append(next, e) // nothing to delete
				}
			default: // a Service's allocation, which it never deletes
				if op.Outcome != OK {
					next = append(next, e)
				}
			}
		case op.Kind == Claim:
			mine := h == ReservedFor(op.Owner)
			claimed := holding{op.Owner, mark, false, false}.String() // the object updated, the bit as it was
			switch {
			case op.Elsewhere: // it got another address, so its reservation was not here
				if !mine {
					next = append(next, e)
				}
			case op.Outcome == OK: // its reservation, or an address nobody holds
				if mine || h == free && !x.orphan {
					next = append(next, claimed)
				}
			default:
				next = append(next, e)
				if mine {
					next = append(next, claimed)
				}
			}
		case op.Kind == Release && op.Retains:
			retained := holding{ReservedFor(h), mark, false, false}.String()
			switch {
			case h == op.Owner && op.Outcome == OK:
				next = append(next, retained)
			case h == op.Owner:
				next = append(next, e, retained)
			case op.Outcome == OK: // not the Service's allocation: released as by any Release
				next = append(next, released)
			default:
				next = append(next, e, released)
			}
		case op.Kind == Undo:
			if mark == pendingBit {
				next = append(next, with(""))
			}
		case op.Kind == Create:
			switch {
			case mark == takingBit(op.Owner):
				if h == free && !x.releasing && !x.orphan {
					next = append(next, op.Owner+ownBit) // the object created where nobody holds one
				}
				if op.Outcome != OK {
					// the create refused, and the bit cleared again (Op.TransientBit), or lost
					// and the bit kept (Op.LeavesBit)
					next = append(next, with(""), with(leftBit))
				}
			case op.Outcome != OK || h == op.Owner:
				next = append(next, e) // its first half set no bit, or took the address whole
			}
		case op.Kind == Delete:
			switch {
			case x.releasing:
				next = append(next, free+mark) // a bit written meanwhile stays
			case h == free:
				next = append(next, e) // nothing to delete
			}
			if op.Outcome != OK {
				next = append(next, e)
				if x.releasing { // the Service deleted, its object left behind
					next = append(next, holding{free, mark, false, true}.String())
				}
			}
		case op.Kind == Repair:
			next = append(next, e)
			switch {
			case h != op.Owner:
			case mark == ownBit:
				next = append(next, free+stuckBit) // the object deleted, the owner's bit kept
			default:
				next = append(next, free+mark) // taken by its object alone: the bit as it was
			}
		case op.Kind == Release && op.Outcome == OK && op.ClearsBitLast && op.Bitmap:
			next = append(next, free+pendingBit) // the object deleted; the Undo clears the bit
		case op.Kind == Release && op.Outcome == OK && op.ClearsBitFirst && op.Bitmap && h != free:
			next = append(next, holding{h, kept, true, false}.String()) // the bit cleared; the Delete frees
		case op.Kind == Release && op.Outcome == OK:
			next = append(next, released)
		case op.Kind == Release:
			next = append(next, e, released)
			if op.ClearsBitFirst && op.Bitmap && h != free {
				next = append(next, holding{h, kept, true, false}.String())
			}
			if leaves && mark != stuckBit { // the IPAddress object deleted, the bit not cleared
				next = append(next, free+leftBit)
			}
		case op.Outcome == OK && setsBitFirst(op): // the bit now, the object in the Create
			if writes {
				next = append(next, with(takingBit(op.Owner)))
			}
			if fallback != "" {
				next = append(next, fallback)
			}
		case op.Outcome == OK: // Allocate, AllocateNext, Reserve
			if !held {
				next = append(next, taken)
			}
			if fallback != "" {
				next = append(next, fallback)
			}
		case op.Outcome == Refused && op.Kind == AllocateNext: // a full range, this address in it
			if held {
				next = append(next, e) // it reserved nothing
			}
		case op.Outcome == Refused: // Allocate or Reserve of a held address
			if held {
				next = append(next, e)
				if refusalLeaves && writes && objectThere {
					next = append(next, with(stuckBit))
				}
				if op.TransientBit && writes && objectThere {
					next = append(next, with(pendingBit))
				}
			}
		default: // an allocation that may have happened
			next = append(next, e)
			if !held {
				next = append(next, taken)
			}
			if fallback != "" {
				next = append(next, fallback)
			}
			if writes && setsBitFirst(op) {
				next = append(next, with(takingBit(op.Owner))) // the object, if ever, in the Create
			}
			switch {
			case !writes:
			case refusalLeaves:
				next = append(next, with(stuckBit))
			case leaves:
				next = append(next, with(leftBit))
			}
		}
		if x.orphan {
			for i := start; i < len(next); i++ {
				y := parseHolding(next[i])
				y.orphan = true
				next[i] = y.String()
			}
		}
	}
	if len(next) == 0 {
		return false, state
	}
	return true, stateOf(next)
}

// seesObjects reports whether op's caller reads IPAddress objects, so that an orphaned one
// ([holding]) makes the address held for it: every caller but a Legacy one, which reads the
// bitmap alone.
func seesObjects(op Op) bool { return !op.Bitmap || op.SetsBitFirst || op.FallsBackToObjects }
