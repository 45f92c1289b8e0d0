package linearizability

import (
	"net/netip"
	"time"

	"github.com/anishathalye/porcupine"
)

// RepairGrace is the earliest, after an allocation's call, that kube-apiserver's repair loop can
// delete the IPAddress object it may have left: 60 s after the object's CreationTimestamp, which
// has a resolution of one second, so 59 s after any instant before the object was created.
const RepairGrace = 59 * time.Second

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
