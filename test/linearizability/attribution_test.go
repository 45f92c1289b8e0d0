package linearizability

import (
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/anishathalye/porcupine"
)

// The callers of the attribution tests, with the flags their recorders set: stock is a Service
// create or delete through kube-apiserver (serviceWorker), the others the allocator processes of
// process_test.go in their modes, named by process.
func stock(op Op) Op {
	op = kubeAPIServer(op)
	op.SetsBitFirst = true
	return op
}

func legacy(process string, op Op) Op {
	op.Process, op.Bitmap = process, true
	return op
}

func dualWrite(process string, op Op) Op {
	op.Process, op.Bitmap, op.LeavesBit, op.ClearsBitLast, op.SetsBitFirst = process, true, true, true, true
	return op
}

func ipAddressOnly(process string, op Op) Op {
	op.Process = process
	return op
}

// legacyHoldsA is a Legacy process told it holds addrA: its bit, and no IPAddress object.
var legacyHoldsA = legacy("legacy-0#1", Op{Client: 0, Kind: Allocate, Addr: addrA, Owner: "legacy-0-1-0-7", Call: 0, Return: 10 * ms, Outcome: OK})

// addrsOf returns the addresses of atts.
func addrsOf(atts []Attribution) []netip.Addr {
	out := make([]netip.Addr, 0, len(atts))
	for _, a := range atts {
		out = append(out, a.Addr)
	}
	return out
}

// historyPrefix is the range of the AllocateNexts of the attribution tests.
var historyPrefix = netip.MustParsePrefix(historyRange)

// takesA is an AllocateNext that hands out addrA, answered OK, at 20 to 30 ms.
var takesA = Op{Client: 1, Kind: AllocateNext, Addr: addrA, Owner: "default/h-1-1", Range: historyPrefix, Call: 20 * ms, Return: 30 * ms, Outcome: OK}

