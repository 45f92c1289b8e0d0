package linearizability

import (
	"fmt"
	"io"
	"net/netip"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// explainTail is how many steps of the longest linearizable prefix, and how many of the
// operations left out of it, [Explain] writes.
const explainTail = 40

// Explain writes, as text for a person, why addr's part of history is not linearizable under m:
// every operation of the part in call order, marked "*" when the longest linearizable prefix
// porcupine found takes it; the last steps of that prefix with the state after each; and the
// operations it leaves out, by return, the first of which is where every explanation fails.
// Times are milliseconds since the first call of history. The part is checked within timeout (0:
// no limit); an address with no part, or a part that is linearizable, is said to be so.
func Explain(w io.Writer, m porcupine.Model, history []Op, addr netip.Addr, timeout time.Duration) error {
	if len(history) == 0 {
		_, err := fmt.Fprintln(w, "empty history")
		return err
	}
	t0 := history[0].Call
	for _, op := range history {
		t0 = min(t0, op.Call)
	}
	ms := func(t int64) string { return fmt.Sprintf("%10.3f", float64(t-t0)/1e6) }
	line := func(op Op) string {
		s := fmt.Sprintf("%s %s c%-3d %-22s %s", ms(op.Call), ms(op.Return), op.Client, op.Process, op)
		if op.Owner != "" && op.Kind != Release && op.Kind != Undo {
			s += " [" + op.Owner + "]"
		}
		var flags []string
		for _, f := range []struct {
			on   bool
			name string
		}{{op.Bitmap, "bitmap"}, {op.LeavesBit, "leavesBit"}, {op.RefusalLeavesBit, "refusalLeavesBit"},
			{op.TransientBit, "transientBit"}, {op.ClearsBitLast, "clearsBitLast"}, {op.ClearsBitFirst, "clearsBitFirst"},
			{op.RepairFrees, "repairFrees"}, {op.FallsBackToObjects, "fallsBackToObjects"}, {op.SetsBitFirst, "setsBitFirst"}} {
			if f.on {
				flags = append(flags, f.name)
			}
		}
		if len(flags) > 0 {
			s += " {" + strings.Join(flags, ",") + "}"
		}
		if op.Err != "" {
			s += " err=" + op.Err
		}
		return s
	}

	var part []porcupine.Operation
	for _, p := range m.Partition(operations(history)) {
		for _, o := range p {
			if o.Input.(Op).Addr == addr {
				part = p
				break
			}
		}
		if part != nil {
			break
		}
	}
	if part == nil {
		_, err := fmt.Fprintf(w, "no operation names %v\n", addr)
		return err
	}
	whole := m
	whole.Partition = nil
	verdict, info := porcupine.CheckOperationsVerbose(whole, part, timeout)
	fmt.Fprintf(w, "%v: %d operations, %s\n", addr, len(part), verdict)
	var best []porcupine.Operation
	for _, p := range info.PartialLinearizationsOperations() {
		for _, l := range p {
			if len(l) > len(best) {
				best = l
			}
		}
	}
	type key struct {
		client    int
		call, ret int64
		kind      Kind
	}
	keyOf := func(o porcupine.Operation) key {
		op := o.Input.(Op)
		return key{o.ClientId, o.Call, o.Return, op.Kind}
	}
	taken := map[key]bool{}
	for _, o := range best {
		taken[keyOf(o)] = true
	}

	sorted := append([]porcupine.Operation(nil), part...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Call < sorted[j].Call })
	fmt.Fprintf(w, "\n== every operation, by call (* in the longest linearizable prefix, %d of %d)\n", len(best), len(part))
	for _, o := range sorted {
		mark := " "
		if taken[keyOf(o)] {
			mark = "*"
		}
		fmt.Fprintf(w, "%s %s\n", mark, line(o.Input.(Op)))
	}

	fmt.Fprintf(w, "\n== the last steps of the longest linearizable prefix, with the state after each\n")
	state := m.Init()
	for i, o := range best {
		_, state = m.Step(state, o.Input, o.Output)
		if i >= len(best)-explainTail {
			fmt.Fprintf(w, "%5d %s\n      -> %s\n", i, line(o.Input.(Op)), m.DescribeState(state))
		}
	}

	var rest []Op
	for _, o := range part {
		if !taken[keyOf(o)] {
			rest = append(rest, o.Input.(Op))
		}
	}
	sort.SliceStable(rest, func(i, j int) bool { return rest[i].Return < rest[j].Return })
	fmt.Fprintf(w, "\n== operations left out of it, by return (%d)\n", len(rest))
	for i, op := range rest {
		if i == explainTail {
			fmt.Fprintf(w, "...\n")
			break
		}
		fmt.Fprintf(w, "  %s\n", line(op))
	}
	return nil
}
