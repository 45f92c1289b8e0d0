package linearizability

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/anishathalye/porcupine"
)

// Result is what [Check] found.
type Result struct {
	// Verdict is porcupine's: porcupine.Ok when the history is linearizable, porcupine.Illegal
	// when it is not, porcupine.Unknown when the check ran out of time.
	Verdict porcupine.CheckResult
	// Ops is how many operations were checked; Addresses how many addresses they touch.
	Ops, Addresses int
	// Unknown counts the operations whose outcome was unknown.
	Unknown int
	// Elapsed is how long porcupine took.
	Elapsed time.Duration
	// HTML is the timeline written when Verdict is not porcupine.Ok, or "".
	HTML string
}

// Linearizable reports whether history is linearizable under m, with no time limit.
func Linearizable(m porcupine.Model, history []Op) bool {
	return porcupine.CheckOperations(m, operations(history))
}

// IllegalAddresses returns the addresses whose part of history is not linearizable under m, in
// order, each part checked within timeout (0: no limit).
// A part whose check runs out of timeout counts as not linearizable.
func IllegalAddresses(m porcupine.Model, history []Op, timeout time.Duration) []netip.Addr {
	whole := m
	whole.Partition = nil
	var bad []netip.Addr
	for _, part := range partition(operations(history)) {
		if porcupine.CheckOperationsTimeout(whole, part, timeout) == porcupine.Ok {
			continue
		}
		for _, o := range part {
			if op := o.Input.(Op); op.Addr.IsValid() {
				bad = append(bad, op.Addr)
				break
			}
		}
	}
	return bad
}

func operations(history []Op) []porcupine.Operation {
	ops := make([]porcupine.Operation, 0, len(history))
	for _, op := range history {
		ops = append(ops, porcupine.Operation{
			ClientId: op.Client,
			Input:    op,
			Output:   op,
			Call:     op.Call,
			Return:   op.Return,
			Metadata: op.Err,
		})
	}
	return ops
}

// Check checks that history is linearizable under [Model] within timeout (0: no limit). When it
// is not, or the check runs out of time, it writes porcupine's timeline of the history, with the
// longest linearizable prefix of each address and where it fails, to htmlPath, and names the
// file in the Result. An error is returned only when writing the timeline fails.
func Check(history []Op, timeout time.Duration, htmlPath string) (Result, error) {
	ops := operations(history)
	res := Result{Ops: len(history)}
	addrs := map[netip.Addr]bool{}
	for _, op := range history {
		if op.Outcome == Unknown {
			res.Unknown++
		}
		if op.Addr.IsValid() {
			addrs[op.Addr] = true
		}
	}
	res.Addresses = len(addrs)
	start := time.Now()
	verdict, info := porcupine.CheckOperationsVerbose(Model, ops, timeout)
	res.Elapsed = time.Since(start)
	res.Verdict = verdict
	if verdict == porcupine.Ok {
		return res, nil
	}
	if err := porcupine.VisualizePath(Model, info, htmlPath); err != nil {
		return res, fmt.Errorf("write the timeline: %w", err)
	}
	res.HTML = htmlPath
	return res, nil
}
