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
