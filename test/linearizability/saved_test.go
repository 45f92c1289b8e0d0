package linearizability

import (
	"encoding/json"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// TestSavedHistoryIsLinearizable checks again, under the current model, a history an earlier run
// wrote (-history.check=DIR/finish.json), recorded beside the stock kube-apiserver of
// -history.stock, and attributes and explains each address where it is not linearizable in
// DIR/finish-ADDR.txt. It fails as the test that recorded the history does ([report]): where an
// address counts against clusterip. It skips without the flag.
func TestSavedHistoryIsLinearizable(t *testing.T) {
	if *historyCheck == "" {
		t.Skip("no -history.check")
	}
	raw, err := os.ReadFile(*historyCheck)
	if err != nil {
		t.Fatal(err)
	}
	var ops []Op
	if err := json.Unmarshal(raw, &ops); err != nil {
		t.Fatal(err)
	}
	ops = withCallerFlags(ops)
	prefix := strings.TrimSuffix(*historyCheck, ".json")
	j, err := Judge(ops, JudgeOptions{Stock: *historyStock, Timeout: checkTimeout, PartTimeout: partTimeout, AttributeTimeout: attributeTimeout, HTML: prefix + ".html"})
	if err != nil {
		t.Fatal(err)
	}
	res := j.Result
	t.Logf("%s: %d operations on %d addresses (%d unknown); checker: %s in %v",
		*historyCheck, res.Ops, res.Addresses, res.Unknown, res.Verdict, res.Elapsed.Round(time.Millisecond))
	if res.Verdict != porcupine.Ok {
		report(t, "the history", j, ops, prefix)
	}
}

// withCallerFlags returns a history written by an earlier harness with the flags the harness
// sets now: Op.ClearsBitLast and Op.RepairFrees from who called, when the history has neither
// (with the Undos of the releases that gives), Op.ClearsBitFirst for kube-apiserver's
// operations when no operation has it (with the Deletes of its releases), Op.FallsBackToObjects
// for kube-apiserver's operations when no operation has it, Op.Range for
// AllocateNexts that have none, and
// Op.RefusalLeavesBit instead of Op.TransientBit (and no Undo) for a DualWrite refusal that
// kept its bit, and Op.SetsBitFirst for the dual writers' operations when no operation has it
// (with the Creates of their allocations).
func withCallerFlags(history []Op) []Op {
	old, noClearsBitFirst, noFallback, noSetsBitFirst := true, true, true, true
	type key struct {
		client int
		call   int64
	}
	keptBit := map[key]bool{}
	for _, op := range history {
		if op.ClearsBitLast || op.RepairFrees {
			old = false
		}
		if op.ClearsBitFirst {
			noClearsBitFirst = false
		}
		if op.FallsBackToObjects {
			noFallback = false
		}
		if op.SetsBitFirst {
			noSetsBitFirst = false
		}
		if op.Kind == Allocate && op.TransientBit && strings.Contains(op.Err, keptBitRefusal) {
			keptBit[key{op.Client, op.Call}] = true
		}
	}
	out := make([]Op, 0, len(history))
	for _, op := range history {
		kept := keptBit[key{op.Client, op.Call}]
		switch {
		case op.Kind == Undo && (kept || !op.Addr.IsValid()):
			continue // an Undo of a refusal that kept its bit, or of an AllocateNext refused as full
		case kept:
			op.TransientBit, op.RefusalLeavesBit = false, true
		}
		if old {
			switch {
			case op.Kind == Undo:
			case strings.HasPrefix(op.Process, "dualwrite-"):
				op.ClearsBitLast = true
			case op.Process == "kube-apiserver":
				op.RepairFrees = true
			}
		}
		if noClearsBitFirst && op.Process == "kube-apiserver" && op.Kind != Undo {
			op.ClearsBitFirst = true
		}
		if noFallback && op.Process == "kube-apiserver" {
			op.FallsBackToObjects = true
		}
		if op.Kind == AllocateNext && !op.Range.IsValid() {
			op.Range = netip.MustParsePrefix(historyRange) // every history was recorded on it
		}
		if noSetsBitFirst && op.Bitmap && op.LeavesBit && op.Kind != Undo && op.Kind != Delete {
			op.SetsBitFirst = true
		}
		out = append(out, op)
		if noSetsBitFirst && setsBitFirst(op) {
			create := op
			create.Kind, create.Err = Create, ""
			out = append(out, create)
		}
		if old && op.Kind == Release && op.Outcome == OK && op.ClearsBitLast && op.Bitmap {
			undo := op
			undo.Kind = Undo
			out = append(out, undo)
		}
		if noClearsBitFirst && op.Kind == Release && op.Outcome != Refused && op.ClearsBitFirst && op.Bitmap {
			del := op
			del.Kind, del.Err = Delete, ""
			out = append(out, del)
		}
	}
	return out
}
