package linearizability

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

var addrA, addrB = netip.MustParseAddr("10.96.0.20"), netip.MustParseAddr("10.96.0.21")

func TestCheckerVerdicts(t *testing.T) {
	tests := []struct {
		name    string
		history []Op
		want    porcupine.CheckResult
	}{
		{
			name: "allocate, release, allocate again",
			history: []Op{
				{Client: 0, Kind: Allocate, Addr: addrA, Owner: "a", Call: 0, Return: 10, Outcome: OK},
				{Client: 0, Kind: Release, Addr: addrA, Call: 20, Return: 30, Outcome: OK},
				{Client: 1, Kind: AllocateNext, Addr: addrA, Owner: "b", Call: 40, Return: 50, Outcome: OK},
			},
			want: porcupine.Ok,
		},
		{
			name: "two concurrent allocations of one address, one refused",
			history: []Op{
				{Client: 0, Kind: Allocate, Addr: addrA, Owner: "a", Call: 0, Return: 10, Outcome: OK},
				{Client: 1, Kind: Allocate, Addr: addrA, Owner: "b", Call: 5, Return: 8, Outcome: Refused},
			},
			want: porcupine.Ok,
		},
		{
			name: "two acknowledged owners of one address",
			history: []Op{
				{Client: 0, Kind: Allocate, Addr: addrA, Owner: "a", Call: 0, Return: 10, Outcome: OK},
				{Client: 1, Kind: AllocateNext, Addr: addrA, Owner: "b", Call: 20, Return: 30, Outcome: OK},
			},
			want: porcupine.Illegal,
		},
		{
			name: "an acknowledged release undone",
			history: []Op{
				{Client: 0, Kind: Allocate, Addr: addrA, Owner: "a", Call: 0, Return: 10, Outcome: OK},
				{Client: 0, Kind: Release, Addr: addrA, Call: 20, Return: 30, Outcome: OK},
				{Client: 1, Kind: Allocate, Addr: addrA, Owner: "b", Call: 40, Return: 50, Outcome: Refused},
			},
			want: porcupine.Illegal,
		},
		{
			name: "an acknowledged allocation lost",
			history: []Op{
				{Client: 0, Kind: Allocate, Addr: addrA, Owner: "a", Call: 0, Return: 10, Outcome: OK},
				{Client: 1, Kind: Allocate, Addr: addrB, Owner: "b", Call: 0, Return: 10, Outcome: OK},
				{Client: 2, Kind: Allocate, Addr: addrA, Owner: "c", Call: 40, Return: 50, Outcome: OK},
			},
			want: porcupine.Illegal,
		},
		{
			name: "a refusal explained by an unknown allocation",
			history: []Op{
				{Client: 0, Kind: Allocate, Addr: addrA, Owner: "a", Call: 0, Return: 100, Outcome: Unknown},
				{Client: 1, Kind: Allocate, Addr: addrA, Owner: "b", Call: 40, Return: 50, Outcome: Refused},
				{Client: 2, Kind: Release, Addr: addrA, Call: 60, Return: 70, Outcome: OK},
				{Client: 2, Kind: Allocate, Addr: addrA, Owner: "c", Call: 80, Return: 90, Outcome: OK},
			},
			want: porcupine.Ok,
		},
		{
			name: "a refusal explained by an AllocateNext whose answer was lost",
			history: []Op{
				{Client: 0, Kind: AllocateNext, Owner: "a", Call: 0, Return: 100, Outcome: Unknown},
				{Client: 1, Kind: Allocate, Addr: addrB, Owner: "b", Call: 40, Return: 50, Outcome: Refused},
			},
			want: porcupine.Ok,
		},
		{
			name: "a refusal no operation explains",
			history: []Op{
				{Client: 0, Kind: Allocate, Addr: addrA, Owner: "a", Call: 0, Return: 10, Outcome: OK},
				{Client: 1, Kind: Allocate, Addr: addrB, Owner: "b", Call: 40, Return: 50, Outcome: Refused},
			},
			want: porcupine.Illegal,
		},
		{
			name: "an unknown release may have freed the address",
			history: []Op{
				{Client: 0, Kind: Allocate, Addr: addrA, Owner: "a", Call: 0, Return: 10, Outcome: OK},
				{Client: 0, Kind: Release, Addr: addrA, Call: 20, Return: 30, Outcome: Unknown},
				{Client: 1, Kind: Allocate, Addr: addrA, Owner: "b", Call: 40, Return: 50, Outcome: OK},
			},
			want: porcupine.Ok,
		},
		{
			name:    "a bit kube-apiserver left behind, seen only by callers that read the bitmap",
			history: leftBitHistory,
			want:    porcupine.Ok,
		},
		{
			name: "a bit left behind by a caller that does not leave bits",
			history: func() []Op {
				h := append([]Op(nil), leftBitHistory...)
				h[1].RefusalLeavesBit = false
				return h
			}(),
			want: porcupine.Illegal,
		},
		{
			name: "an unknown dual write keeps its bit, and an IPAddressOnly caller takes the address",
			history: []Op{
				{Client: 0, Kind: Allocate, Addr: addrA, Owner: "d", Call: 0, Return: 100, Outcome: Unknown, Bitmap: true, LeavesBit: true},
				{Client: 1, Kind: Allocate, Addr: addrA, Owner: "i", Call: 110, Return: 120, Outcome: OK},
				{Client: 1, Kind: Release, Addr: addrA, Call: 130, Return: 140, Outcome: OK},
				{Client: 2, Kind: Allocate, Addr: addrA, Owner: "d2", Call: 150, Return: 160, Outcome: Refused, Bitmap: true},
			},
			want: porcupine.Ok,
		},
		{
			name: "a dual write refused by the IPAddress object, its bit seen meanwhile",
			history: WithUndos([]Op{
				{Client: 0, Process: "ipaddressonly-1#0", Kind: Allocate, Addr: addrA, Owner: "i", Call: 0, Return: 10, Outcome: OK},
				{Client: 1, Process: "dualwrite-0#0", Kind: Allocate, Addr: addrA, Owner: "d", Call: 20, Return: 60, Outcome: Refused, Bitmap: true, LeavesBit: true, TransientBit: true},
				{Client: 0, Process: "ipaddressonly-1#0", Kind: Release, Addr: addrA, Call: 30, Return: 40, Outcome: OK},
				{Client: 2, Process: "dualwrite-2#0", Kind: Allocate, Addr: addrA, Owner: "d2", Call: 45, Return: 50, Outcome: Refused, Bitmap: true},
				{Client: 2, Process: "dualwrite-2#0", Kind: Allocate, Addr: addrA, Owner: "d3", Call: 70, Return: 80, Outcome: OK, Bitmap: true},
			}),
			want: porcupine.Ok,
		},
		{
			name:    "kube-apiserver cut short between a Service delete's bit and its object: Legacy callers take the address beside the orphaned object, others are refused",
			history: WithUndos(orphanHistory(100, 200)),
			want:    porcupine.Ok,
		},
		{
			name: "two Legacy holders at once beside an orphaned object",
			history: WithUndos(append(orphanHistory(100, 200),
				Op{Client: 4, Process: "legacy-1#0", Kind: Allocate, Addr: addrA, Owner: "l2", Call: 205, Return: 208, Outcome: OK, Bitmap: true})),
			want: porcupine.Illegal,
		},
		{
			name:    "a Legacy allocation before kube-apiserver's delete began",
			history: WithUndos(orphanHistory(300, 200)),
			want:    porcupine.Illegal,
		},
		{
			name: "kube-apiserver refused an address nobody held while a DualWrite AllocateNext had its bit (GiveBack)",
			history: WithUndos([]Op{
				{Client: 0, Process: "ipaddressonly-1#0", Kind: Allocate, Addr: addrA, Owner: "i", Call: 0, Return: 10, Outcome: OK},
				{Client: 0, Process: "ipaddressonly-1#0", Kind: Release, Addr: addrA, Call: 20, Return: 30, Outcome: OK},
				{Client: 1, Process: "dualwrite-0#0", Kind: AllocateNext, Addr: addrB, Owner: "d", Call: 15, Return: 60, Outcome: OK, Bitmap: true},
				{Client: 1, Process: "dualwrite-0#0", Kind: GiveBack, Addr: addrA, Call: 15, Return: 60, Outcome: OK, Bitmap: true},
				{Client: 2, Process: "kube-apiserver", Kind: Allocate, Addr: addrA, Owner: "k", Call: 40, Return: 50, Outcome: Refused, Bitmap: true},
			}),
			want: porcupine.Ok,
		},
		{
			name: "the same refusal without the GiveBack that explains it",
			history: WithUndos([]Op{
				{Client: 0, Process: "ipaddressonly-1#0", Kind: Allocate, Addr: addrA, Owner: "i", Call: 0, Return: 10, Outcome: OK},
				{Client: 0, Process: "ipaddressonly-1#0", Kind: Release, Addr: addrA, Call: 20, Return: 30, Outcome: OK},
				{Client: 1, Process: "dualwrite-0#0", Kind: AllocateNext, Addr: addrB, Owner: "d", Call: 15, Return: 60, Outcome: OK, Bitmap: true},
				{Client: 2, Process: "kube-apiserver", Kind: Allocate, Addr: addrA, Owner: "k", Call: 40, Return: 50, Outcome: Refused, Bitmap: true},
			}),
			want: porcupine.Illegal,
		},
		{
			name: "a GiveBack of a bit its holder kept set the whole time: it could not have set it",
			history: WithUndos([]Op{
				{Client: 0, Process: "dualwrite-2#0", Kind: Allocate, Addr: addrA, Owner: "h", Call: 0, Return: 10, Outcome: OK, Bitmap: true},
				{Client: 1, Process: "dualwrite-0#0", Kind: GiveBack, Addr: addrA, Call: 20, Return: 30, Outcome: OK, Bitmap: true},
				{Client: 0, Process: "dualwrite-2#0", Kind: Release, Addr: addrA, Call: 40, Return: 50, Outcome: OK, Bitmap: true},
			}),
			want: porcupine.Illegal,
		},
		{
			name: "a GiveBack does not make an allocation of a held address legal",
			history: WithUndos([]Op{
				{Client: 0, Process: "ipaddressonly-1#0", Kind: Allocate, Addr: addrA, Owner: "i", Call: 0, Return: 10, Outcome: OK},
				{Client: 1, Process: "dualwrite-0#0", Kind: GiveBack, Addr: addrA, Call: 20, Return: 60, Outcome: OK, Bitmap: true},
				{Client: 2, Process: "ipaddressonly-1#1", Kind: Allocate, Addr: addrA, Owner: "j", Call: 30, Return: 40, Outcome: OK},
			}),
			want: porcupine.Illegal,
		},
		{
			name: "a DualWrite AllocateNext kept the bit of an address an IPAddressOnly caller held (KeepBit): once that holder frees it, callers that read the bitmap are refused it and IPAddressOnly callers take it",
			history: WithUndos([]Op{
				{Client: 0, Process: "ipaddressonly-1#0", Kind: Allocate, Addr: addrA, Owner: "i", Call: 0, Return: 10, Outcome: OK},
				{Client: 1, Process: "dualwrite-0#0", Kind: AllocateNext, Addr: addrB, Owner: "d", Call: 5, Return: 30, Outcome: OK, Bitmap: true},
				{Client: 1, Process: "dualwrite-0#0", Kind: KeepBit, Addr: addrA, Call: 5, Return: 30, Outcome: OK, Bitmap: true},
				{Client: 0, Process: "ipaddressonly-1#0", Kind: Release, Addr: addrA, Call: 40, Return: 50, Outcome: OK},
				{Client: 2, Process: "dualwrite-2#0", Kind: Allocate, Addr: addrA, Owner: "d2", Call: 60, Return: 70, Outcome: Refused, Bitmap: true},
				{Client: 0, Process: "ipaddressonly-1#0", Kind: Allocate, Addr: addrA, Owner: "j", Call: 80, Return: 90, Outcome: OK},
				{Client: 0, Process: "ipaddressonly-1#0", Kind: Release, Addr: addrA, Call: 100, Return: 110, Outcome: OK},
				{Client: 2, Process: "dualwrite-2#0", Kind: Allocate, Addr: addrA, Owner: "d3", Call: 120, Return: 130, Outcome: Refused, Bitmap: true},
			}),
			want: porcupine.Ok,
		},
		{
			name: "the same refusals without the KeepBit that explains them",
			history: WithUndos([]Op{
				{Client: 0, Process: "ipaddressonly-1#0", Kind: Allocate, Addr: addrA, Owner: "i", Call: 0, Return: 10, Outcome: OK},
				{Client: 1, Process: "dualwrite-0#0", Kind: AllocateNext, Addr: addrB, Owner: "d", Call: 5, Return: 30, Outcome: OK, Bitmap: true},
				{Client: 0, Process: "ipaddressonly-1#0", Kind: Release, Addr: addrA, Call: 40, Return: 50, Outcome: OK},
				{Client: 2, Process: "dualwrite-2#0", Kind: Allocate, Addr: addrA, Owner: "d2", Call: 60, Return: 70, Outcome: Refused, Bitmap: true},
				{Client: 0, Process: "ipaddressonly-1#0", Kind: Allocate, Addr: addrA, Owner: "j", Call: 80, Return: 90, Outcome: OK},
				{Client: 0, Process: "ipaddressonly-1#0", Kind: Release, Addr: addrA, Call: 100, Return: 110, Outcome: OK},
				{Client: 2, Process: "dualwrite-2#0", Kind: Allocate, Addr: addrA, Owner: "d3", Call: 120, Return: 130, Outcome: Refused, Bitmap: true},
			}),
			want: porcupine.Illegal,
		},
		{
			name: "a kept bit is cleared by a Release that reads the bitmap, and the address is free again for its callers",
			history: WithUndos([]Op{
				{Client: 1, Process: "dualwrite-0#0", Kind: AllocateNext, Addr: addrB, Owner: "d", Call: 0, Return: 10, Outcome: OK, Bitmap: true},
				{Client: 1, Process: "dualwrite-0#0", Kind: KeepBit, Addr: addrA, Call: 0, Return: 10, Outcome: OK, Bitmap: true},
				{Client: 2, Process: "kube-apiserver", Kind: Release, Addr: addrA, Call: 20, Return: 30, Outcome: OK, Bitmap: true},
				{Client: 3, Process: "legacy-0#0", Kind: Allocate, Addr: addrA, Owner: "l", Call: 40, Return: 50, Outcome: OK, Bitmap: true},
			}),
			want: porcupine.Ok,
		},
		{
			name: "a KeepBit of a bit its holder kept set the whole time: it could not have set it",
			history: WithUndos([]Op{
				{Client: 0, Process: "dualwrite-2#0", Kind: Allocate, Addr: addrA, Owner: "h", Call: 0, Return: 10, Outcome: OK, Bitmap: true},
				{Client: 1, Process: "dualwrite-0#0", Kind: KeepBit, Addr: addrA, Call: 20, Return: 30, Outcome: OK, Bitmap: true},
				{Client: 0, Process: "dualwrite-2#0", Kind: Release, Addr: addrA, Call: 40, Return: 50, Outcome: OK, Bitmap: true},
			}),
			want: porcupine.Illegal,
		},
		{
			name: "a KeepBit does not make an allocation of a held address legal",
			history: WithUndos([]Op{
				{Client: 0, Process: "ipaddressonly-1#0", Kind: Allocate, Addr: addrA, Owner: "i", Call: 0, Return: 10, Outcome: OK},
				{Client: 1, Process: "dualwrite-0#0", Kind: KeepBit, Addr: addrA, Call: 20, Return: 60, Outcome: OK, Bitmap: true},
				{Client: 2, Process: "ipaddressonly-1#1", Kind: Allocate, Addr: addrA, Owner: "j", Call: 30, Return: 40, Outcome: OK},
			}),
			want: porcupine.Illegal,
		},
		{
			name:    "an IPAddressOnly caller takes and frees the address between a dual write's bit and its IPAddress object",
			history: WithUndos(bitBeforeObjectHistory),
			want:    porcupine.Ok,
		},
		{
			name: "an IPAddressOnly caller holds the IPAddress object throughout a dual write that succeeds",
			history: func() []Op {
				h := append([]Op(nil), bitBeforeObjectHistory...)
				h[3].Call, h[3].Return = 110, 120 // the release comes after the dual write returned
				return WithUndos(h)
			}(),
			want: porcupine.Illegal,
		},
		{
			name: "a dual write whose answer was lost sets its bit, and creates its object after an IPAddressOnly caller's release",
			history: func() []Op {
				h := append([]Op(nil), bitBeforeObjectHistory...)
				h[0].Outcome, h[0].Return, h[0].Err = Unknown, 200, "context deadline exceeded"
				h = append(h, Op{Client: 3, Process: "ipaddressonly-1#0", Kind: Allocate, Addr: addrA, Owner: "i2", Call: 110, Return: 120, Outcome: Refused})
				return WithUndos(h)
			}(),
			want: porcupine.Ok,
		},
		{
			name: "a dual write checked in one step cannot have its bit seen before an IPAddressOnly caller takes the address",
			history: func() []Op {
				h := append([]Op(nil), bitBeforeObjectHistory...)
				h[0].SetsBitFirst = false
				return WithUndos(h)
			}(),
			want: porcupine.Illegal,
		},
		{
			name:    "a DualWrite release deletes the IPAddress object before it clears the bit",
			history: WithUndos(releaseObjectFirstHistory),
			want:    porcupine.Ok,
		},
		{
			name: "a DualWrite release that returned leaves no bit",
			history: WithUndos([]Op{
				{Client: 0, Process: "dualwrite-0#0", Kind: Allocate, Addr: addrA, Owner: "d", Call: 0, Return: 10, Outcome: OK, Bitmap: true, LeavesBit: true, ClearsBitLast: true},
				{Client: 0, Process: "dualwrite-0#0", Kind: Release, Addr: addrA, Call: 20, Return: 60, Outcome: OK, Bitmap: true, LeavesBit: true, ClearsBitLast: true},
				{Client: 1, Process: "dualwrite-2#0", Kind: Allocate, Addr: addrA, Owner: "d2", Call: 70, Return: 80, Outcome: Refused, Bitmap: true, LeavesBit: true, ClearsBitLast: true},
			}),
			want: porcupine.Illegal,
		},
		{
			name:    "kube-apiserver's repair deletes the IPAddress object of a lost Service create a minute on, and the bit stays",
			history: repairedLostCreateHistory,
			want:    porcupine.Ok,
		},
		{
			name: "kube-apiserver's repair leaves a lost Service create's IPAddress object alone for a minute",
			history: func() []Op {
				h := append([]Op(nil), repairedLostCreateHistory...)
				for i := range h {
					if i > 0 { // the Service create stays; what follows comes 40 s sooner
						h[i].Call -= 40_000 * ms
						h[i].Return -= 40_000 * ms
					}
				}
				return h
			}(),
			want: porcupine.Illegal,
		},
		{
			name: "kube-apiserver's repair never frees the address of a Service that was created",
			history: func() []Op {
				h := append([]Op(nil), repairedLostCreateHistory...)
				h[0].Outcome, h[0].Return, h[0].Err = OK, 6_935*ms, ""
				return h
			}(),
			want: porcupine.Illegal,
		},
		{
			name:    "a DualWrite create whose answer was lost finds another owner's IPAddress object, and keeps its bit",
			history: WithUndos(keptBitHistory),
			want:    porcupine.Ok,
		},
		{
			name:    "a kube-apiserver create refused while a Service holds the address leaves no bit behind the Service's release",
			history: WithUndos(undoneReleaseHistory),
			want:    porcupine.Illegal,
		},
		{
			name: "a kube-apiserver create whose answer was lost may land after the Service's release and leave its bit",
			history: func() []Op {
				h := append([]Op(nil), undoneReleaseHistory...)
				h[1].Outcome, h[1].Return, h[1].Err = Unknown, 200, "context deadline exceeded"
				return WithUndos(h)
			}(),
			want: porcupine.Ok,
		},
		{
			name: "a DualWrite create that kept its bit while a Service held the address leaves no bit behind the Service's release",
			history: func() []Op {
				h := append([]Op(nil), undoneReleaseHistory...)
				h[1].Process, h[1].Owner = "dualwrite-0#0", "dualwrite-0-0-3-7"
				h[1].RepairFrees, h[1].ClearsBitLast = false, true
				h[1].Err = "clusterip: 10.96.0.20: its IPAddress belongs to another owner (after …): allocator: address already allocated"
				return WithUndos(h)
			}(),
			want: porcupine.Illegal,
		},
		{
			name:    "a kube-apiserver create refused while the Service holding the address is being deleted leaves its bit behind the release",
			history: WithUndos(racingReleaseHistory),
			want:    porcupine.Ok,
		},
		{
			name: "a kube-apiserver create refused after the Service holding the address was deleted",
			history: func() []Op {
				h := append([]Op(nil), racingReleaseHistory...)
				h[2].Call, h[2].Return = 41, 45 // after the release returned
				return WithUndos(h)
			}(),
			want: porcupine.Illegal,
		},
		{
			name: "a kube-apiserver release has deleted the IPAddress object by the time it returns",
			history: WithUndos([]Op{
				racingReleaseHistory[0],
				racingReleaseHistory[1],
				{Client: 3, Process: "ipaddressonly-1#0", Kind: Allocate, Addr: addrA, Owner: "i", Call: 50, Return: 60, Outcome: Refused},
			}),
			want: porcupine.Illegal,
		},
		{
			name:    "a kube-apiserver create refused while an IPAddressOnly process holds the address leaves its bit behind that release",
			history: WithUndos(leftBitHistory),
			want:    porcupine.Ok,
		},
		{
			name: "a refusal as full with no range, in a history that names no address",
			history: []Op{
				{Client: 0, Kind: AllocateNext, Owner: "a", Call: 0, Return: 10, Outcome: Refused},
			},
			want: porcupine.Ok,
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

// TestCheckerRejectsTwoOwnersAndDrawsTheTimeline feeds the checker a history in which two
// callers were both told they hold one address, and checks that it is rejected and that the
// timeline of the failure is written.
func TestCheckerRejectsTwoOwnersAndDrawsTheTimeline(t *testing.T) {
	history := []Op{
		{Client: 0, Process: "legacy-0#0", Kind: Allocate, Addr: addrA, Owner: "legacy-0/1", Call: 0, Return: 100, Outcome: OK},
		{Client: 1, Process: "dualwrite-1#0", Kind: AllocateNext, Addr: addrA, Owner: "dualwrite-1/7", Call: 50, Return: 150, Outcome: OK},
		{Client: 2, Process: "kube-apiserver", Kind: Allocate, Addr: addrB, Owner: "svc/default/s1", Call: 0, Return: 40, Outcome: OK},
	}
	html := filepath.Join(t.TempDir(), "two-owners.html")
	res, err := Check(history, 0, html)
	if err != nil {
		t.Fatal(err)
	}
	if res.Verdict != porcupine.Illegal {
		t.Fatalf("Check() = %v, want %v", res.Verdict, porcupine.Illegal)
	}
	if res.HTML != html {
		t.Errorf("Check().HTML = %q, want %q", res.HTML, html)
	}
	data, err := os.ReadFile(html)
	if err != nil {
		t.Fatalf("the timeline was not written: %v", err)
	}
	if !strings.Contains(string(data), "dualwrite-1#0") {
		t.Errorf("the timeline at %s does not show the second owner's operation", html)
	}
	t.Logf("timeline of the rejected history: %s (%d bytes)", html, len(data))
	if res.Ops != 3 || res.Addresses != 2 {
		t.Errorf("Check() counted %d operations on %d addresses, want 3 on 2", res.Ops, res.Addresses)
	}
}

// leftBitHistory is an IPAddressOnly process holding an address while kube-apiserver, in dual
// write, is refused it and leaves its bit set: after the release, callers that read the bitmap
// are refused the address and IPAddressOnly callers get it.
var leftBitHistory = []Op{
	{Client: 0, Process: "ipaddressonly-1#0", Kind: Allocate, Addr: addrA, Owner: "a", Call: 0, Return: 10, Outcome: OK},
	{Client: 1, Process: "kube-apiserver", Kind: Allocate, Addr: addrA, Owner: "s", Call: 20, Return: 30, Outcome: Refused, Bitmap: true, LeavesBit: true, RefusalLeavesBit: true, ClearsBitFirst: true},
	{Client: 0, Process: "ipaddressonly-1#0", Kind: Release, Addr: addrA, Call: 40, Return: 50, Outcome: OK},
	{Client: 2, Process: "dualwrite-0#0", Kind: Allocate, Addr: addrA, Owner: "d", Call: 60, Return: 70, Outcome: Refused, Bitmap: true},
	{Client: 0, Process: "ipaddressonly-1#0", Kind: Allocate, Addr: addrA, Owner: "b", Call: 80, Return: 90, Outcome: OK},
	{Client: 1, Process: "kube-apiserver", Kind: Allocate, Addr: addrA, Owner: "s2", Call: 100, Return: 110, Outcome: Refused, Bitmap: true, LeavesBit: true, RefusalLeavesBit: true, ClearsBitFirst: true},
}

// undoneReleaseHistory is a Service holding an address while kube-apiserver refuses another
// create of it, which finds the Service's bit set and writes nothing, then the Service's delete,
// after which callers that read the bitmap are refused the address: the release was undone in
// the bitmap, since no bit is left for anyone.
var undoneReleaseHistory = []Op{
	{Client: 0, Process: "kube-apiserver", Kind: Allocate, Addr: addrA, Owner: "default/h-0-1", Call: 0, Return: 10, Outcome: OK, Bitmap: true, LeavesBit: true, RefusalLeavesBit: true, ClearsBitFirst: true, RepairFrees: true},
	{Client: 1, Process: "kube-apiserver", Kind: Allocate, Addr: addrA, Owner: "default/h-1-1", Call: 20, Return: 30, Outcome: Refused, Bitmap: true, LeavesBit: true, RefusalLeavesBit: true, ClearsBitFirst: true, RepairFrees: true,
		Err: `Service "h-1-1" is invalid: spec.clusterIPs: Invalid value: []string{"10.96.0.20"}: failed to allocate IP 10.96.0.20: provided IP is already allocated`},
	{Client: 0, Process: "kube-apiserver", Kind: Release, Addr: addrA, Call: 40, Return: 50, Outcome: OK, Bitmap: true, LeavesBit: true, RefusalLeavesBit: true, ClearsBitFirst: true, RepairFrees: true},
	{Client: 2, Process: "legacy-0#0", Kind: Allocate, Addr: addrA, Owner: "legacy-0-0-2-9", Call: 60, Return: 70, Outcome: Refused, Bitmap: true},
	{Client: 3, Process: "dualwrite-1#0", Kind: Allocate, Addr: addrA, Owner: "dualwrite-1-0-3-4", Call: 80, Return: 90, Outcome: Refused, Bitmap: true, LeavesBit: true, ClearsBitLast: true,
		Err: "clusterip: 10.96.0.20 is set in the bitmap of 10.96.0.0/25: allocator: address already allocated"},
}

// racingReleaseHistory is kube-apiserver creating a Service for an address while deleting the
// Service that holds it: the create sets the bit the delete has just cleared, then fails on the
// IPAddress object the delete has not removed yet, and leaves the bit for good.
var racingReleaseHistory = []Op{
	{Client: 0, Process: "kube-apiserver", Kind: Allocate, Addr: addrA, Owner: "s1", Call: 0, Return: 10, Outcome: OK, Bitmap: true, LeavesBit: true, RefusalLeavesBit: true, ClearsBitFirst: true},
	{Client: 0, Process: "kube-apiserver", Kind: Release, Addr: addrA, Call: 20, Return: 40, Bitmap: true, Outcome: OK, LeavesBit: true, RefusalLeavesBit: true, ClearsBitFirst: true},
	{Client: 1, Process: "kube-apiserver", Kind: Allocate, Addr: addrA, Owner: "s2", Call: 25, Return: 45, Outcome: Refused, Bitmap: true, LeavesBit: true, RefusalLeavesBit: true, ClearsBitFirst: true},
	{Client: 2, Process: "legacy-0#0", Kind: Allocate, Addr: addrA, Owner: "l", Call: 50, Return: 60, Outcome: Refused, Bitmap: true},
	{Client: 2, Process: "legacy-0#0", Kind: Allocate, Addr: addrA, Owner: "l2", Call: 70, Return: 80, Outcome: Refused, Bitmap: true},
}

// releaseObjectFirstHistory is from a 100 s history of the finish window (10.96.0.2, times in
// ms): a DualWrite release, slowed by conflicts on the bitmap, deletes the IPAddress object, and
// an IPAddressOnly process takes and frees the address before the release clears the bit, which
// meanwhile refuses the address to kube-apiserver and to another DualWrite process.
// bitBeforeObjectHistory is a DualWrite Allocate (Op.SetsBitFirst) that sets the bit early
// in its interval and creates the IPAddress object late: kube-apiserver, which reads the bitmap,
// is refused the address in between, while an IPAddressOnly caller takes it and frees it again.
// CI saw this in a finish history, with the DualWrite Allocate taking 3 s.
var bitBeforeObjectHistory = []Op{
	{Client: 0, Process: "dualwrite-0#0", Kind: Allocate, Addr: addrA, Owner: "d", Call: 0, Return: 100, Outcome: OK, Bitmap: true, LeavesBit: true, ClearsBitLast: true, SetsBitFirst: true},
	{Client: 1, Process: "kube-apiserver", Kind: Allocate, Addr: addrA, Owner: "k", Call: 10, Return: 20, Outcome: Refused, Bitmap: true, LeavesBit: true, ClearsBitFirst: true, SetsBitFirst: true},
	{Client: 2, Process: "ipaddressonly-1#0", Kind: Allocate, Addr: addrA, Owner: "i", Call: 30, Return: 40, Outcome: OK},
	{Client: 2, Process: "ipaddressonly-1#0", Kind: Release, Addr: addrA, Call: 50, Return: 60, Outcome: OK},
}

var releaseObjectFirstHistory = []Op{
	{Client: 1, Process: "dualwrite-0#0", Kind: Allocate, Addr: addrA, Owner: "dualwrite-0-0-1-33", Call: 1308, Return: 1312, Outcome: OK, Bitmap: true, LeavesBit: true, ClearsBitLast: true},
	{Client: 1, Process: "dualwrite-0#0", Kind: Release, Addr: addrA, Call: 3632, Return: 4318, Outcome: OK, Bitmap: true, LeavesBit: true, ClearsBitLast: true},
	{Client: 4, Process: "ipaddressonly-1#0", Kind: Allocate, Addr: addrA, Owner: "ipaddressonly-1-0-4-157", Call: 3749, Return: 3757, Outcome: OK},
	{Client: 3, Process: "ipaddressonly-1#0", Kind: Allocate, Addr: addrA, Owner: "ipaddressonly-1-0-3-163", Call: 3821, Return: 3823, Outcome: Refused},
	{Client: 4, Process: "ipaddressonly-1#0", Kind: Release, Addr: addrA, Call: 3931, Return: 3940, Outcome: OK},
	{Client: 8, Process: "kube-apiserver", Kind: Allocate, Addr: addrA, Owner: "default/h-8-90", Call: 4069, Return: 4071, Outcome: Refused, Bitmap: true, LeavesBit: true, RefusalLeavesBit: true, ClearsBitFirst: true, RepairFrees: true},
	{Client: 6, Process: "dualwrite-2#0", Kind: Allocate, Addr: addrA, Owner: "dualwrite-2-0-6-165", Call: 4259, Return: 4260, Outcome: Refused, Bitmap: true, LeavesBit: true, ClearsBitLast: true},
	{Client: 7, Process: "kube-apiserver", Kind: Allocate, Addr: addrA, Owner: "default/h-7-86", Call: 4296, Return: 4301, Outcome: Refused, Bitmap: true, LeavesBit: true, RefusalLeavesBit: true, ClearsBitFirst: true, RepairFrees: true},
	{Client: 5, Process: "dualwrite-2#0", Kind: Allocate, Addr: addrA, Owner: "dualwrite-2-0-5-191", Call: 4803, Return: 4816, Outcome: OK, Bitmap: true, LeavesBit: true, ClearsBitLast: true},
	{Client: 5, Process: "dualwrite-2#0", Kind: Release, Addr: addrA, Call: 4828, Return: 4838, Outcome: OK, Bitmap: true, LeavesBit: true, ClearsBitLast: true},
}

// keptBitHistory is from a 100 s history of the finish window (10.96.0.6, times in ms): a
// DualWrite Allocate sets the bit, its IPAddress create loses its answer in a partition, and the
// read that follows finds the object held by an IPAddressOnly process. It answers ErrAllocated
// and keeps the bit, since its create may still land (dualwrite.go settle, outcomeOthers): from
// then on callers that read the bitmap are refused the address, and IPAddressOnly callers get it.
var keptBitHistory = []Op{
	{Client: 6, Process: "dualwrite-2#0", Kind: Allocate, Addr: addrA, Owner: "dualwrite-2-0-6-227", Call: 6958, Return: 10130, Outcome: Refused, Bitmap: true, LeavesBit: true, ClearsBitLast: true, RefusalLeavesBit: true,
		Err: "clusterip: 10.96.0.6: its IPAddress belongs to another owner (after ipaddress: create IPAddress 10.96.0.6: Post …: context deadline exceeded): allocator: address already allocated"},
	{Client: 10, Process: "ipaddressonly-1#1", Kind: Allocate, Addr: addrA, Owner: "ipaddressonly-1-1-10-55", Call: 9800, Return: 9803, Outcome: OK},
	{Client: 10, Process: "ipaddressonly-1#1", Kind: Release, Addr: addrA, Call: 9808, Return: 9811, Outcome: OK},
	{Client: 10, Process: "ipaddressonly-1#1", Kind: Allocate, Addr: addrA, Owner: "ipaddressonly-1-1-10-63", Call: 9949, Return: 9953, Outcome: OK},
	{Client: 10, Process: "ipaddressonly-1#1", Kind: Release, Addr: addrA, Call: 10152, Return: 10164, Outcome: OK},
	{Client: 6, Process: "dualwrite-2#0", Kind: Allocate, Addr: addrA, Owner: "dualwrite-2-0-6-241", Call: 10604, Return: 10605, Outcome: Refused, Bitmap: true, LeavesBit: true, ClearsBitLast: true},
	{Client: 7, Process: "kube-apiserver", Kind: Allocate, Addr: addrA, Owner: "default/h-7-160", Call: 11025, Return: 11036, Outcome: Refused, Bitmap: true, LeavesBit: true, RefusalLeavesBit: true, ClearsBitFirst: true, RepairFrees: true},
	{Client: 10, Process: "ipaddressonly-1#1", Kind: Allocate, Addr: addrA, Owner: "ipaddressonly-1-1-10-117", Call: 11242, Return: 11245, Outcome: OK},
}

// ms is a millisecond in the nanoseconds of Op.Call and Op.Return.
const ms = int64(time.Millisecond)

// repairedLostCreateHistory is from a 100 s history of the finish window (10.96.0.4): a Service
// create through kube-apiserver loses its answer when kube-apiserver is killed, after it set the
// bit and created the IPAddress object but before it stored the Service. Every caller is refused
// the address until kube-apiserver's repair loop deletes the object, 60 s after it was created;
// then IPAddressOnly callers get it, and callers that read the bitmap are still refused.
var repairedLostCreateHistory = []Op{
	{Client: 7, Process: "kube-apiserver", Kind: Allocate, Addr: addrA, Owner: "default/h-7-156", Call: 6_928 * ms, Return: 103_717 * ms, Outcome: Unknown, Bitmap: true, LeavesBit: true, RefusalLeavesBit: true, ClearsBitFirst: true, RepairFrees: true},
	{Client: 11, Process: "dualwrite-2#1", Kind: Allocate, Addr: addrA, Owner: "dualwrite-2-1-11-681", Call: 52_084 * ms, Return: 52_085 * ms, Outcome: Refused, Bitmap: true, LeavesBit: true, ClearsBitLast: true},
	{Client: 9, Process: "ipaddressonly-1#1", Kind: Allocate, Addr: addrA, Owner: "ipaddressonly-1-1-9-1783", Call: 52_092 * ms, Return: 52_096 * ms, Outcome: Refused},
	{Client: 8, Process: "kube-apiserver", Kind: Allocate, Addr: addrA, Owner: "default/h-8-1081", Call: 52_485 * ms, Return: 52_489 * ms, Outcome: Refused, Bitmap: true, LeavesBit: true, RefusalLeavesBit: true, ClearsBitFirst: true, RepairFrees: true},
	{Client: 10, Process: "ipaddressonly-1#1", Kind: Allocate, Addr: addrA, Owner: "ipaddressonly-1-1-10-2390", Call: 66_525 * ms, Return: 66_528 * ms, Outcome: OK},
	{Client: 10, Process: "ipaddressonly-1#1", Kind: Release, Addr: addrA, Call: 66_633 * ms, Return: 66_636 * ms, Outcome: OK},
	{Client: 14, Process: "dualwrite-0#1", Kind: Allocate, Addr: addrA, Owner: "dualwrite-0-1-14-125", Call: 66_642 * ms, Return: 66_644 * ms, Outcome: Refused, Bitmap: true, LeavesBit: true, ClearsBitLast: true},
	{Client: 8, Process: "kube-apiserver", Kind: Allocate, Addr: addrA, Owner: "default/h-8-1385", Call: 66_653 * ms, Return: 66_655 * ms, Outcome: Refused, Bitmap: true, LeavesBit: true, RefusalLeavesBit: true, ClearsBitFirst: true, RepairFrees: true},
	{Client: 10, Process: "ipaddressonly-1#1", Kind: Allocate, Addr: addrA, Owner: "ipaddressonly-1-1-10-2447", Call: 67_565 * ms, Return: 67_569 * ms, Outcome: OK},
}

func TestStrictModelRejectsALeftBit(t *testing.T) {
	if got := IllegalAddresses(StrictModel, leftBitHistory, 0); len(got) != 1 || got[0] != addrA {
		t.Errorf("IllegalAddresses(StrictModel, leftBitHistory) = %v, want [%v]", got, addrA)
	}
	racing := WithUndos(racingReleaseHistory)
	if !Linearizable(Model, racing) || Linearizable(StrictModel, racing) {
		t.Errorf("racingReleaseHistory: linearizable under Model %v, under StrictModel %v; want true, false",
			Linearizable(Model, racing), Linearizable(StrictModel, racing))
	}
	if !Linearizable(Model, leftBitHistory) {
		t.Errorf("Linearizable(Model, leftBitHistory) = false, want true")
	}
	if Linearizable(StrictModel, leftBitHistory) {
		t.Errorf("Linearizable(StrictModel, leftBitHistory) = true, want false")
	}
}

func TestStepKeepsEveryPossibleHolder(t *testing.T) {
	ok, s := step(free, Op{Kind: Allocate, Owner: "a", Outcome: Unknown}, true)
	if !ok || s != stateOf([]string{free, "a"}) {
		t.Fatalf("step(free, unknown Allocate by a) = %v, %q; want true, {free, a}", ok, s)
	}
	ok, s = step(s, Op{Kind: Allocate, Owner: "b", Outcome: OK}, true)
	if !ok || s != "b" {
		t.Errorf("step({free, a}, Allocate by b ok) = %v, %q; want true, %q", ok, s, "b")
	}
	if ok, _ := step("b", Op{Kind: Allocate, Owner: "c", Outcome: OK}, true); ok {
		t.Errorf("step(b, Allocate by c ok) = true, want false")
	}
}

// TestManyLostAllocateNextsCheckQuickly checks a history with a hundred AllocateNexts whose
// answers were lost, each in every address's part: merged, they cost one operation each part.
func TestManyLostAllocateNextsCheckQuickly(t *testing.T) {
	var history []Op
	for i := range 100 {
		history = append(history, Op{Client: i, Kind: AllocateNext, Owner: fmt.Sprintf("lost-%d", i),
			Call: int64(i * 10), Return: 10_000, Outcome: Unknown, Bitmap: true, LeavesBit: true})
	}
	for i := range 50 {
		c := int64(2000 + i*40)
		history = append(history,
			Op{Client: 100, Kind: Allocate, Addr: addrA, Owner: fmt.Sprintf("a-%d", i), Call: c, Return: c + 10, Outcome: OK, Bitmap: true},
			Op{Client: 100, Kind: Release, Addr: addrA, Call: c + 20, Return: c + 30, Outcome: OK, Bitmap: true})
	}
	res, err := Check(history, 10*time.Second, filepath.Join(t.TempDir(), "history.html"))
	if err != nil {
		t.Fatal(err)
	}
	if res.Verdict != porcupine.Ok {
		t.Errorf("Check() = %v after %v, want %v", res.Verdict, res.Elapsed, porcupine.Ok)
	}
}

// TestCheckerVerdictsOnReservations is the specification of reservations in the model: a
// reserved address is never held by a Service other than the one it is kept for (an anonymous
// one by no Service), and a Service created while its reservation exists gets that address.
func TestCheckerVerdictsOnReservations(t *testing.T) {
	const proc = "ipaddressonly-1#0"
	forWeb, anon := ReservedFor("web"), ReservedAnonymously("block-a")
	tests := []struct {
		name    string
		history []Op
		want    porcupine.CheckResult
	}{
		{
			name: "a dynamic create lands on a reserved address",
			history: []Op{
				{Client: 0, Process: proc, Kind: Reserve, Addr: addrA, Owner: anon, Call: 0, Return: 10, Outcome: OK},
				{Client: 1, Process: proc, Kind: AllocateNext, Addr: addrA, Owner: "x", Call: 20, Return: 30, Outcome: OK},
			},
			want: porcupine.Illegal,
		},
		{
			name: "a dynamic create of kube-apiserver lands on an address reserved for a Service",
			history: []Op{
				{Client: 0, Process: proc, Kind: Reserve, Addr: addrA, Owner: forWeb, Call: 0, Return: 10, Outcome: OK},
				{Client: 1, Process: "kube-apiserver", Kind: AllocateNext, Addr: addrA, Owner: "default/h-1-1", Call: 20, Return: 30, Outcome: OK,
					Bitmap: true, LeavesBit: true, RefusalLeavesBit: true, ClearsBitFirst: true, RepairFrees: true, FallsBackToObjects: true},
			},
			want: porcupine.Illegal,
		},
		{
			name: "a reservation keeps dynamic creates off its address until it is released",
			history: []Op{
				{Client: 0, Process: proc, Kind: Reserve, Addr: addrA, Owner: anon, Call: 0, Return: 10, Outcome: OK},
				{Client: 1, Process: proc, Kind: AllocateNext, Addr: addrB, Owner: "x", Call: 20, Return: 30, Outcome: OK},
				{Client: 1, Process: proc, Kind: Allocate, Addr: addrA, Owner: "y", Call: 40, Return: 50, Outcome: Refused},
				{Client: 0, Process: proc, Kind: Unreserve, Addr: addrA, Call: 60, Return: 70, Outcome: OK},
				{Client: 1, Process: proc, Kind: AllocateNext, Addr: addrA, Owner: "z", Call: 80, Return: 90, Outcome: OK},
			},
			want: porcupine.Ok,
		},
		{
			name: "a kube-apiserver create of a reserved address is refused and leaves its bit",
			history: WithUndos([]Op{
				{Client: 0, Process: proc, Kind: Reserve, Addr: addrA, Owner: anon, Call: 0, Return: 10, Outcome: OK},
				leftBitHistory[1],
				{Client: 0, Process: proc, Kind: Unreserve, Addr: addrA, Call: 40, Return: 50, Outcome: OK},
				{Client: 2, Process: "dualwrite-0#0", Kind: Allocate, Addr: addrA, Owner: "d", Call: 60, Return: 70, Outcome: Refused, Bitmap: true},
				{Client: 0, Process: proc, Kind: Allocate, Addr: addrA, Owner: "b", Call: 80, Return: 90, Outcome: OK},
			}),
			want: porcupine.Ok,
		},
		{
			name: "a Reserve of an address a Service holds is refused",
			history: []Op{
				{Client: 0, Process: proc, Kind: Allocate, Addr: addrA, Owner: "x", Call: 0, Return: 10, Outcome: OK},
				{Client: 1, Process: proc, Kind: Reserve, Addr: addrA, Owner: forWeb, Call: 20, Return: 30, Outcome: Refused},
			},
			want: porcupine.Ok,
		},
		{
			name: "a Reserve of an address a Service holds succeeds",
			history: []Op{
				{Client: 0, Process: proc, Kind: Allocate, Addr: addrA, Owner: "x", Call: 0, Return: 10, Outcome: OK},
				{Client: 1, Process: proc, Kind: Reserve, Addr: addrA, Owner: forWeb, Call: 20, Return: 30, Outcome: OK},
			},
			want: porcupine.Illegal,
		},
		{
			name: "a Reserve refused where nobody holds the address",
			history: []Op{
				{Client: 1, Process: proc, Kind: Reserve, Addr: addrA, Owner: forWeb, Call: 20, Return: 30, Outcome: Refused},
			},
			want: porcupine.Illegal,
		},
		{
			name: "an Unreserve frees the address of a Service",
			history: []Op{
				{Client: 0, Process: proc, Kind: Allocate, Addr: addrA, Owner: "x", Call: 0, Return: 10, Outcome: OK},
				{Client: 1, Process: proc, Kind: Unreserve, Addr: addrA, Call: 20, Return: 30, Outcome: OK},
				{Client: 1, Process: proc, Kind: Allocate, Addr: addrA, Owner: "y", Call: 40, Return: 50, Outcome: OK},
			},
			want: porcupine.Illegal,
		},
		{
			name: "an Unreserve where nothing is held is OK and changes nothing",
			history: []Op{
				{Client: 1, Process: proc, Kind: Unreserve, Addr: addrA, Call: 20, Return: 30, Outcome: OK},
				{Client: 1, Process: proc, Kind: Allocate, Addr: addrA, Owner: "y", Call: 40, Return: 50, Outcome: OK},
			},
			want: porcupine.Ok,
		},
		{
			name: "a Service named in a reservation gets the reserved address",
			history: []Op{
				{Client: 0, Process: proc, Kind: Reserve, Addr: addrA, Owner: forWeb, Call: 0, Return: 10, Outcome: OK},
				{Client: 0, Process: proc, Kind: Claim, Addr: addrA, Owner: "web", Call: 20, Return: 30, Outcome: OK},
				{Client: 1, Process: proc, Kind: Unreserve, Addr: addrA, Call: 40, Return: 50, Outcome: Refused},
				{Client: 0, Process: proc, Kind: Release, Addr: addrA, Call: 60, Return: 70, Outcome: OK},
			},
			want: porcupine.Ok,
		},
		{
			name: "a Service named in a reservation gets another address while its reservation exists",
			history: []Op{
				{Client: 0, Process: proc, Kind: Reserve, Addr: addrA, Owner: forWeb, Call: 0, Return: 10, Outcome: OK},
				{Client: 0, Process: proc, Kind: Claim, Addr: addrB, Owner: "web", Call: 20, Return: 30, Outcome: OK},
			},
			want: porcupine.Illegal,
		},
		{
			name: "a Service created before its reservation gets another address",
			history: []Op{
				{Client: 0, Process: proc, Kind: Claim, Addr: addrB, Owner: "web", Call: 0, Return: 25, Outcome: OK},
				{Client: 1, Process: proc, Kind: Reserve, Addr: addrA, Owner: forWeb, Call: 20, Return: 30, Outcome: OK},
			},
			want: porcupine.Ok,
		},
		{
			name: "a Service created after its reservation was released gets another address",
			history: []Op{
				{Client: 0, Process: proc, Kind: Reserve, Addr: addrA, Owner: forWeb, Call: 0, Return: 10, Outcome: OK},
				{Client: 0, Process: proc, Kind: Unreserve, Addr: addrA, Call: 20, Return: 30, Outcome: OK},
				{Client: 0, Process: proc, Kind: Claim, Addr: addrB, Owner: "web", Call: 40, Return: 50, Outcome: OK},
			},
			want: porcupine.Ok,
		},
		{
			name: "an address reserved for one Service is claimed by another",
			history: []Op{
				{Client: 0, Process: proc, Kind: Reserve, Addr: addrA, Owner: forWeb, Call: 0, Return: 10, Outcome: OK},
				{Client: 1, Process: proc, Kind: Claim, Addr: addrA, Owner: "db", Call: 20, Return: 30, Outcome: OK},
			},
			want: porcupine.Illegal,
		},
		{
			name: "an anonymous reservation is claimed by a Service",
			history: []Op{
				{Client: 0, Process: proc, Kind: Reserve, Addr: addrA, Owner: ReservedAnonymously("web"), Call: 0, Return: 10, Outcome: OK},
				{Client: 1, Process: proc, Kind: Claim, Addr: addrA, Owner: "web", Call: 20, Return: 30, Outcome: OK},
			},
			want: porcupine.Illegal,
		},
		{
			name: "a Claim whose answer was lost may have taken its reservation",
			history: []Op{
				{Client: 0, Process: proc, Kind: Reserve, Addr: addrA, Owner: forWeb, Call: 0, Return: 10, Outcome: OK},
				{Client: 0, Process: proc, Kind: Claim, Owner: "web", Range: netip.MustParsePrefix(historyRange), Call: 20, Return: 100, Outcome: Unknown},
				{Client: 1, Process: proc, Kind: Unreserve, Addr: addrA, Call: 40, Return: 50, Outcome: Refused},
			},
			want: porcupine.Ok,
		},
		{
			name: "an Unreserve refused while a reservation holds the address",
			history: []Op{
				{Client: 0, Process: proc, Kind: Reserve, Addr: addrA, Owner: forWeb, Call: 0, Return: 10, Outcome: OK},
				{Client: 1, Process: proc, Kind: Unreserve, Addr: addrA, Call: 40, Return: 50, Outcome: Refused},
			},
			want: porcupine.Illegal,
		},
		{
			name: "a Claim whose answer was lost may have taken a free address",
			history: []Op{
				{Client: 0, Process: proc, Kind: Claim, Owner: "web", Range: netip.MustParsePrefix(historyRange), Call: 20, Return: 100, Outcome: Unknown},
				{Client: 1, Process: proc, Kind: Allocate, Addr: addrB, Owner: "x", Call: 40, Return: 50, Outcome: Refused},
			},
			want: porcupine.Ok,
		},
		{
			name: "a Service deleted with Retain keeps its address for its return",
			history: []Op{
				{Client: 0, Process: proc, Kind: Claim, Addr: addrA, Owner: "web", Call: 0, Return: 10, Outcome: OK},
				{Client: 0, Process: proc, Kind: Release, Addr: addrA, Owner: "web", Retains: true, Call: 20, Return: 30, Outcome: OK},
				{Client: 1, Process: proc, Kind: Allocate, Addr: addrA, Owner: "x", Call: 40, Return: 50, Outcome: Refused},
				{Client: 0, Process: proc, Kind: Claim, Addr: addrA, Owner: "web", Call: 60, Return: 70, Outcome: OK},
			},
			want: porcupine.Ok,
		},
		{
			name: "a Service deleted with Retain comes back at another address",
			history: []Op{
				{Client: 0, Process: proc, Kind: Claim, Addr: addrA, Owner: "web", Call: 0, Return: 10, Outcome: OK},
				{Client: 0, Process: proc, Kind: Release, Addr: addrA, Owner: "web", Retains: true, Call: 20, Return: 30, Outcome: OK},
				{Client: 0, Process: proc, Kind: Claim, Addr: addrB, Owner: "web", Call: 60, Return: 70, Outcome: OK},
			},
			want: porcupine.Illegal,
		},
		{
			name: "the address of a Service deleted with Retain taken by a dynamic create",
			history: []Op{
				{Client: 0, Process: proc, Kind: Claim, Addr: addrA, Owner: "web", Call: 0, Return: 10, Outcome: OK},
				{Client: 0, Process: proc, Kind: Release, Addr: addrA, Owner: "web", Retains: true, Call: 20, Return: 30, Outcome: OK},
				{Client: 1, Process: proc, Kind: AllocateNext, Addr: addrA, Owner: "x", Call: 40, Return: 50, Outcome: OK},
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

// orphanHistory is kube-apiserver v1.33 holding addrA for a Service, then deleting it from
// deleteAt on, cut short (its Release, and so its Delete, unknown): a Legacy caller takes the
// address at legacyAt and frees it, a DualWrite Allocate is refused by the IPAddress object
// (which is left behind, orphaned), and the Legacy caller takes it again.
func orphanHistory(deleteAt, legacyAt int64) []Op {
	const end = 1000
	k := Op{Client: 0, Process: "kube-apiserver", Bitmap: true, LeavesBit: true, RefusalLeavesBit: true, ClearsBitFirst: true, RepairFrees: true, FallsBackToObjects: true, SetsBitFirst: true}
	alloc, rel := k, k
	alloc.Kind, alloc.Addr, alloc.Owner, alloc.Call, alloc.Return, alloc.Outcome = AllocateNext, addrA, "default/s", 0, 10, OK
	rel.Kind, rel.Addr, rel.Call, rel.Return, rel.Outcome = Release, addrA, deleteAt, end, Unknown
	return []Op{alloc, rel,
		{Client: 1, Process: "legacy-0#0", Kind: AllocateNext, Addr: addrA, Owner: "l", Call: legacyAt, Return: legacyAt + 10, Outcome: OK, Bitmap: true},
		{Client: 1, Process: "legacy-0#0", Kind: Release, Addr: addrA, Call: legacyAt + 20, Return: legacyAt + 30, Outcome: OK, Bitmap: true},
		{Client: 2, Process: "dualwrite-1#0", Kind: Allocate, Addr: addrA, Owner: "d", Call: legacyAt + 40, Return: legacyAt + 60, Outcome: Refused, Bitmap: true, LeavesBit: true, TransientBit: true, ClearsBitLast: true, SetsBitFirst: true},
		{Client: 1, Process: "legacy-0#0", Kind: Allocate, Addr: addrA, Owner: "l", Call: legacyAt + 70, Return: legacyAt + 80, Outcome: OK, Bitmap: true},
	}
}
