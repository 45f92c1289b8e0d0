package linearizability

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// Kind is what an operation asks for.
type Kind uint8

// The kinds of operation. A Service create through kube-apiserver is an Allocate when it names
// its ClusterIP and an AllocateNext when it does not; a Service delete is a Release.
const (
	Allocate Kind = iota
	AllocateNext
	Release
	// Undo is the second half of a refusal with Op.TransientBit, of a GiveBack or of a Release
	// with Op.ClearsBitLast that is OK: the caller clearing the bit it left set. The history gets one
	// for each such operation, over the same interval ([WithUndos]); nobody calls it.
	Undo
	// Repair is kube-apiserver's repair loop deleting the IPAddress object of an allocation
	// with Op.RepairFrees whose outcome is unknown, if that allocation took effect without its
	// Service: the partition adds one for each such allocation ([Model]); nobody calls it.
	Repair
	// Delete is the second half of a Release with Op.ClearsBitFirst that is OK or unknown: the
	// caller deleting the IPAddress object after it cleared the bit. The history gets one for
	// each such Release, over the same interval and with the same outcome ([WithUndos]); nobody
	// calls it.
	Delete
	// Reserve is reservation.Client.Reserve: it creates a reservation's IPAddress object, the
	// holder Op.Owner ([ReservedFor] a Service, or [ReservedAnonymously]), where nobody holds the
	// address (it reads IPAddress objects and Services, never the bitmap), as an Allocate of a
	// caller that does not read the bitmap does. Refused: the address is held (HeldError).
	Reserve
	// Unreserve is reservation.Client.Release: it deletes the reservation that holds Op.Addr,
	// whoever it is kept for, and is OK too where nothing holds the address; it never frees an
	// address a Service holds, which it refuses (HeldError).
	Unreserve
	// Claim is the create of Service Op.Owner without a ClusterIP through Services().Allocate
	// of allocators with Config.Reservations (IPAddressOnly): where a reservation kept for
	// Op.Owner holds an address, the Service gets that address, the reservation's object turned
	// into the Service's allocation in one update; elsewhere it allocates an address nobody
	// holds, as an IPAddressOnly AllocateNext does. Op.Addr is the address it got. A Claim that
	// is not OK counts as unknown: it may have claimed its reservation, or taken any free
	// address ([Model]'s partition).
	Claim
	// Create is the second half of an allocation with Op.SetsBitFirst that is OK, or an
	// Allocate with it whose outcome is unknown: the caller creating the IPAddress object of
	// Op.Owner after it set the address's bit. The history gets one for each such allocation,
	// over the same interval and with the same outcome ([WithUndos]); nobody calls it.
	Create
	// GiveBack is a bit our DualWrite allocator set and cleared again during one of its calls
	// (clusterip.DualWriteTrace's BitGivenBack), over the interval of that call: it found the
	// bit of Op.Addr clear and set it, so callers that read the bitmap were refused the address
	// meanwhile, and the Undo that follows it ([WithUndos]) clears it. It says nothing of who
	// holds the address: an AllocateNext gives back the bit of an address whose object it finds
	// there, or that the primary's informer shows held. Recorded, not called.
	GiveBack
)

func (k Kind) String() string {
	switch k {
	case Allocate:
		return "Allocate"
	case AllocateNext:
		return "AllocateNext"
	case Release:
		return "Release"
	case Undo:
		return "Undo"
	case Repair:
		return "Repair"
	case Delete:
		return "Delete"
	case Reserve:
		return "Reserve"
	case Unreserve:
		return "Unreserve"
	case Claim:
		return "Claim"
	case Create:
		return "Create"
	case GiveBack:
		return "GiveBack"
	}
	return fmt.Sprintf("Kind(%d)", k)
}

// Outcome is what the caller learnt of an operation.
type Outcome uint8

// The outcomes of an operation.
const (
	// OK: the operation took effect.
	OK Outcome = iota
	// Refused: the operation did not take effect, for a reason the model checks: Allocate of a
	// held address (ErrAllocated, or kube-apiserver's 422 "already allocated"), or AllocateNext
	// of a full range (ErrFull, or kube-apiserver's "range is full"; see Op.Range).
	Refused
	// Unknown: the operation may or may not have taken effect (a timeout, a lost answer, any
	// other error, or no answer at all).
	Unknown
)

