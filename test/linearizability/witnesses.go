package linearizability

import (
	"cmp"
	"slices"

	"github.com/anishathalye/porcupine"
)

// witnesses are the operations of one address's part after which the address is held, as a
// refusal as full needs it: an OK allocation (held by its owner), or a refused Allocate (held,
// as its caller sees it). A refusal as full whose interval holds a witness's whole interval adds
// nothing to the check, so the partition leaves it out: wherever the witness is placed, the
// refusal can be placed right after it, where every state left holds the address. Refusals as
// full are many when a range stays full (1,624 in the 5-minute finish history, each in every
// address's part), and the fewer overlap, the less porcupine's search has to try.
type witnesses struct {
	// strict: after these nobody may take the address (held by an owner); all: also those
	// after which a caller that reads the bitmap sees it taken (held, or its bit set). Each
	// sorted by call, with the least return from each index on.
	strict, all witnessList
}

type witnessList struct{ calls, minReturn []int64 }

func witnessesOf(ops []porcupine.Operation) witnesses {
	var strict, all []porcupine.Operation
	for _, o := range ops {
		op := o.Input.(Op)
		switch {
		case (op.Kind == Allocate || op.Kind == AllocateNext) && op.Outcome == OK,
			op.Kind == Allocate && op.Outcome == Refused && !op.Bitmap:
			strict = append(strict, o)
			all = append(all, o)
		case op.Kind == Allocate && op.Outcome == Refused:
			all = append(all, o)
		}
	}
	return witnesses{newWitnessList(strict), newWitnessList(all)}
}

func newWitnessList(ops []porcupine.Operation) witnessList {
	slices.SortFunc(ops, func(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) })
	l := witnessList{calls: make([]int64, len(ops)), minReturn: make([]int64, len(ops))}
	for i := len(ops) - 1; i >= 0; i-- {
		l.calls[i], l.minReturn[i] = ops[i].Call, ops[i].Return
		if i+1 < len(ops) {
			l.minReturn[i] = min(l.minReturn[i], l.minReturn[i+1])
		}
	}
	return l
}

// holds reports whether some witness's interval lies within [call, ret].
func (l witnessList) holds(call, ret int64) bool {
	i, _ := slices.BinarySearch(l.calls, call)
	return i < len(l.calls) && l.minReturn[i] <= ret
}

// implies reports whether a refusal as full over [call, ret], from a caller that reads the
// bitmap or not, is implied by a witness.
func (w witnesses) implies(call, ret int64, bitmap bool) bool {
	if bitmap {
		return w.all.holds(call, ret)
	}
	return w.strict.holds(call, ret)
}
