package linearizability

import (
	"fmt"
	"net/netip"
	"strings"
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
	// KeepBit is a bit our DualWrite allocator set during one of its calls and left set for
	// repair (clusterip.DualWriteTrace's BitKept), over the interval of that call: it found the
	// bit of Op.Addr clear and set it, and the IPAddress create's answer was ambiguous and the
	// object then found with another owner or not at all, so the address is not the call's
	// allocation. From then on the bit is set for nobody (as one left behind by Op.LeavesBit):
	// callers that read the bitmap are refused the address until a Release from one of them
	// clears it. It says nothing of who holds the address. Recorded, not called.
	KeepBit
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
	case KeepBit:
		return "KeepBit"
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

func (op Op) String() string {
	s := op.Kind.String() + "("
	switch op.Kind {
	case Allocate:
		s += op.Addr.String() + ", " + op.Owner
	case AllocateNext:
		s += op.Owner
	case Release, Undo, Delete, Unreserve, GiveBack, KeepBit:
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
