package linearizability

// WithUndos returns history with the second halves of operations that take two steps, each
// over the same interval as its first: an Undo after each refused Allocate with
// Op.TransientBit, each GiveBack and each OK Release with Op.ClearsBitLast, a Delete, with the Release's
// outcome, after each Release with Op.ClearsBitFirst that is OK or unknown, and a Create, with
// the allocation's outcome, after each allocation that [setsBitFirst].
func WithUndos(history []Op) []Op {
	out := make([]Op, 0, len(history))
	for _, op := range history {
		out = append(out, op)
		if setsBitFirst(op) {
			create := op
			create.Kind, create.Err = Create, ""
			out = append(out, create)
		}
		if (op.TransientBit && op.Kind == Allocate && op.Outcome == Refused) || (op.ClearsBitLast && op.Bitmap && op.Kind == Release && op.Outcome == OK) || op.Kind == GiveBack {
			undo := op
			undo.Kind, undo.Owner, undo.Outcome, undo.TransientBit, undo.Err = Undo, "", OK, false, ""
			out = append(out, undo)
		}
		if op.ClearsBitFirst && op.Bitmap && op.Kind == Release && op.Outcome != Refused {
			del := op
			del.Kind, del.Err = Delete, ""
			out = append(out, del)
		}
	}
	return out
}

// setsBitFirst reports whether op is an allocation the model checks in two steps, a bit set for
// its owner and then its Create (Op.SetsBitFirst): one that is OK, or an Allocate whose outcome
// is unknown, of a caller that reads the bitmap.
func setsBitFirst(op Op) bool {
	if !op.SetsBitFirst || !op.Bitmap {
		return false
	}
	switch op.Kind {
	case Allocate:
		return op.Outcome != Refused
	case AllocateNext:
		return op.Outcome == OK
	}
	return false
}
