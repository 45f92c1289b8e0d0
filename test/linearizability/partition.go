package linearizability

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/anishathalye/porcupine"
)

// partition splits a history by address. An AllocateNext whose outcome is unknown goes into
// every part, as an allocation of that address that may have happened; one refused as full
// goes into the part of every address of its Op.Range and every address the history names
// when it has none, as a refusal that needs the address held. Each address is checked on its
// own, so a refusal as full is legal when each address was held at some instant of the call,
// not necessarily the same one for all. The addresses of a range that no operation names are
// free throughout but for lost AllocateNexts, so one of them, the lowest, stands for all.
// Each allocation with Op.RepairFrees whose outcome is unknown brings a Repair of its owner
// into the parts it is in.
//
// A Claim of Service s is an allocation that crosses addresses: it must take the reservation kept
// for s wherever one is. So it goes into the part of every address where a reservation for s may
// be (a Reserve of [ReservedFor] s, or a Release of s that Retains): an OK Claim into its own
// address's part as an allocation, and into the others' as a copy (Op.Elsewhere) that must not
// find the reservation there at its instant; a Claim that is not OK into those parts as a claim
// that may have happened, and, since it may have taken a free address instead, among the lost
// AllocateNexts.
func partition(history []porcupine.Operation) [][]porcupine.Operation {
	byAddr := map[netip.Addr][]porcupine.Operation{}
	var anywhere, full, claims []porcupine.Operation
	reservedAt := map[string][]netip.Addr{} // by reservation holder: the addresses it may hold
	for _, o := range history {
		op := o.Input.(Op)
		switch {
		case op.Kind == AllocateNext && op.Outcome == Unknown:
			anywhere = append(anywhere, o)
		case op.Kind == AllocateNext && op.Outcome == Refused:
			full = append(full, o)
		case op.Kind == Claim && op.Outcome != OK:
			claims = append(claims, o)
			lost := op
			lost.Kind, lost.Addr = AllocateNext, netip.Addr{}
			anywhere = append(anywhere, porcupine.Operation{ClientId: o.ClientId, Input: lost, Output: lost, Call: o.Call, Return: o.Return, Metadata: o.Metadata})
		default:
			byAddr[op.Addr] = append(byAddr[op.Addr], o)
			if r, ok := orphanRepairOf(o); ok {
				byAddr[op.Addr] = append(byAddr[op.Addr], r)
			}
			if r, ok := repairOf(o, op.Addr); ok {
				byAddr[op.Addr] = append(byAddr[op.Addr], r)
			}
			switch {
			case op.Kind == Claim:
				claims = append(claims, o)
			case op.Kind == Reserve:
				reservedAt[op.Owner] = append(reservedAt[op.Owner], op.Addr)
			case op.Kind == Release && op.Retains:
				reservedAt[ReservedFor(op.Owner)] = append(reservedAt[ReservedFor(op.Owner)], op.Addr)
			}
		}
	}
	for _, o := range claims {
		op := o.Input.(Op)
		for _, a := range slices.Compact(slices.SortedFunc(slices.Values(reservedAt[ReservedFor(op.Owner)]), netip.Addr.Compare)) {
			if op.Outcome == OK && a == op.Addr {
				continue
			}
			c := op
			c.Addr, c.Elsewhere = a, op.Outcome == OK
			if c.Elsewhere {
				c.Err = "it got " + op.Addr.String()
			}
			byAddr[a] = append(byAddr[a], porcupine.Operation{ClientId: o.ClientId, Input: c, Output: c, Call: o.Call, Return: o.Return, Metadata: c.Err})
		}
	}
	standIns := map[netip.Prefix]bool{}
	for _, o := range full {
		if rg := o.Input.(Op).Range.Masked(); rg.IsValid() && !standIns[rg] {
			standIns[rg] = true
			if a, ok := unnamed(rg, byAddr); ok {
				byAddr[a] = nil
			}
		}
	}
	addrs := make([]netip.Addr, 0, len(byAddr))
	for a := range byAddr {
		addrs = append(addrs, a)
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	anywhere = mergeLost(anywhere)
	parts := make([][]porcupine.Operation, 0, len(addrs))
	for _, a := range addrs {
		part := append(byAddr[a], anywhere...)
		for _, o := range anywhere {
			if r, ok := repairOf(o, a); ok {
				part = append(part, r)
			}
		}
		w := witnessesOf(byAddr[a])
		for _, o := range full {
			op := o.Input.(Op)
			if !op.Range.IsValid() || usable(op.Range, a) {
				op.Addr = a
				o.Input, o.Output = op, op
				if !w.implies(o.Call, o.Return, op.Bitmap) {
					part = append(part, o)
				}
			}
		}
		parts = append(parts, part)
	}
	return parts
}

// unnamed returns the lowest usable address of rg that has no part in byAddr; ok is false when
// there is none. It looks at no more addresses than byAddr has, plus one.
func unnamed(rg netip.Prefix, byAddr map[netip.Addr][]porcupine.Operation) (netip.Addr, bool) {
	for a := rg.Masked().Addr().Next(); a.IsValid() && usable(rg, a); a = a.Next() {
		if _, named := byAddr[a]; !named {
			return a, true
		}
	}
	return netip.Addr{}, false
}

// usable reports whether a is an address of rg that can be allocated: in it, and neither its
// network address nor, for IPv4, its broadcast address.
func usable(rg netip.Prefix, a netip.Addr) bool {
	if !rg.Contains(a) || a == rg.Masked().Addr() {
		return false
	}
	if !a.Is4() {
		return true
	}
	host := 32 - rg.Bits()
	v := a.As4()
	n := uint32(v[0])<<24 | uint32(v[1])<<16 | uint32(v[2])<<8 | uint32(v[3])
	return host == 0 || n&(1<<host-1) != 1<<host-1
}

// mergeLost merges the AllocateNexts whose answers were lost into one per kind of caller (what
// it reads, what it may leave behind), from the first one's call to the last one's return.
// Within one address's part at most one of them can have taken the address, since nobody knows
// to release it, so one stands for all of them, with a wider interval; without the merge the
// search tries every order of them, which is exponential in their number.
func mergeLost(ops []porcupine.Operation) []porcupine.Operation {
	type class struct{ bitmap, leaves, refusalLeaves, clearsBitLast, repairFrees, fallsBack bool }
	merged := map[class]int{} // index in out
	var out []porcupine.Operation
	for _, o := range ops {
		op := o.Input.(Op)
		c := class{op.Bitmap, op.LeavesBit, op.RefusalLeavesBit, op.ClearsBitLast, op.RepairFrees, op.FallsBackToObjects}
		i, ok := merged[c]
		if !ok {
			// Each class its own owner, so that a Repair frees only its own class's.
			op.Owner, op.Process = fmt.Sprintf("(a lost AllocateNext #%d)", len(out)), "lost AllocateNexts"
			o.Input, o.Output = op, op
			merged[c] = len(out)
			out = append(out, o)
			continue
		}
		m := out[i]
		m.Call, m.Return = min(m.Call, o.Call), max(m.Return, o.Return)
		mop := m.Input.(Op)
		mop.Call, mop.Return = m.Call, m.Return
		m.Input, m.Output = mop, mop
		out[i] = m
	}
	return out
}