func (o Outcome) String() string {
	switch o {
	case OK:
		return "ok"
	case Refused:
		return "refused"
	case Unknown:
		return "unknown"
	}
	return fmt.Sprintf("Outcome(%d)", o)
}

// Op is one recorded operation. The zero Op is an Allocate of the zero address.
type Op struct {
	// Client numbers the caller, a sequential thread of operations; porcupine's timeline has one
	// row per client.
	Client int `json:"client"`
	// Process names who ran it, such as "legacy-0#1" (incarnation 1 of an allocator process) or
	// "kube-apiserver".
	Process string     `json:"process"`
	Kind    Kind       `json:"kind"`
	Addr    netip.Addr `json:"addr"` // the address asked for, released, or returned by an AllocateNext or a Claim that is OK
	// Owner is who the address is allocated for: for a Reserve the reservation's holder
	// ([ReservedFor], [ReservedAnonymously]), for a Claim the Service; empty for a Release, but
	// for one that Retains, which names the Service.
	Owner string `json:"owner"`
	// Range is the range an AllocateNext allocates from: a refusal as full says that every
	// usable address of it (all but the network address and, for IPv4, the broadcast address)
	// was held at some instant of the call. Without it, only the addresses the history names
	// are checked.
	Range netip.Prefix `json:"range,omitzero"`
	// Call and Return are when the operation was called and when its answer came back, in
	// nanoseconds since the Unix epoch. An operation whose outcome is unknown, answered or not,
	// returns at the end of the history: a request held back by a partition may still take
	// effect after its caller gave up.
	Call    int64   `json:"call"`
	Return  int64   `json:"return"`
	Outcome Outcome `json:"outcome"`
	Err     string  `json:"err,omitempty"` // the error, for a person reading a failure
	// Bitmap says whether the caller's allocator reads and writes the bitmap (Legacy,
	// DualWrite, and kube-apiserver in dual write), so that a bit set with no IPAddress object
	// makes the address taken for it; an IPAddressOnly allocator sees only IPAddress objects.
	Bitmap bool `json:"bitmap,omitempty"`
	// LeavesBit says that an unknown outcome may have left the address's bit set for nobody,
	// without its IPAddress object: a dual write that sets the bit and then does not know
	// whether its IPAddress create happened keeps the bit, and a dual-write release that deleted
	// the IPAddress object and then failed to clear the bit leaves it, for repair to free (a
	// leak, never a duplicate). True for DualWrite callers, ours and kube-apiserver.
	LeavesBit bool `json:"leavesBit,omitempty"`
	// RefusalLeavesBit says that a refusal too may have left the address's bit set for nobody,
	// where no later Release clears it: kube-apiserver v1.33 in dual write sets the bit of an
	// address and then creates its IPAddress object, and when that create fails because the
	// object exists it returns the error without clearing the bit (MetaAllocator's
	// AllocateService and AllocateNextService in pkg/registry/core/service/ipallocator/
	// cidrallocator.go). It can only do so where it finds the bit clear and the object there:
	// when an IPAddressOnly peer holds the address, or when a kube-apiserver release of it has
	// cleared the bit and not yet deleted the object (Op.ClearsBitFirst). A holder that wrote
	// the bit keeps it until its release clears it, and a refusal meanwhile writes nothing.
	// Our DualWrite allocator clears the bit it set when the
	// create is refused (Op.TransientBit), and releases in the other order; but when the create
	// loses its answer and a read then finds the object held for another owner, it answers
	// ErrAllocated and keeps the bit, since the create may still land (dualwrite.go settle),
	// which is this case too.
	RefusalLeavesBit bool `json:"refusalLeavesBit,omitempty"`
	// SetsBitFirst says that the caller's allocation sets the address's bit and then creates its
	// IPAddress object, as our DualWrite allocator and kube-apiserver v1.33 in dual write do:
	// in between, callers that read the bitmap are refused the address, while an IPAddressOnly
	// caller may take it and release it again, since its object does not exist yet. The model
	// sees an allocation that is OK, and an Allocate whose outcome is unknown, set a bit kept for
	// its owner, and a Create of the same interval turn that bit into the owner's holding where
	// nobody holds the object: so the address is the owner's by the time the allocation returns,
	// and a holder that kept the object throughout its interval still makes it illegal.
	// AllocateNexts whose answers were lost are merged ([Model]'s partition) and checked in one
	// step, as are allocations without it.
	SetsBitFirst bool `json:"setsBitFirst,omitempty"`
	// TransientBit says that a refused Allocate set the address's bit and cleared it again before it
	// returned: our DualWrite allocator reserves the bit, then finds the IPAddress object taken
	// (an IPAddressOnly peer holds the address) and undoes the reservation. A caller that reads
	// the bitmap meanwhile is refused the address. The model sees the refusal set the bit and an
	// Undo of the same interval clear it.
	TransientBit bool `json:"transientBit,omitempty"`
	// ClearsBitLast says that the caller's Release deletes the address's IPAddress object and
	// then clears its bit, as our DualWrite allocator does (§6 of the design: "Release:
	// IPAddress first, then the bitmap"): in between, an IPAddressOnly caller may take the
	// address, while callers that read the bitmap are refused it. The model sees an OK Release
	// free the address and leave the bit set, and an Undo of the same interval clear it, so the
	// bit is gone by the time the Release returns. kube-apiserver v1.33 releases in the other
	// order: see ClearsBitFirst.
	ClearsBitLast bool `json:"clearsBitLast,omitempty"`
	// ClearsBitFirst says that the caller's Release clears the address's bit and then deletes
	// its IPAddress object, as kube-apiserver v1.33 does (MetaAllocator.Release): in between,
	// the address is held with its bit clear, so a create that reads the bitmap sets the bit and
	// is refused by the object, and kube-apiserver's leaves that bit for good (RefusalLeavesBit).
	// The model sees a Release that is OK or unknown clear the holder's bit, and a Delete of the
	// same interval free the address, so the address is free by the time the Release returns.
	// True for kube-apiserver's Service deletes.
	ClearsBitFirst bool `json:"clearsBitFirst,omitempty"`
	// RepairFrees says that an allocation whose outcome is unknown may have taken effect
	// without its owner: kube-apiserver v1.33 sets the bit and creates the IPAddress object
	// before it stores the Service, so a Service create cut short (kube-apiserver killed, its
	// storage failing) can leave both with no Service. Its repair loop (RepairIPAddress, the only
	// one it runs with MultiCIDRServiceAllocator on) deletes such an object once it is older than
	// 60 s (repairip.go syncIPAddress) and never clears a bit, so from then on IPAddressOnly
	// callers may take the address and callers that read the bitmap are refused it. The model
	// sees a Repair from [RepairGrace] after the call to the end of the history that may turn
	// such an owner into a bit that nobody holds. An acknowledged allocation is never repaired,
	// and neither is one whose Service exists after the history: the harness records such a
	// create as OK, since only its answer was lost.
	// True for kube-apiserver's Service creates; our allocators' objects carry another
	// managed-by label, which kube-apiserver's repair leaves alone.
	RepairFrees bool `json:"repairFrees,omitempty"`
	// FallsBackToObjects says that an AllocateNext whose bitmap allocation fails may take an
	// address by its IPAddress object alone, whatever its bit, and write no bit: kube-apiserver
	// v1.33 in dual write asks the bitmap first and, on any error from it (the bitmap full, its
	// storage failing), logs "no IP address available on the old ClusterIP allocator" and takes
	// an address that has no IPAddress object (MetaAllocator.AllocateNextService in
	// pkg/registry/core/service/ipallocator/cidrallocator.go). Its Service delete clears the
	// bit whoever set it (MetaAllocator.Release). The model lets such an AllocateNext take an
	// address that nobody holds, with the bit it finds, set for nobody or clear, left as it is;
	// an address somebody holds it never takes, though kube-apiserver does take one that a
	// Legacy caller holds, since that holder has no IPAddress object: two owners, which a
	// history must not show. True for kube-apiserver's Service creates.
	FallsBackToObjects bool `json:"fallsBackToObjects,omitempty"`
	// Retains says that a Release is Services().Release of Service Op.Owner whose release policy
	// is Retain (reservation.AnnotationReleasePolicy): where the Service holds the address, its
	// allocation becomes a reservation kept for it ([ReservedFor] Op.Owner) in one update of the
	// IPAddress object, so nobody can take the address at any instant; where it does not, the
	// address is released as by any Release.
	Retains bool `json:"retains,omitempty"`
	// Elsewhere marks the copy of an OK Claim that the partition puts in the part of an address
	// other than the one the Claim got, where a reservation kept for its Service may be: the
	// Claim must not find that reservation there, or it would have got that address. Op.Addr is
	// the part's address; the address the Claim got is in Op.Err. Nobody records it.
	Elsewhere bool `json:"elsewhere,omitempty"`
}

