package linearizability

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// maxBlames is how many answers [Attribute] holds against their processes at one address before
// it gives up and leaves the address undecided.
const maxBlames = 64

// Attribution is whom [Attribute] holds one address's illegal part against.
type Attribution struct {
	Addr netip.Addr
	// Blamed are the answers the rule holds against their processes, in the order it found them.
	// Empty when the part is linearizable.
	Blamed []Blame
	// Undecided, when not empty, says why the rule did not finish: a check ran out of time, or
	// more than maxBlames answers were blamed. An undecided address counts against clusterip.
	Undecided string
	// Checks is how many checks of the address's part the rule ran, in Elapsed.
	Checks  int
	Elapsed time.Duration

	start int64 // the first call of the history, from which String counts times
}

// Blame is one answer [Attribute] holds against the process that gave it.
type Blame struct {
	Origin Origin
	// Op is the operation as its caller made it, with the answer it got: its outcome, and for an
	// AllocateNext or a Claim the address.
	Op Op
}

// Origins returns the origins of the blamed processes, each once, in the order first blamed.
func (a Attribution) Origins() []Origin {
	var out []Origin
	for _, b := range a.Blamed {
		if !slices.ContainsFunc(out, func(o Origin) bool { return o.Process == b.Origin.Process }) {
			out = append(out, b.Origin)
		}
	}
	return out
}

// CountsAgainstClusterIP reports whether the address counts against clusterip: some blamed
// process is not a stock kube-apiserver (clusterip's, or one [OriginOf] does not know), or the
// rule did not finish.
func (a Attribution) CountsAgainstClusterIP() bool {
	return a.Undecided != "" || slices.ContainsFunc(a.Blamed, func(b Blame) bool { return !b.Origin.Stock })
}

// StockOnly reports whether the address is a stock kube-apiserver's defect alone: the rule
// finished and blamed answers, all of them a stock kube-apiserver's.
func (a Attribution) StockOnly() bool { return len(a.Blamed) > 0 && !a.CountsAgainstClusterIP() }

func (a Attribution) String() string {
	var verdict string
	switch {
	case a.Undecided != "" && !slices.ContainsFunc(a.Blamed, func(b Blame) bool { return !b.Origin.Stock }):
		verdict = "undecided (" + a.Undecided + "), counts against clusterip"
	case a.Undecided != "":
		verdict = "counts against clusterip (then the search stopped: " + a.Undecided + ")"
	case len(a.Blamed) == 0:
		verdict = "linearizable, nobody to blame"
	case a.StockOnly():
		verdict = "stock's defect, not clusterip's"
	default:
		verdict = "counts against clusterip"
	}
	var origins []string
	for _, o := range a.Origins() {
		origins = append(origins, o.String())
	}
	s := fmt.Sprintf("%v: %s; blamed: %s", a.Addr, verdict, strings.Join(origins, ", "))
	if len(origins) == 0 {
		s += "nobody"
	}
	for _, b := range a.Blamed {
		s += fmt.Sprintf("\n  %s, called at %.3f ms, answered at %.3f ms: %s",
			b.Origin.Process, float64(b.Op.Call-a.start)/1e6, float64(b.Op.Return-a.start)/1e6, b.Op)
	}
	return s
}