func TestIllegalAddressesAreAttributed(t *testing.T) {
	tests := []struct {
		name    string
		history []Op
		// blamed are the processes the attribution holds the address against, in the order
		// blamed; fails says whether the window fails, the address counting against clusterip.
		blamed []string
		fails  bool
	}{
		{
			name:    "a stock v1.33 AllocateNext hands out the address whose bit a Legacy process holds: stock's defect, the window passes",
			history: []Op{legacyHoldsA, stock(takesA)},
			blamed:  []string{"kube-apiserver"},
			fails:   false,
		},
		{
			name:    "the same with a DualWrite process in kube-apiserver's place: it counts against clusterip",
			history: []Op{legacyHoldsA, dualWrite("dualwrite-1#0", takesA)},
			blamed:  []string{"dualwrite-1#0"},
			fails:   true,
		},
		{
			name:    "the same with another Legacy process in kube-apiserver's place: it counts against clusterip",
			history: []Op{legacyHoldsA, legacy("legacy-2#0", takesA)},
			blamed:  []string{"legacy-2#0"},
			fails:   true,
		},
		{
			name: "a DualWrite process hands out the address an IPAddressOnly process holds: a duplicate of clusterip's own",
			history: []Op{
				ipAddressOnly("ipaddressonly-1#0", Op{Client: 0, Kind: Allocate, Addr: addrA, Owner: "ipaddressonly-1-0-0-3", Call: 0, Return: 10 * ms, Outcome: OK}),
				dualWrite("dualwrite-0#2", takesA),
			},
			blamed: []string{"dualwrite-0#2"},
			fails:  true,
		},
		{
			name: "a stock kube-apiserver told it holds the address, and a DualWrite process then hands it out too: clusterip's duplicate, though stock's answer came first",
			history: []Op{
				stock(Op{Client: 0, Kind: Allocate, Addr: addrA, Owner: "default/h-0-1", Call: 0, Return: 10 * ms, Outcome: OK}),
				dualWrite("dualwrite-1#0", takesA),
			},
			blamed: []string{"dualwrite-1#0"},
			fails:  true,
		},
		{
			name: "stock's defect, then a duplicate of clusterip's at the same address: both are blamed, and it counts against clusterip",
			history: []Op{
				legacyHoldsA,
				stock(takesA),
				legacy("legacy-0#1", Op{Client: 0, Kind: Release, Addr: addrA, Call: 40 * ms, Return: 50 * ms, Outcome: OK}),
				legacy("legacy-2#0", Op{Client: 2, Kind: Allocate, Addr: addrA, Owner: "legacy-2-0-2-4", Call: 60 * ms, Return: 70 * ms, Outcome: OK}),
				dualWrite("dualwrite-1#0", Op{Client: 3, Kind: Allocate, Addr: addrA, Owner: "dualwrite-1-0-3-9", Call: 80 * ms, Return: 90 * ms, Outcome: OK}),
			},
			blamed: []string{"kube-apiserver", "dualwrite-1#0"},
			fails:  true,
		},
		{
			name: "stock's Service keeps the address it was wrongly handed once the Legacy holder releases it: a DualWrite refusal by its object is not blamed",
			history: []Op{
				legacyHoldsA,
				stock(takesA),
				legacy("legacy-0#1", Op{Client: 0, Kind: Release, Addr: addrA, Call: 40 * ms, Return: 50 * ms, Outcome: OK}),
				dualWrite("dualwrite-1#0", Op{Client: 3, Kind: Allocate, Addr: addrA, Owner: "dualwrite-1-0-3-9", Call: 60 * ms, Return: 70 * ms,
					Outcome: Refused, TransientBit: true, Err: "ipaddresses.networking.k8s.io \"10.96.0.20\" already exists"}),
				stock(Op{Client: 1, Kind: Release, Addr: addrA, Call: 80 * ms, Return: 90 * ms, Outcome: OK}),
			},
			blamed: []string{"kube-apiserver"},
			fails:  false,
		},
		{
			// The 5-minute upgrade window of 2026-11-27 (10.96.0.65): stock's fallback writes
			// no bit, and a Legacy process, which reads the bitmap alone, takes the address.
			// The rule blames the answer no explanation allows, the Legacy one, though stock's
			// fallback made it possible: it errs towards counting against clusterip.
			name: "a Legacy process hands out the address a stock Service holds: the Legacy answer is blamed",
			history: []Op{
				stock(Op{Client: 1, Kind: AllocateNext, Addr: addrA, Owner: "default/h-8-4708", Range: historyPrefix, Call: 0, Return: 10 * ms, Outcome: OK}),
				legacy("legacy-2#3", takesA),
				stock(Op{Client: 1, Kind: Release, Addr: addrA, Call: 40 * ms, Return: 50 * ms, Outcome: OK}),
			},
			blamed: []string{"legacy-2#3"},
			fails:  true,
		},
		{
			name: "a refusal nobody explains: the refused caller is blamed",
			history: []Op{
				legacyHoldsA,
				legacy("legacy-0#1", Op{Client: 0, Kind: Release, Addr: addrA, Call: 20 * ms, Return: 30 * ms, Outcome: OK}),
				stock(Op{Client: 1, Kind: Allocate, Addr: addrA, Owner: "default/h-1-2", Call: 40 * ms, Return: 50 * ms, Outcome: Refused}),
			},
			blamed: []string{"kube-apiserver"},
			fails:  false,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j, err := Judge(WithUndos(tt.history), JudgeOptions{Stock: "v1.33.13", HTML: filepath.Join(t.TempDir(), "history.html")})
			if err != nil {
				t.Fatal(err)
			}
			if j.Verdict != porcupine.Illegal || len(j.Illegal) != 1 || j.Illegal[0].Addr != addrA {
				t.Fatalf("Judge() = %v at %v, want Illegal at %v alone", j.Verdict, addrsOf(j.Illegal), addrA)
			}
			a := j.Illegal[0]
			var blamed []string
			for _, o := range a.Origins() {
				blamed = append(blamed, o.Process)
			}
			if !slices.Equal(blamed, tt.blamed) || a.Undecided != "" {
				t.Errorf("blamed %q (undecided: %q), want %q; attribution:\n%s", blamed, a.Undecided, tt.blamed, a)
			}
			if j.Fails() != tt.fails || a.CountsAgainstClusterIP() != tt.fails || a.StockOnly() == tt.fails {
				t.Errorf("Fails() = %v, CountsAgainstClusterIP() = %v, StockOnly() = %v; want the window to fail: %v; attribution:\n%s",
					j.Fails(), a.CountsAgainstClusterIP(), a.StockOnly(), tt.fails, a)
			}
		})
	}
}