// ReservedFor returns the holder, in the model, of an address reserved for service (an
// Op.Owner): only a Claim of service takes the address from it.
func ReservedFor(service string) string { return reservedPrefix + "for " + service + ")" }

// ReservedAnonymously returns the holder, in the model, of an address reserved under name and
// kept for no Service: nobody takes the address from it.
func ReservedAnonymously(name string) string { return reservedPrefix + name + ")" }

const reservedPrefix = "(reserved "

// isReservation reports whether holder is a reservation ([ReservedFor], [ReservedAnonymously]).
func isReservation(holder string) bool { return strings.HasPrefix(holder, reservedPrefix) }

// RepairGrace is the earliest, after an allocation's call, that kube-apiserver's repair loop can
// delete the IPAddress object it may have left: 60 s after the object's CreationTimestamp, which
// has a resolution of one second, so 59 s after any instant before the object was created.
const RepairGrace = 59 * time.Second

// WithUndos returns history with the second halves of operations that take two steps, each
// over the same interval as its first: an Undo after each refused Allocate with
// Op.TransientBit, each GiveBack and each OK Release with Op.ClearsBitLast, a Delete, with the Release's
// outcome, after each Release with Op.ClearsBitFirst that is OK or unknown, and a Create, with
// the allocation's outcome, after each allocation that [setsBitFirst].
func WithUndos(history []Op) []Op {
	out := make([]Op, 0, len(history))
	for _, op := range history {
		out = append(out, op)
		if setsBitFirst(op) {
			create := op
			create.Kind, create.Err = Create, ""
			out = append(out, create)
		}
		if (op.TransientBit && op.Kind == Allocate && op.Outcome == Refused) || (op.ClearsBitLast && op.Bitmap && op.Kind == Release && op.Outcome == OK) || op.Kind == GiveBack {
			undo := op
			undo.Kind, undo.Owner, undo.Outcome, undo.TransientBit, undo.Err = Undo, "", OK, false, ""
			out = append(out, undo)
		}
		if op.ClearsBitFirst && op.Bitmap && op.Kind == Release && op.Outcome != Refused {
			del := op
			del.Kind, del.Err = Delete, ""
			out = append(out, del)
		}
	}
	return out
}