// Attribute holds addr's part of history, which is not linearizable under m, against the
// processes whose answers make it so, and names each as stock or clusterip's ([OriginOf], with
// stockRelease the release of the stock kube-apiserver). The model is the same; the rule only
// chooses which answers to stop believing.
//
// The rule: an answer is what a caller learnt of its call, an outcome OK or Refused (and an
// AllocateNext's address); a call whose outcome is unknown has none. The part is checked as it
// stood at the instant each answer came, as the recorder would have ended the history then: the
// calls made by that instant, the answers that came by it counted, every other call taken as
// lost. The first answer at which that part is illegal is blamed: no explanation of what came
// before it allows it. Its process is blamed, not those whose earlier answers it contradicts:
// a stock AllocateNext that hands out an address a Legacy process was told it holds is stock's
// defect, and the Legacy process, whose answer came first and was right, is not. The blamed
// answer is then no longer counted, and the search goes on with the answers left, until the
// whole part is linearizable: so a defect that comes later, of another process, is found too,
// and an address counts against clusterip as soon as one of its processes gives a blamed answer.
//
// A call taken as lost is what the recorder makes of one whose answer never came: it may have
// taken effect at any instant from its call to the end of the history, or never (an
// AllocateNext, at any address: [Model]'s partition merges it with the other lost ones of its
// kind of caller), with what the history derived from it made again for that outcome
// ([WithUndos]); the bits it gave back or kept (GiveBack, KeepBit) stay, as facts of the call. Taking a blamed
// answer as lost, not as never made, keeps what it may have done: an address a stock fallback
// handed to a Service stays held by that Service's IPAddress object once its first holder
// releases it, and a DualWrite caller refused by that object is not blamed for it.
//
// The first such answer is found by bisection over the instants the answers came, one check of
// the part at each step. A later instant never makes an illegal part linearizable again: it
// adds calls, and a counted answer allows no more than the same call lost. Two corners escape
// that: an AllocateNext that sets the bit first (Op.SetsBitFirst) is checked in two steps when
// its answer is counted and, lost, in one; and a bit a call gave back after the instant may need
// a call made after it, left out. There the bisection still finds an answer at which a
// linearizable part turns illegal, though maybe not the first. Answers that came at the same
// instant are blamed each where counting it alone with the earlier ones makes the part illegal,
// all of them when none does.
//
// Each check runs within timeout (0: no limit); one that runs out, more than maxBlames blamed
// answers, or a part illegal before its first answer (the unknown calls and given back bits
// alone) leave the address undecided, which counts against clusterip. Only the calls whose
// operations can be in addr's part are looked at, so the cost is that of addr's part, not of the
// history.
func Attribute(m porcupine.Model, history []Op, addr netip.Addr, stockRelease string, timeout time.Duration) (att Attribution) {
	began := time.Now()
	att.Addr = addr
	defer func() { att.Elapsed = time.Since(began) }()
	if len(history) == 0 {
		return att
	}
	start, end := history[0].Call, history[0].Return
	for _, op := range history {
		start, end = min(start, op.Call), max(end, op.Return)
	}
	att.start = start
	calls, fixed := callsAt(m, history, addr, end)
	whole := m
	whole.Partition = nil
	// check checks addr's part with each call as use says: left out, lost, or as recorded.
	check := func(use func(*aCall) callUse) porcupine.CheckResult {
		att.Checks++
		h := slices.Clone(fixed)
		for _, c := range calls {
			switch use(c) {
			case asLost:
				h = append(h, c.lost...)
			case asRecorded:
				h = append(h, c.ops...)
			}
		}
		for _, p := range m.Partition(operations(h)) {
			if partOf(p, addr) {
				return porcupine.CheckOperationsTimeout(whole, p, timeout)
			}
		}
		return porcupine.Ok
	}
	blamed := map[*aCall]bool{}
	// at returns how the part stood at instant t: the calls made by then, the answers that came
	// by then counted but for those blamed and those count says not to, the other calls lost.
	at := func(t int64, count func(*aCall) bool) func(*aCall) callUse {
		return func(c *aCall) callUse {
			switch {
			case c.call > t:
				return leftOut
			case !c.answered || c.at <= t && !blamed[c] && count(c):
				return asRecorded
			}
			return asLost
		}
	}
	all := func(*aCall) bool { return true }
	for {
		switch check(at(end, all)) {
		case porcupine.Ok:
			return att
		case porcupine.Unknown:
			att.Undecided = fmt.Sprintf("a check ran out of its %v", timeout)
			return att
		}
		if len(att.Blamed) >= maxBlames {
			att.Undecided = fmt.Sprintf("still illegal after %d blamed answers", len(att.Blamed))
			return att
		}
		var times []int64
		for _, c := range calls {
			if c.answered && !blamed[c] {
				times = append(times, c.at)
			}
		}
		slices.Sort(times)
		times = slices.Compact(times)
		if len(times) == 0 {
			att.Undecided = "illegal with no answer counted"
			return att
		}
		// The part as it stood at times[lo] is linearizable (lo -1: just before the first
		// answer), at times[hi] it is not.
		lo, hi := -1, len(times)-1
		for hi-lo > 1 {
			mid := (lo + hi) / 2
			switch check(at(times[mid], all)) {
			case porcupine.Unknown:
				att.Undecided = fmt.Sprintf("a check ran out of its %v", timeout)
				return att
			case porcupine.Illegal:
				hi = mid
			default:
				lo = mid
			}
		}
		if lo < 0 && check(at(times[0]-1, all)) != porcupine.Ok {
			att.Undecided = "illegal before its first answer"
			return att
		}
		t := times[hi]
		var tied []*aCall
		for _, c := range calls {
			if c.answered && !blamed[c] && c.at == t {
				tied = append(tied, c)
			}
		}
		culprits := tied
		if len(tied) > 1 {
			var alone []*aCall
			for _, u := range tied {
				if check(at(t, func(c *aCall) bool { return c.at < t || c == u })) == porcupine.Illegal {
					alone = append(alone, u)
				}
			}
			if len(alone) > 0 {
				culprits = alone
			}
		}
		for _, c := range culprits {
			blamed[c] = true
			op := c.answer()
			att.Blamed = append(att.Blamed, Blame{Origin: OriginOf(op.Process, stockRelease), Op: op})
		}
	}
}

