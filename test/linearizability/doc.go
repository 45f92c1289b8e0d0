// Package linearizability records histories of ClusterIP operations run against real components
// under injected faults, and checks them against a model of the ClusterIP space with porcupine.
//
// The model: each address is free or held by one owner. Allocate and AllocateNext take a free
// address for an owner, Release frees one. An operation whose outcome is unknown (a timeout, a
// lost answer, a process killed before it answered) may or may not have taken effect, at any time
// between its call and the end of the history. A history is linearizable when some order of its
// operations, each at one instant between its call and its return, explains every answer. That
// rules out two owners holding one address, an acknowledged allocation being lost and an
// acknowledged release being undone.
//
// Dual write keeps each address in two stores, the bitmap and IPAddress objects, and callers
// differ in which they read (Op.Bitmap), so the model also keeps, per address, a bit that may be
// set for nobody: one an unknown dual write left behind for repair (Op.LeavesBit), one
// kube-apiserver v1.33 left when it refused an allocation (Op.RefusalLeavesBit) or kept when its
// repair loop deleted the IPAddress object of a Service create cut short (Op.RepairFrees), one a
// refused dual write held until it undid it (Op.TransientBit), one a DualWrite AllocateNext set and
// gave back before it returned (a GiveBack, which the allocator process records from
// clusterip.DualWriteTrace) or left set for repair when it went on to another address (a
// KeepBit, recorded the same way), and one a DualWrite release holds
// between deleting the IPAddress object and clearing the bit (Op.ClearsBitLast). A dual write's
// allocation sets the bit before it creates the IPAddress object (Op.SetsBitFirst), so the model
// checks it in two steps: in between, the bit is set for its owner and an IPAddressOnly caller
// may take the address and free it again, but the allocation succeeds only where nobody holds
// the object when it creates it. Such a bit only
// makes callers that read the bitmap refuse the address; it never lets anyone take a held one,
// and one that its caller clears is gone by the time the caller's operation returns. The model
// knows who wrote each bit: a caller writes one only where it finds the bit clear, so a holder's
// own bit goes with its release, and a refusal leaves a bit only while an IPAddressOnly caller
// holds the address or while kube-apiserver's release, which clears the bit before it deletes the
// object (Op.ClearsBitFirst), is between the two. kube-apiserver's AllocateNext, when the bitmap
// fails it (full, or its storage failing), takes an address by its IPAddress object alone and
// writes no bit (Op.FallsBackToObjects): the model lets it take an address nobody holds whatever
// its bit, never a held one, though real kube-apiserver takes one a Legacy caller holds.
//
// Reservations (package reservation) are holders too: Reserve takes a free address for a
// reservation, kept for a named Service ([ReservedFor]) or for none ([ReservedAnonymously]), as an
// IPAddressOnly Allocate does; Unreserve frees a reservation and refuses to free anything else;
// a Release that Retains turns its Service's allocation into a reservation kept for it; and a
// Claim, a Service create with Config.Reservations, takes the reservation kept for its Service
// or, where none is, a free address. Since an address has one holder, a reserved address is
// never held by any Service (no allocation takes it, a Claim takes only its own); and a Claim
// that gets another address while its reservation exists is illegal, which the partition checks
// by putting each Claim in the part of every address its Service's reservation may hold.
//
// Operations on different addresses commute, so a history is checked one address at a time
// ([Model]'s partition): an AllocateNext whose answer was lost names no address, so it is put in
// every address's part as an allocation that may have happened; those of one kind of caller are
// merged into one, since at most one of them can have taken a given address. An AllocateNext
// refused as full is put in the part of every address of its range (Op.Range), each of which
// must be held, as its caller sees it, at some instant of the call: one address at a time, the
// instants may differ, so this checks less than one instant at which the range was full. A
// refusal that an operation of the address within it already implies (an OK allocation, or a
// refused Allocate as its caller sees it) is left out of that address's part, which changes no
// verdict.
//
// A history that is not linearizable is attributed address by address ([Judge], [Attribute]): at
// an address whose part is illegal, the first answer that no explanation of the earlier answers
// allows (with every later one not counted) is blamed on the process that gave it, taken as lost,
// and the search goes on until the part is linearizable. [OriginOf] names each process a stock
// kube-apiserver, of its release, or clusterip's (its library in a mode, or a fork). The model is
// the same; a history counts against clusterip only where a blamed process is clusterip's, or
// where the attribution could not finish: an address where only stock kube-apiserver's answers
// are blamed is stock's defect, reported as such, and fails nothing.
//
// The harness (the tests of this package) runs allocator processes in mixed modes beside a real
// kube-apiserver v1.33.13 on a three-member etcd, with the faults of nemesis_test.go.
package linearizability