// setsBitFirst reports whether op is an allocation the model checks in two steps, a bit set for
// its owner and then its Create (Op.SetsBitFirst): one that is OK, or an Allocate whose outcome
// is unknown, of a caller that reads the bitmap.
func setsBitFirst(op Op) bool {
	if !op.SetsBitFirst || !op.Bitmap {
		return false
	}
	switch op.Kind {
	case Allocate:
		return op.Outcome != Refused
	case AllocateNext:
		return op.Outcome == OK
	}
	return false
}

func (op Op) String() string {
	s := op.Kind.String() + "("
	switch op.Kind {
	case Allocate:
		s += op.Addr.String() + ", " + op.Owner
	case AllocateNext:
		s += op.Owner
	case Release, Undo, Delete, Unreserve, GiveBack:
		s += op.Addr.String()
		if op.Retains {
			s += ", retain for " + op.Owner
		}
	case Repair, Reserve, Create:
		s += op.Addr.String() + ", " + op.Owner
	case Claim:
		s += op.Owner
	}
	s += ") → " + op.Outcome.String()
	switch {
	case op.Kind == Claim && op.Elsewhere:
		s += " elsewhere, not " + op.Addr.String()
	case (op.Kind == AllocateNext || op.Kind == Claim) && op.Outcome == OK:
		s += " " + op.Addr.String()
	}
	return s
}

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

