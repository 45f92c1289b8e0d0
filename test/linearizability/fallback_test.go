package linearizability

import (
	"testing"

	"github.com/anishathalye/porcupine"
)

// kubeAPIServer returns op as the Service workers record a kube-apiserver operation.
func kubeAPIServer(op Op) Op {
	op.Process, op.Bitmap, op.LeavesBit, op.RefusalLeavesBit, op.ClearsBitFirst, op.RepairFrees, op.FallsBackToObjects =
		"kube-apiserver", true, true, true, true, true, true
	return op
}

// strayBitTakenHistory is from the 5-minute history of the finish window (10.96.0.24 and 61
// other addresses): an address whose bit kube-apiserver set for nobody is free, and with the
// bitmap full kube-apiserver's AllocateNext falls back to the IPAddress objects and takes it
// ("no IP address available on the old ClusterIP allocator"), leaving the bit; its Service
// delete clears the bit, after which a Legacy caller gets the address.
func strayBitTakenHistory() []Op {
	return []Op{
		{Client: 0, Process: "ipaddressonly-1#0", Kind: Allocate, Addr: addrA, Owner: "i", Call: 0, Return: 10, Outcome: OK},
		kubeAPIServer(Op{Client: 1, Kind: Allocate, Addr: addrA, Owner: "default/h-1-1", Call: 20, Return: 30, Outcome: Refused}),
		{Client: 0, Process: "ipaddressonly-1#0", Kind: Release, Addr: addrA, Call: 40, Return: 50, Outcome: OK},
		{Client: 2, Process: "legacy-0#0", Kind: Allocate, Addr: addrA, Owner: "l1", Call: 60, Return: 70, Outcome: Refused, Bitmap: true},
		kubeAPIServer(Op{Client: 1, Kind: AllocateNext, Addr: addrA, Owner: "default/h-1-2", Call: 80, Return: 90, Outcome: OK}),
		kubeAPIServer(Op{Client: 1, Kind: Release, Addr: addrA, Call: 100, Return: 110, Outcome: OK}),
		{Client: 2, Process: "legacy-0#0", Kind: Allocate, Addr: addrA, Owner: "l2", Call: 120, Return: 130, Outcome: OK, Bitmap: true},
	}
}

func TestKubeAPIServerFallsBackToObjects(t *testing.T) {
	noFallback := func(h []Op) []Op {
		out := append([]Op(nil), h...)
		for i := range out {
			out[i].FallsBackToObjects = false
		}
		return out
	}
	tests := []struct {
		name    string
		history []Op
		want    bool
	}{
		{"an address with a bit set for nobody, taken by its object alone", strayBitTakenHistory(), true},
		{"the same without the fallback: the bit refuses kube-apiserver", noFallback(strayBitTakenHistory()), false},
		{
			// The 5-minute upgrade window (10.96.0.105, and 5 other addresses): a Legacy
			// process holds the address in the bitmap alone, with no IPAddress object, and
			// kube-apiserver's fallback hands it to a Service. Two owners.
			name: "an address a Legacy caller holds, taken by the fallback",
			history: []Op{
				{Client: 0, Process: "legacy-0#1", Kind: AllocateNext, Addr: addrA, Owner: "legacy-0-1-14-3581", Call: 0, Return: 10, Outcome: OK, Bitmap: true},
				kubeAPIServer(Op{Client: 1, Kind: AllocateNext, Addr: addrA, Owner: "default/h-7-4297", Call: 20, Return: 30, Outcome: OK}),
			},
		},
		{
			// The 5-minute upgrade window (10.96.0.65): the fallback writes no bit, so a
			// Legacy caller takes the address while the Service holds it. Two owners.
			name: "a Legacy caller takes the address the fallback holds",
			history: []Op{
				kubeAPIServer(Op{Client: 1, Kind: AllocateNext, Addr: addrA, Owner: "default/h-8-4708", Call: 0, Return: 10, Outcome: OK}),
				{Client: 0, Process: "legacy-2#3", Kind: AllocateNext, Addr: addrA, Owner: "legacy-2-3-23-1653", Call: 20, Return: 30, Outcome: OK, Bitmap: true},
				kubeAPIServer(Op{Client: 1, Kind: Release, Addr: addrA, Call: 40, Return: 50, Outcome: OK}),
			},
		},
		{
			name: "a refused create leaves the address with its Legacy holder",
			history: []Op{
				{Client: 0, Process: "legacy-0#0", Kind: Allocate, Addr: addrA, Owner: "l", Call: 0, Return: 10, Outcome: OK, Bitmap: true},
				kubeAPIServer(Op{Client: 1, Kind: Allocate, Addr: addrA, Owner: "default/h-1-1", Call: 20, Return: 30, Outcome: Refused}),
				{Client: 2, Process: "legacy-2#0", Kind: Allocate, Addr: addrA, Owner: "l2", Call: 40, Return: 50, Outcome: OK, Bitmap: true},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Linearizable(Model, WithUndos(tt.history)); got != tt.want {
				t.Errorf("linearizable = %v, want %v", got, tt.want)
			}
		})
	}
}

// A lost kube-apiserver create that took a free address by its object alone and that
// kube-apiserver's repair then freed leaves the bit as it found it: clear, so a Legacy caller
// may take the address; one that set its own bit leaves that bit, which refuses it.
func TestRepairOfAFallbackLeavesTheBitAsItWas(t *testing.T) {
	lost := kubeAPIServer(Op{Client: 1, Kind: Allocate, Addr: addrA, Owner: "default/h-1-1", Call: 0, Return: 1000e9, Outcome: Unknown})
	lost.Kind, lost.Addr = AllocateNext, addrA
	r, ok := repairOf(porcupine.Operation{ClientId: 1, Input: lost, Output: lost, Call: lost.Call, Return: lost.Return}, addrA)
	if !ok {
		t.Fatal("no Repair for a lost create")
	}
	rep := r.Input.(Op)
	for _, tt := range []struct {
		state, want string
	}{
		{"default/h-1-1", free},
		{"default/h-1-1" + leftBit, free + leftBit},
		{"default/h-1-1" + ownBit, free + stuckBit},
	} {
		ok, next := step(tt.state, rep, true)
		if !ok || next != stateOf([]string{tt.state, tt.want}) {
			t.Errorf("Repair from %q = %v %q, want %q or as it was", tt.state, ok, next, tt.want)
		}
	}
}