// partOf reports whether part, one of [Model]'s partition, is addr's.
func partOf(part []porcupine.Operation, addr netip.Addr) bool {
	return slices.ContainsFunc(part, func(o porcupine.Operation) bool { return o.Input.(Op).Addr == addr })
}

// callKey names one call of a history: the process and the client that made it, and when. The
// second halves the history derives from an operation ([WithUndos]) and the bits an AllocateNext
// gave back or kept (GiveBack, KeepBit) have the key of that operation.
type callKey struct {
	process string
	client  int
	call    int64
}

func keyOf(op Op) callKey { return callKey{op.Process, op.Client, op.Call} }

// callUse is how a check of [Attribute] takes a call.
type callUse uint8

const (
	leftOut    callUse = iota // made after the instant checked
	asLost                    // its answer not counted
	asRecorded                // its answer, if any, counted
)

// aCall is one call of a history, with what the history derived from it.
type aCall struct {
	call     int64 // when it was made
	ops      []Op  // as recorded: the operation, its second halves, the bits it gave back
	answered bool  // whether the caller learnt an outcome of it, OK or Refused
	at       int64 // when that answer came
	lost     []Op  // the call with its answer not counted ([notCounted])
}

// answer returns the operation the caller made, with the answer it got.
func (c *aCall) answer() Op {
	for _, op := range c.ops {
		if called(op.Kind) && op.Outcome != Unknown {
			return op
		}
	}
	return c.ops[0]
}

// called reports whether operations of kind k are made by a caller, not derived by the history
// from another (Undo, Create, Delete) or recorded of one (GiveBack, KeepBit).
func called(k Kind) bool {
	switch k {
	case Allocate, AllocateNext, Release, Reserve, Unreserve, Claim:
		return true
	}
	return false
}

// callsAt returns the calls of history whose operations can be in addr's part, in the order of
// history, whatever answers are counted: those with an operation in the part when every answer
// is counted, those that name addr, those whose outcome is unknown and may have taken any
// address, and the AllocateNexts refused as full of a range addr is in. fixed is what else must
// be checked with them: nothing, or, when no operation names addr (it stands for the addresses
// of a range no operation names), the rest of history, on which the stand-in depends.
func callsAt(m porcupine.Model, history []Op, addr netip.Addr, end int64) (calls []*aCall, fixed []Op) {
	inPart := map[callKey]bool{}
	for _, p := range m.Partition(operations(history)) {
		if partOf(p, addr) {
			for _, o := range p {
				inPart[keyOf(o.Input.(Op))] = true
			}
			break
		}
	}
	byKey := map[callKey]*aCall{}
	var all []*aCall
	named := false
	for _, op := range history {
		c := byKey[keyOf(op)]
		if c == nil {
			c = &aCall{call: op.Call}
			byKey[keyOf(op)] = c
			all = append(all, c)
		}
		c.ops = append(c.ops, op)
		if called(op.Kind) && op.Outcome != Unknown {
			if !c.answered || op.Return > c.at {
				c.at = op.Return
			}
			c.answered = true
		}
		lost := (op.Kind == AllocateNext || op.Kind == Claim) && op.Outcome != OK
		named = named || op.Addr == addr && !lost
	}
	for _, c := range all {
		if !slices.ContainsFunc(c.ops, func(op Op) bool { return mayBeAt(op, addr) }) && !inPart[keyOf(c.ops[0])] {
			if !named {
				fixed = append(fixed, c.ops...)
			}
			continue
		}
		if c.answered {
			c.lost = notCounted(c.ops, end)
		}
		calls = append(calls, c)
	}
	return calls, fixed
}