// orphanRepairer is the owner of the Repairs that delete an orphaned IPAddress object.
const orphanRepairer = "(kube-apiserver's repair of an orphaned object)"

// orphanRepairOf returns the Repair that may delete the IPAddress object o, a Release with
// Op.ClearsBitFirst whose outcome is unknown, left behind ([holding]), over o's interval: ok is
// false for any other operation.
func orphanRepairOf(o porcupine.Operation) (porcupine.Operation, bool) {
	op := o.Input.(Op)
	if op.Kind != Release || !op.ClearsBitFirst || !op.Bitmap || op.Outcome != Unknown {
		return porcupine.Operation{}, false
	}
	r := Op{Client: op.Client, Process: "kube-apiserver's repair", Kind: Repair, Addr: op.Addr, Owner: orphanRepairer,
		Call: o.Call, Return: o.Return, Outcome: OK}
	return porcupine.Operation{ClientId: o.ClientId, Input: r, Output: r, Call: r.Call, Return: r.Return}, true
}

// Model is the porcupine model of the ClusterIP space: the history of every address is checked
// on its own, starting free. Operations are [Op] values, as input and as output.
var Model = newModel(true)

// StrictModel is [Model] without Op.RefusalLeavesBit: refusals are taken to leave nothing
// behind. A history that Model accepts and StrictModel rejects shows a refusal leaving a bit
// behind: kube-apiserver v1.33's, or a DualWrite create's whose answer was lost.
var StrictModel = newModel(false)

func newModel(allowLeftBits bool) porcupine.Model {
	return porcupine.Model{
		Partition: partition,
		Init:      func() interface{} { return free },
		Step: func(state, input, _ interface{}) (bool, interface{}) {
			return step(state.(string), input.(Op), allowLeftBits)
		},
		DescribeOperation: func(input, _ interface{}) string {
			op := input.(Op)
			return op.Process + ": " + op.String()
		},
		DescribeState: func(state interface{}) string {
			return "{" + strings.ReplaceAll(state.(string), "\n", " | ") + "}"
		},
		DescribeOperationMetadata: func(info interface{}) string {
			if info == nil {
				return ""
			}
			return info.(string)
		},
	}
}