// A linearizable history is judged so, with nothing to attribute, and fails nothing.
func TestLinearizableHistoryBlamesNobody(t *testing.T) {
	history := WithUndos([]Op{
		legacyHoldsA,
		legacy("legacy-0#1", Op{Client: 0, Kind: Release, Addr: addrA, Call: 12 * ms, Return: 18 * ms, Outcome: OK}),
		stock(takesA),
	})
	j, err := Judge(history, JudgeOptions{Stock: "v1.33.13", HTML: filepath.Join(t.TempDir(), "history.html")})
	if err != nil {
		t.Fatal(err)
	}
	if j.Verdict != porcupine.Ok || len(j.Illegal) != 0 || j.Fails() {
		t.Errorf("Judge() = %v, illegal at %v, fails %v; want Ok, nowhere, no", j.Verdict, addrsOf(j.Illegal), j.Fails())
	}
	if a := Attribute(Model, history, addrA, "v1.33.13", 0); len(a.Blamed) != 0 || a.CountsAgainstClusterIP() || a.StockOnly() {
		t.Errorf("Attribute() of a linearizable part:\n%s\nwant nobody blamed", a)
	}
}

func TestOriginNamesStockAndClusterIPProcesses(t *testing.T) {
	tests := []struct {
		process  string
		stock    bool
		software string
	}{
		{"kube-apiserver", true, "stock kube-apiserver v1.33.13"},
		{"before", true, "stock kube-apiserver v1.33.13"},
		{"legacy-0#1", false, "clusterip library, Legacy mode"},
		{"dualwrite-1#4", false, "clusterip library, DualWrite mode"},
		{"ipaddressonly-1#0", false, "clusterip library, IPAddressOnly mode"},
		{"fork-v1.35.4#0", false, "clusterip fork of kube-apiserver v1.35.4"},
		{"kube-apiserver-2", false, "unknown, counted as clusterip's"},
		{"legacy-0", false, "unknown, counted as clusterip's"},
		{"p", false, "unknown, counted as clusterip's"},
	}
	for _, tt := range tests {
		o := OriginOf(tt.process, "v1.33.13")
		if o.Process != tt.process || o.Stock != tt.stock || o.Software != tt.software {
			t.Errorf("OriginOf(%q) = %+v, want stock %v, %q", tt.process, o, tt.stock, tt.software)
		}
	}
}

// The report of an address that is stock's defect alone says so, and names the release.
func TestAttributionSaysStocksDefectAndItsRelease(t *testing.T) {
	a := Attribute(Model, WithUndos([]Op{legacyHoldsA, stock(takesA)}), addrA, "v1.33.13", 0)
	want := "10.96.0.20: stock's defect, not clusterip's; blamed: kube-apiserver (stock kube-apiserver v1.33.13)\n" +
		"  kube-apiserver, called at 20.000 ms, answered at 30.000 ms: AllocateNext(default/h-1-1) → ok 10.96.0.20"
	if got := a.String(); got != want {
		t.Errorf("String() =\n%s\nwant\n%s", got, want)
	}
}

// TestSavedUpgradeExcerptIsStocksDefect attributes an excerpt of the 5-minute upgrade history of
// 2026-12-03 18:55 (testdata/upgrade-10.96.0.28.json): the operations naming 10.96.0.28 from
// 280 s on, and the allocation of the Legacy process that held it from 136 s, whose process
// was killed later. At 297.6 s kube-apiserver v1.33.13's AllocateNext handed the address to a
// Service: stock's defect alone, which fails no window.
func TestSavedUpgradeExcerptIsStocksDefect(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "upgrade-10.96.0.28.json"))
	if err != nil {
		t.Fatal(err)
	}
	var history []Op
	if err := json.Unmarshal(raw, &history); err != nil {
		t.Fatal(err)
	}
	j, err := Judge(history, JudgeOptions{Stock: "v1.33.13", HTML: filepath.Join(t.TempDir(), "history.html")})
	if err != nil {
		t.Fatal(err)
	}
	addr := netip.MustParseAddr("10.96.0.28")
	if len(j.Illegal) != 1 || j.Illegal[0].Addr != addr {
		t.Fatalf("Judge() = %v at %v, want Illegal at %v alone", j.Verdict, addrsOf(j.Illegal), addr)
	}
	a := j.Illegal[0]
	if !a.StockOnly() || j.Fails() || len(a.Blamed) != 1 || a.Blamed[0].Op.Owner != "default/h-8-7477" {
		t.Errorf("attribution:\n%s\nwant stock's defect alone, the AllocateNext of default/h-8-7477, and no failure (Fails() = %v)", a, j.Fails())
	}
}
