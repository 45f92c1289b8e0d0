package linearizability

import (
	"net/netip"
	"testing"
	"time"
)

// TestRefusalAsFullFromALaggingView: the 5-minute history of the finish window refused
// AllocateNexts as full, in DualWrite and IPAddressOnly processes, tens of milliseconds to about
// 2 s after an IPAddressOnly caller had deleted an address's object (10.96.0.100: freed at
// 209.205 s, "every ready IPv4 ServiceCIDR is full" at 209.296 s and 209.337 s): their informer
// had not seen the delete. The refusal is legal when the address was held within Op.ViewLag
// before the call, and still illegal when it was free throughout that, or never held at all.
func TestRefusalAsFullFromALaggingView(t *testing.T) {
	rg := netip.MustParsePrefix("10.96.0.20/30") // usable: .21 and .22
	held, freed := netip.MustParseAddr("10.96.0.21"), netip.MustParseAddr("10.96.0.22")
	history := func(lag int64, releaseFreed bool) []Op {
		h := []Op{
			{Client: 0, Process: "ipaddressonly-1#0", Kind: Allocate, Addr: held, Owner: "i1", Call: 0, Return: 10, Outcome: OK},
		}
		if releaseFreed {
			h = append(h,
				Op{Client: 1, Process: "ipaddressonly-1#0", Kind: Allocate, Addr: freed, Owner: "i2", Call: 0, Return: 10, Outcome: OK},
				Op{Client: 1, Process: "ipaddressonly-1#0", Kind: Release, Addr: freed, Call: 20, Return: 30, Outcome: OK})
		}
		return append(h, Op{Client: 2, Process: "dualwrite-0#0", Kind: AllocateNext, Owner: "d", Range: rg,
			Call: 40, Return: 50, Outcome: Refused, Bitmap: true, LeavesBit: true, ClearsBitLast: true, ViewLag: time.Duration(lag)})
	}
	tests := []struct {
		name string
		h    []Op
		want bool
	}{
		{"a view from before the delete", history(25, true), true},
		{"no lag: the address was free throughout the call", history(0, true), false},
		{"a lag too short to reach the address held", history(5, true), false},
		{"an address of the range nobody ever held", history(1000, false), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Linearizable(Model, tt.h); got != tt.want {
				t.Errorf("linearizable = %v, want %v", got, tt.want)
			}
		})
	}
}
