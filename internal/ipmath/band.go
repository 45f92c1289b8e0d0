package ipmath

import "math/rand/v2"

// FreeIndex finds free offsets. NextFree returns the first free offset in [from, hi), else the
// first in [lo, from), and reports whether there is one.
type FreeIndex interface {
	NextFree(lo, hi, from uint64) (uint64, bool)
}

// PickOffset returns the offset AllocateNext takes from idx, for a range of size offsets whose
// first band form the static band: a random start in the dynamic band [band, size), then the next
// free offset after it, wrapping; the static band [0, band), picked the same way, only when the
// dynamic one is full. It reports false when both are full. It allocates nothing.
func PickOffset[I FreeIndex](idx I, size, band uint64, r *rand.Rand) (uint64, bool) {
	band = min(band, size)
	if band < size {
		if off, ok := idx.NextFree(band, size, band+r.Uint64N(size-band)); ok {
			return off, true
		}
	}
	if band > 0 {
		return idx.NextFree(0, band, r.Uint64N(band))
	}
	return 0, false
}

// PickOffsetSkipping is PickOffset with some free offsets refused: it visits the free offsets in
// PickOffset's order (and draws the same random starts) and returns the first for which skip
// reports false, so that a caller passes over offsets it must not take without marking them. It
// reports false when every free offset is taken or refused. A nil skip refuses none. It costs
// one NextFree per offset visited: proportional to the number refused.
func PickOffsetSkipping[I FreeIndex](idx I, size, band uint64, r *rand.Rand, skip func(uint64) bool) (uint64, bool) {
	if skip == nil {
		return PickOffset(idx, size, band, r)
	}
	band = min(band, size)
	if band < size {
		if off, ok := nextFreeSkipping(idx, band, size, band+r.Uint64N(size-band), skip); ok {
			return off, true
		}
	}
	if band > 0 {
		return nextFreeSkipping(idx, 0, band, r.Uint64N(band), skip)
	}
	return 0, false
}

// nextFreeSkipping returns the first free offset of [lo, hi) at or after start, wrapping, that
// skip does not refuse. lo <= start < hi.
func nextFreeSkipping[I FreeIndex](idx I, lo, hi, start uint64, skip func(uint64) bool) (uint64, bool) {
	// dist is how far off lies after start, going round: 0 … hi-lo-1.
	dist := func(off uint64) uint64 {
		if off >= start {
			return off - start
		}
		return (hi - start) + (off - lo)
	}
	from, visited := start, false
	var last uint64 // dist of the last offset refused
	for {
		off, ok := idx.NextFree(lo, hi, from)
		if !ok {
			return 0, false
		}
		d := dist(off)
		if visited && d <= last {
			return 0, false // round to start again: every free offset was refused
		}
		if !skip(off) {
			return off, true
		}
		visited, last = true, d
		if d == hi-lo-1 {
			return 0, false
		}
		if from = off + 1; from == hi {
			from = lo
		}
	}
}
