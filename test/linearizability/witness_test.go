package linearizability

import (
	"net/netip"
	"testing"
)

// fullRefusalsIn returns how many refusals as full addr's part of history has.
func fullRefusalsIn(history []Op, addr netip.Addr) int {
	for _, p := range partition(operations(history)) {
		if len(p) == 0 || p[0].Input.(Op).Addr != addr {
			continue
		}
		n := 0
		for _, o := range p {
			if op := o.Input.(Op); op.Kind == AllocateNext && op.Outcome == Refused {
				n++
			}
		}
		return n
	}
	return -1
}

func TestPartitionLeavesOutRefusalsAWitnessImplies(t *testing.T) {
	rg := netip.MustParsePrefix("10.96.0.20/30") // usable: .21, and .22 held throughout
	a := netip.MustParseAddr("10.96.0.21")
	other := Op{Client: 8, Kind: Allocate, Addr: netip.MustParseAddr("10.96.0.22"), Owner: "x", Call: -10, Return: -5, Outcome: OK}
	refusal := func(call, ret int64, bitmap bool) Op {
		return Op{Client: 9, Process: "p", Kind: AllocateNext, Owner: "r", Range: rg, Call: call, Return: ret, Outcome: Refused, Bitmap: bitmap}
	}
	tests := []struct {
		name    string
		history []Op
		kept    int
		want    bool
	}{
		{
			name: "an allocation within the refusal",
			history: []Op{
				{Client: 0, Kind: Allocate, Addr: a, Owner: "o", Call: 10, Return: 20, Outcome: OK},
				refusal(0, 30, false),
			},
			kept: 0, want: true,
		},
		{
			name: "an allocation that ends after the refusal",
			history: []Op{
				{Client: 0, Kind: Allocate, Addr: a, Owner: "o", Call: 10, Return: 40, Outcome: OK},
				refusal(0, 30, false),
			},
			kept: 1, want: true,
		},
		{
			// A refusal from a caller that reads the bitmap may have seen only a bit: it
			// implies what a refusal that reads the bitmap needs, not what one that reads
			// only objects does.
			name: "a bitmap refusal of the address within an objects-only refusal as full",
			history: []Op{
				{Client: 0, Kind: Allocate, Addr: a, Owner: "o", Call: 10, Return: 20, Outcome: Refused, Bitmap: true},
				refusal(0, 30, false),
				refusal(0, 30, true),
			},
			kept: 1, want: false,
		},
		{
			name: "released before the refusal: it stays and fails",
			history: []Op{
				{Client: 0, Kind: Allocate, Addr: a, Owner: "o", Call: 0, Return: 10, Outcome: OK},
				{Client: 0, Kind: Release, Addr: a, Call: 20, Return: 30, Outcome: OK},
				refusal(40, 50, false),
			},
			kept: 1, want: false,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.history = append(tt.history, other)
			if got := fullRefusalsIn(tt.history, a); got != tt.kept {
				t.Errorf("%d refusals as full kept, want %d", got, tt.kept)
			}
			if got := Linearizable(Model, tt.history); got != tt.want {
				t.Errorf("linearizable = %v, want %v", got, tt.want)
			}
		})
	}
}
