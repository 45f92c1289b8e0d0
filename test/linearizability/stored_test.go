package linearizability

import (
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/anishathalye/porcupine"
)

// lostCreate is a Service create through kube-apiserver whose answer was lost, as the Service
// workers record it: an Allocate of addr, or with an invalid addr an AllocateNext, returning at
// the end of the history.
func lostCreate(client int, name string, addr netip.Addr, call, end int64) Op {
	op := Op{Client: client, Process: "kube-apiserver", Kind: Allocate, Addr: addr, Owner: "default/" + name,
		Call: call, Return: end, Outcome: Unknown, Err: "context deadline exceeded",
		Bitmap: true, LeavesBit: true, RefusalLeavesBit: true, ClearsBitFirst: true, RepairFrees: true, FallsBackToObjects: true}
	if !addr.IsValid() {
		op.Kind = AllocateNext
	}
	return op
}

// ipAddressOnlyTakes is an IPAddressOnly process's Allocate of addr that is OK.
func ipAddressOnlyTakes(addr netip.Addr, owner string, call int64) Op {
	return Op{Client: 9, Process: "ipaddressonly-1#0", Kind: Allocate, Addr: addr, Owner: owner,
		Call: call, Return: call + 5*ms, Outcome: OK}
}

func TestLostCreatesWhoseServiceExistsTookEffect(t *testing.T) {
	end := 100_000 * ms
	tests := []struct {
		name    string
		history []Op
		stored  map[string]netip.Addr // the Services in namespace default after the history
		want    porcupine.CheckResult
	}{
		{
			name: "a lost create stored its Service, and an IPAddressOnly caller takes its address a minute on",
			history: []Op{
				lostCreate(1, "h-1-5", addrA, 1_000*ms, end),
				ipAddressOnlyTakes(addrA, "ipaddressonly-1-0-9-40", 70_000*ms),
			},
			stored: map[string]netip.Addr{"default/h-1-5": addrA},
			want:   porcupine.Illegal,
		},
		{
			name: "a lost create did not store its Service: repair may free the address a minute on",
			history: []Op{
				lostCreate(1, "h-1-5", addrA, 1_000*ms, end),
				ipAddressOnlyTakes(addrA, "ipaddressonly-1-0-9-40", 70_000*ms),
			},
			stored: map[string]netip.Addr{},
			want:   porcupine.Ok,
		},
		{
			name: "a lost AllocateNext stored its Service at the address an IPAddressOnly caller takes",
			history: []Op{
				lostCreate(1, "h-1-6", netip.Addr{}, 1_000*ms, end),
				lostCreate(2, "h-2-3", netip.Addr{}, 2_000*ms, end), // merged with it while lost
				ipAddressOnlyTakes(addrA, "ipaddressonly-1-0-9-40", 70_000*ms),
			},
			stored: map[string]netip.Addr{"default/h-1-6": addrA},
			want:   porcupine.Illegal,
		},
		{
			name: "a lost AllocateNext stored its Service at another address",
			history: []Op{
				lostCreate(1, "h-1-6", netip.Addr{}, 1_000*ms, end),
				lostCreate(2, "h-2-3", netip.Addr{}, 2_000*ms, end),
				ipAddressOnlyTakes(addrA, "ipaddressonly-1-0-9-40", 70_000*ms),
			},
			stored: map[string]netip.Addr{"default/h-1-6": addrB},
			want:   porcupine.Ok,
		},
		{
			name: "a lost create stored its Service, and its address stays held to the end",
			history: []Op{
				lostCreate(1, "h-1-5", addrA, 1_000*ms, end),
				{Client: 3, Process: "dualwrite-0#0", Kind: Allocate, Addr: addrA, Owner: "dualwrite-0-0-3-7", Call: 80_000 * ms, Return: 80_010 * ms,
					Outcome: Refused, Bitmap: true, LeavesBit: true, ClearsBitLast: true},
			},
			stored: map[string]netip.Addr{"default/h-1-5": addrA},
			want:   porcupine.Ok,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			history, err := withStoredServices(WithUndos(tt.history), tt.stored)
			if err != nil {
				t.Fatal(err)
			}
			res, err := Check(history, 0, filepath.Join(t.TempDir(), "history.html"))
			if err != nil {
				t.Fatal(err)
			}
			if res.Verdict != tt.want {
				t.Errorf("Check() = %v, want %v", res.Verdict, tt.want)
			}
		})
	}
}