// mayBeAt reports whether op, counted or not, may be in addr's part: it names addr, or its
// outcome is not OK and it is an AllocateNext (refused as full, of a range addr is in) or a Claim.
func mayBeAt(op Op, addr netip.Addr) bool {
	switch {
	case op.Addr == addr:
		return true
	case op.Kind == Claim:
		return op.Outcome != OK
	case op.Kind != AllocateNext, op.Outcome == OK:
		return false
	case op.Outcome == Refused:
		return !op.Range.IsValid() || usable(op.Range, addr)
	}
	return true
}

// notCounted returns ops, a call as recorded, with its answer not counted: the operation its
// caller made with an unknown outcome, returning at end (an AllocateNext with no address), the
// second halves [WithUndos] derives for that outcome, and the bits it gave back as recorded.
func notCounted(ops []Op, end int64) []Op {
	var out []Op
	for _, op := range ops {
		switch {
		case op.Kind == GiveBack, op.Kind == KeepBit:
			out = append(out, op)
		case called(op.Kind):
			if op.Outcome != Unknown {
				op.Err = fmt.Sprintf("its answer, %v at %d, not counted", op.Outcome, op.Return)
				op.Outcome, op.Return = Unknown, end
				if op.Kind == AllocateNext {
					op.Addr = netip.Addr{}
				}
			}
			out = append(out, op)
		}
	}
	return WithUndos(out)
}

// JudgeOptions says how [Judge] checks a history.
type JudgeOptions struct {
	// Stock is the release of the stock kube-apiserver the history was recorded beside, such as
	// "v1.33.13", for [OriginOf].
	Stock string
	// Timeout bounds the check of the whole history; PartTimeout each check of one address's
	// part when the addresses where it is not linearizable are looked for; AttributeTimeout each
	// check of one when they are attributed ([Attribute]). 0: no limit.
	Timeout, PartTimeout, AttributeTimeout time.Duration
	// HTML is where the timeline goes when the history is not linearizable ([Check]).
	HTML string
}

// Judgement is what [Judge] found of a history.
type Judgement struct {
	Result
	// Illegal holds, by address, the attribution of each address where the history is not
	// linearizable, or whose check ran out of time.
	Illegal []Attribution
}

// Judge checks history under [Model] ([Check]) and, when it is not linearizable, attributes each
// address where it is not ([Attribute]). An error is returned only when writing the timeline
// fails.
func Judge(history []Op, opts JudgeOptions) (Judgement, error) {
	res, err := Check(history, opts.Timeout, opts.HTML)
	j := Judgement{Result: res}
	if err != nil {
		return j, fmt.Errorf("judge %d operations: %w", len(history), err)
	}
	if res.Verdict == porcupine.Ok {
		return j, nil
	}
	for _, a := range IllegalAddresses(Model, history, opts.PartTimeout) {
		j.Illegal = append(j.Illegal, Attribute(Model, history, a, opts.Stock, opts.AttributeTimeout))
	}
	return j, nil
}

// Fails reports whether the history counts against clusterip: it is not linearizable and an
// address where it is not counts against clusterip ([Attribution.CountsAgainstClusterIP]), or
// the check of the whole history could not decide and found no such address. A history that is
// not linearizable only at addresses held against stock kube-apiserver alone does not fail.
func (j Judgement) Fails() bool {
	if j.Verdict == porcupine.Ok {
		return false
	}
	if len(j.AgainstClusterIP()) > 0 {
		return true
	}
	return len(j.StockDefects()) == 0
}

// AgainstClusterIP returns the attributions of j that count against clusterip.
func (j Judgement) AgainstClusterIP() []Attribution {
	var out []Attribution
	for _, a := range j.Illegal {
		if a.CountsAgainstClusterIP() {
			out = append(out, a)
		}
	}
	return out
}

// StockDefects returns the attributions of j held against stock kube-apiserver alone.
func (j Judgement) StockDefects() []Attribution {
	var out []Attribution
	for _, a := range j.Illegal {
		if a.StockOnly() {
			out = append(out, a)
		}
	}
	return out
}