// partition splits a history by address. An AllocateNext whose outcome is unknown goes into
// every part, as an allocation of that address that may have happened; one refused as full
// goes into the part of every address of its Op.Range and every address the history names
// when it has none, as a refusal that needs the address held. Each address is checked on its
// own, so a refusal as full is legal when each address was held at some instant of the call,
// not necessarily the same one for all. The addresses of a range that no operation names are
// free throughout but for lost AllocateNexts, so one of them, the lowest, stands for all.
// Each allocation with Op.RepairFrees whose outcome is unknown brings a Repair of its owner
// into the parts it is in.
//
// A Claim of Service s is an allocation that crosses addresses: it must take the reservation kept
// for s wherever one is. So it goes into the part of every address where a reservation for s may
// be (a Reserve of [ReservedFor] s, or a Release of s that Retains): an OK Claim into its own
// address's part as an allocation, and into the others' as a copy (Op.Elsewhere) that must not
// find the reservation there at its instant; a Claim that is not OK into those parts as a claim
// that may have happened, and, since it may have taken a free address instead, among the lost
// AllocateNexts.
func partition(history []porcupine.Operation) [][]porcupine.Operation {
	byAddr := map[netip.Addr][]porcupine.Operation{}
	var anywhere, full, claims []porcupine.Operation
	reservedAt := map[string][]netip.Addr{} // by reservation holder: the addresses it may hold
	for _, o := range history {
		op := o.Input.(Op)
		switch {
		case op.Kind == AllocateNext && op.Outcome == Unknown:
			anywhere = append(anywhere, o)
		case op.Kind == AllocateNext && op.Outcome == Refused:
			full = append(full, o)
		case op.Kind == Claim && op.Outcome != OK:
			claims = append(claims, o)
			lost := op
			lost.Kind, lost.Addr = AllocateNext, netip.Addr{}
			anywhere = append(anywhere, porcupine.Operation{ClientId: o.ClientId, Input: lost, Output: lost, Call: o.Call, Return: o.Return, Metadata: o.Metadata})
		default:
			byAddr[op.Addr] = append(byAddr[op.Addr], o)
			if r, ok := orphanRepairOf(o); ok {
				byAddr[op.Addr] = append(byAddr[op.Addr], r)
			}
			if r, ok := repairOf(o, op.Addr); ok {
				byAddr[op.Addr] = append(byAddr[op.Addr], r)
			}
			switch {
			case op.Kind == Claim:
				claims = append(claims, o)
			case op.Kind == Reserve:
				reservedAt[op.Owner] = append(reservedAt[op.Owner], op.Addr)
			case op.Kind == Release && op.Retains:
				reservedAt[ReservedFor(op.Owner)] = append(reservedAt[ReservedFor(op.Owner)], op.Addr)
			}
		}
	}
	for _, o := range claims {
		op := o.Input.(Op)
		for _, a := range slices.Compact(slices.SortedFunc(slices.Values(reservedAt[ReservedFor(op.Owner)]), netip.Addr.Compare)) {
			if op.Outcome == OK && a == op.Addr {
				continue
			}
			c := op
			c.Addr, c.Elsewhere = a, op.Outcome == OK
			if c.Elsewhere {
				c.Err = "it got " + op.Addr.String()
			}
			byAddr[a] = append(byAddr[a], porcupine.Operation{ClientId: o.ClientId, Input: c, Output: c, Call: o.Call, Return: o.Return, Metadata: c.Err})
		}
	}
	standIns := map[netip.Prefix]bool{}
	for _, o := range full {
		if rg := o.Input.(Op).Range.Masked(); rg.IsValid() && !standIns[rg] {
			standIns[rg] = true
			if a, ok := unnamed(rg, byAddr); ok {
				byAddr[a] = nil
			}
		}
	}
	addrs := make([]netip.Addr, 0, len(byAddr))
	for a := range byAddr {
		addrs = append(addrs, a)
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	anywhere = mergeLost(anywhere)
	parts := make([][]porcupine.Operation, 0, len(addrs))
	for _, a := range addrs {
		part := append(byAddr[a], anywhere...)
		for _, o := range anywhere {
			if r, ok := repairOf(o, a); ok {
				part = append(part, r)
			}
		}
		w := witnessesOf(byAddr[a])
		for _, o := range full {
			op := o.Input.(Op)
			if !op.Range.IsValid() || usable(op.Range, a) {
				op.Addr = a
				o.Input, o.Output = op, op
				if !w.implies(o.Call, o.Return, op.Bitmap) {
					part = append(part, o)
				}
			}
		}
		parts = append(parts, part)
	}
	return parts
}

// witnesses are the operations of one address's part after which the address is held, as a
// refusal as full needs it: an OK allocation (held by its owner), or a refused Allocate (held,
// as its caller sees it). A refusal as full whose interval holds a witness's whole interval adds
// nothing to the check, so the partition leaves it out: wherever the witness is placed, the
// refusal can be placed right after it, where every state left holds the address. Refusals as
// full are many when a range stays full (1,624 in the 5-minute finish history, each in every
// address's part), and the fewer overlap, the less porcupine's search has to try.
type witnesses struct {
	// strict: after these nobody may take the address (held by an owner); all: also those
	// after which a caller that reads the bitmap sees it taken (held, or its bit set). Each
	// sorted by call, with the least return from each index on.
	strict, all witnessList
}

type witnessList struct{ calls, minReturn []int64 }

func witnessesOf(ops []porcupine.Operation) witnesses {
	var strict, all []porcupine.Operation
	for _, o := range ops {
		op := o.Input.(Op)
		switch {
		case (op.Kind == Allocate || op.Kind == AllocateNext) && op.Outcome == OK,
			op.Kind == Allocate && op.Outcome == Refused && !op.Bitmap:
			strict = append(strict, o)
			all = append(all, o)
		case op.Kind == Allocate && op.Outcome == Refused:
			all = append(all, o)
		}
	}
	return witnesses{newWitnessList(strict), newWitnessList(all)}
}

func newWitnessList(ops []porcupine.Operation) witnessList {
	slices.SortFunc(ops, func(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) })
	l := witnessList{calls: make([]int64, len(ops)), minReturn: make([]int64, len(ops))}
	for i := len(ops) - 1; i >= 0; i-- {
		l.calls[i], l.minReturn[i] = ops[i].Call, ops[i].Return
		if i+1 < len(ops) {
			l.minReturn[i] = min(l.minReturn[i], l.minReturn[i+1])
		}
	}
	return l
}

