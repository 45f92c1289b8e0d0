package linearizability

import (
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/anishathalye/porcupine"
)

func TestRefusalsAsFullAreChecked(t *testing.T) {
	// A range of two usable addresses, one and two.
	rg := netip.MustParsePrefix("10.96.0.0/30")
	one, two := netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("10.96.0.2")
	full := func(client int, call, ret int64, bitmap bool) Op {
		return Op{Client: client, Process: "p", Kind: AllocateNext, Owner: "full", Range: rg, Call: call, Return: ret,
			Outcome: Refused, Bitmap: bitmap, Err: "allocator: range is full"}
	}
	tests := []struct {
		name    string
		history []Op
		want    porcupine.CheckResult
	}{
		{
			name: "a range said full while one of its addresses, named in the history, is free",
			history: []Op{
				{Client: 0, Kind: Allocate, Addr: one, Owner: "a", Call: 0, Return: 10, Outcome: OK},
				{Client: 1, Kind: Allocate, Addr: two, Owner: "b", Call: 0, Return: 10, Outcome: OK},
				{Client: 1, Kind: Release, Addr: two, Call: 20, Return: 30, Outcome: OK},
				func() Op { op := full(2, 40, 50, false); op.Range = netip.Prefix{}; return op }(),
			},
			want: porcupine.Illegal,
		},
		{
			name: "a range said full while one of its addresses, named by nobody, is free",
			history: []Op{
				{Client: 0, Kind: Allocate, Addr: one, Owner: "a", Call: 0, Return: 10, Outcome: OK},
				full(2, 40, 50, true),
			},
			want: porcupine.Illegal,
		},
		{
			name: "a range full of held addresses",
			history: []Op{
				{Client: 0, Kind: Allocate, Addr: one, Owner: "a", Call: 0, Return: 10, Outcome: OK},
				{Client: 1, Kind: AllocateNext, Addr: two, Owner: "b", Call: 0, Return: 10, Outcome: OK},
				full(2, 40, 50, false),
			},
			want: porcupine.Ok,
		},
		{
			name: "a range full at some instant of the call, an address freed before it returns",
			history: []Op{
				{Client: 0, Kind: Allocate, Addr: one, Owner: "a", Call: 0, Return: 10, Outcome: OK},
				{Client: 1, Kind: Allocate, Addr: two, Owner: "b", Call: 0, Return: 10, Outcome: OK},
				{Client: 1, Kind: Release, Addr: two, Call: 45, Return: 60, Outcome: OK},
				full(2, 40, 50, false),
			},
			want: porcupine.Ok,
		},
		{
			name: "a range said full after an address was freed",
			history: []Op{
				{Client: 0, Kind: Allocate, Addr: one, Owner: "a", Call: 0, Return: 10, Outcome: OK},
				{Client: 1, Kind: Allocate, Addr: two, Owner: "b", Call: 0, Return: 10, Outcome: OK},
				{Client: 1, Kind: Release, Addr: two, Call: 20, Return: 30, Outcome: OK},
				full(2, 40, 50, false),
			},
			want: porcupine.Illegal,
		},
		{
			name: "two refusals as full, while one address no operation names is free",
			history: []Op{
				{Client: 0, Kind: Allocate, Addr: one, Owner: "a", Call: 0, Return: 10, Outcome: OK},
				full(2, 40, 50, false),
				full(3, 40, 50, true),
			},
			want: porcupine.Illegal,
		},
		{
			name: "a range full with an AllocateNext whose answer was lost",
			history: []Op{
				{Client: 0, Kind: Allocate, Addr: one, Owner: "a", Call: 0, Return: 10, Outcome: OK},
				{Client: 1, Kind: AllocateNext, Owner: "lost", Call: 5, Return: 100, Outcome: Unknown},
				full(2, 40, 50, false),
			},
			want: porcupine.Ok,
		},
		{
			name: "a range full for callers that read the bitmap, with a bit left for nobody",
			history: []Op{
				{Client: 0, Kind: Allocate, Addr: one, Owner: "a", Call: 0, Return: 10, Outcome: OK, Bitmap: true},
				{Client: 1, Kind: Allocate, Addr: two, Owner: "i", Call: 0, Return: 10, Outcome: OK},
				{Client: 3, Kind: Allocate, Addr: two, Owner: "k", Call: 12, Return: 14, Outcome: Refused, Bitmap: true, RefusalLeavesBit: true},
				{Client: 1, Kind: Release, Addr: two, Call: 20, Return: 30, Outcome: OK},
				full(2, 40, 50, true),
			},
			want: porcupine.Ok,
		},
		{
			name: "a range not full for IPAddressOnly callers, with a bit left for nobody",
			history: []Op{
				{Client: 0, Kind: Allocate, Addr: one, Owner: "a", Call: 0, Return: 10, Outcome: OK, Bitmap: true},
				{Client: 1, Kind: Allocate, Addr: two, Owner: "i", Call: 0, Return: 10, Outcome: OK},
				{Client: 3, Kind: Allocate, Addr: two, Owner: "k", Call: 12, Return: 14, Outcome: Refused, Bitmap: true, RefusalLeavesBit: true},
				{Client: 1, Kind: Release, Addr: two, Call: 20, Return: 30, Outcome: OK},
				full(2, 40, 50, false),
			},
			want: porcupine.Illegal,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := Check(tt.history, 0, filepath.Join(t.TempDir(), "history.html"))
			if err != nil {
				t.Fatal(err)
			}
			if res.Verdict != tt.want {
				t.Errorf("Check() = %v, want %v", res.Verdict, tt.want)
			}
		})
	}
}

func TestUsableLeavesOutNetworkAndBroadcast(t *testing.T) {
	tests := []struct {
		rg   string
		addr string
		want bool
	}{
		{"10.96.0.0/30", "10.96.0.0", false},
		{"10.96.0.0/30", "10.96.0.1", true},
		{"10.96.0.0/30", "10.96.0.2", true},
		{"10.96.0.0/30", "10.96.0.3", false},
		{"10.96.0.0/30", "10.96.0.4", false},
		{"10.96.0.0/31", "10.96.0.1", false},
		{"10.96.0.0/25", "10.96.0.126", true},
		{"10.96.0.0/25", "10.96.0.127", false},
		{"fd00::/127", "fd00::", false},
		{"fd00::/127", "fd00::1", true}, // IPv6 has no broadcast address
	}
	for _, tt := range tests {
		if got := usable(netip.MustParsePrefix(tt.rg), netip.MustParseAddr(tt.addr)); got != tt.want {
			t.Errorf("usable(%s, %s) = %v, want %v", tt.rg, tt.addr, got, tt.want)
		}
	}
}