// holds reports whether some witness's interval lies within [call, ret].
func (l witnessList) holds(call, ret int64) bool {
	i, _ := slices.BinarySearch(l.calls, call)
	return i < len(l.calls) && l.minReturn[i] <= ret
}

// implies reports whether a refusal as full over [call, ret], from a caller that reads the
// bitmap or not, is implied by a witness.
func (w witnesses) implies(call, ret int64, bitmap bool) bool {
	if bitmap {
		return w.all.holds(call, ret)
	}
	return w.strict.holds(call, ret)
}

// unnamed returns the lowest usable address of rg that has no part in byAddr; ok is false when
// there is none. It looks at no more addresses than byAddr has, plus one.
func unnamed(rg netip.Prefix, byAddr map[netip.Addr][]porcupine.Operation) (netip.Addr, bool) {
	for a := rg.Masked().Addr().Next(); a.IsValid() && usable(rg, a); a = a.Next() {
		if _, named := byAddr[a]; !named {
			return a, true
		}
	}
	return netip.Addr{}, false
}

// usable reports whether a is an address of rg that can be allocated: in it, and neither its
// network address nor, for IPv4, its broadcast address.
func usable(rg netip.Prefix, a netip.Addr) bool {
	if !rg.Contains(a) || a == rg.Masked().Addr() {
		return false
	}
	if !a.Is4() {
		return true
	}
	host := 32 - rg.Bits()
	v := a.As4()
	n := uint32(v[0])<<24 | uint32(v[1])<<16 | uint32(v[2])<<8 | uint32(v[3])
	return host == 0 || n&(1<<host-1) != 1<<host-1
}

// repairOf returns the Repair of addr that o, an allocation, may bring: ok is false unless o
// has Op.RepairFrees, an unknown outcome, and a return at least RepairGrace after its call. For
// merged lost AllocateNexts ([mergeLost]) the call is the first one's, so the Repair may come
// too early for a later one: lenient, and only ever about an allocation nobody was told of.
func repairOf(o porcupine.Operation, addr netip.Addr) (porcupine.Operation, bool) {
	op := o.Input.(Op)
	call := o.Call + int64(RepairGrace)
	if !op.RepairFrees || op.Outcome != Unknown || (op.Kind != Allocate && op.Kind != AllocateNext) || call > o.Return {
		return porcupine.Operation{}, false
	}
	r := Op{Client: op.Client, Process: "kube-apiserver's repair", Kind: Repair, Addr: addr, Owner: op.Owner,
		Call: call, Return: o.Return, Outcome: OK}
	return porcupine.Operation{ClientId: o.ClientId, Input: r, Output: r, Call: r.Call, Return: r.Return}, true
}

// mergeLost merges the AllocateNexts whose answers were lost into one per kind of caller (what
// it reads, what it may leave behind), from the first one's call to the last one's return.
// Within one address's part at most one of them can have taken the address, since nobody knows
// to release it, so one stands for all of them, with a wider interval; without the merge the
// search tries every order of them, which is exponential in their number.
func mergeLost(ops []porcupine.Operation) []porcupine.Operation {
	type class struct{ bitmap, leaves, refusalLeaves, clearsBitLast, repairFrees, fallsBack bool }
	merged := map[class]int{} // index in out
	var out []porcupine.Operation
	for _, o := range ops {
		op := o.Input.(Op)
		c := class{op.Bitmap, op.LeavesBit, op.RefusalLeavesBit, op.ClearsBitLast, op.RepairFrees, op.FallsBackToObjects}
		i, ok := merged[c]
		if !ok {
			// Each class its own owner, so that a Repair frees only its own class's.
			op.Owner, op.Process = fmt.Sprintf("(a lost AllocateNext #%d)", len(out)), "lost AllocateNexts"
			o.Input, o.Output = op, op
			merged[c] = len(out)
			out = append(out, o)
			continue
		}
		m := out[i]
		m.Call, m.Return = min(m.Call, o.Call), max(m.Return, o.Return)
		mop := m.Input.(Op)
		mop.Call, mop.Return = m.Call, m.Return
		m.Input, m.Output = mop, mop
		out[i] = m
	}
	return out
}

// Result is what [Check] found.
type Result struct {
	// Verdict is porcupine's: porcupine.Ok when the history is linearizable, porcupine.Illegal
	// when it is not, porcupine.Unknown when the check ran out of time.
	Verdict porcupine.CheckResult
	// Ops is how many operations were checked; Addresses how many addresses they touch.
	Ops, Addresses int
	// Unknown counts the operations whose outcome was unknown.
	Unknown int
	// Elapsed is how long porcupine took.
	Elapsed time.Duration
	// HTML is the timeline written when Verdict is not porcupine.Ok, or "".
	HTML string
}

// Linearizable reports whether history is linearizable under m, with no time limit.
func Linearizable(m porcupine.Model, history []Op) bool {
	return porcupine.CheckOperations(m, operations(history))
}

// IllegalAddresses returns the addresses whose part of history is not linearizable under m, in
// order, each part checked within timeout (0: no limit).
// A part whose check runs out of timeout counts as not linearizable.
func IllegalAddresses(m porcupine.Model, history []Op, timeout time.Duration) []netip.Addr {
	whole := m
	whole.Partition = nil
	var bad []netip.Addr
	for _, part := range partition(operations(history)) {
		if porcupine.CheckOperationsTimeout(whole, part, timeout) == porcupine.Ok {
			continue
		}
		for _, o := range part {
			if op := o.Input.(Op); op.Addr.IsValid() {
				bad = append(bad, op.Addr)
				break
			}
		}
	}
	return bad
}

func operations(history []Op) []porcupine.Operation {
	ops := make([]porcupine.Operation, 0, len(history))
	for _, op := range history {
		ops = append(ops, porcupine.Operation{
			ClientId: op.Client,
			Input:    op,
			Output:   op,
			Call:     op.Call,
			Return:   op.Return,
			Metadata: op.Err,
		})
	}
	return ops
}

// Check checks that history is linearizable under [Model] within timeout (0: no limit). When it
// is not, or the check runs out of time, it writes porcupine's timeline of the history, with the
// longest linearizable prefix of each address and where it fails, to htmlPath, and names the
// file in the Result. An error is returned only when writing the timeline fails.
func Check(history []Op, timeout time.Duration, htmlPath string) (Result, error) {
	ops := operations(history)
	res := Result{Ops: len(history)}
	addrs := map[netip.Addr]bool{}
	for _, op := range history {
		if op.Outcome == Unknown {
			res.Unknown++
		}
		if op.Addr.IsValid() {
			addrs[op.Addr] = true
		}
	}
	res.Addresses = len(addrs)
	start := time.Now()
	verdict, info := porcupine.CheckOperationsVerbose(Model, ops, timeout)
	res.Elapsed = time.Since(start)
	res.Verdict = verdict
	if verdict == porcupine.Ok {
		return res, nil
	}
	if err := porcupine.VisualizePath(Model, info, htmlPath); err != nil {
		return res, fmt.Errorf("write the timeline: %w", err)
	}
	res.HTML = htmlPath
	return res, nil
}
