package freeindex

import (
	"iter"
	"maps"
	"math"
	"math/bits"
	"slices"
)

const (
	fanout   = 64 // offsets per word, and children per summary entry
	logFan   = 6  // log2(fanout)
	allOnes  = math.MaxUint64
	topLevel = 10 // the one level-10 entry covers the 16 level-9 entries of the uint64 space
	// topChildren masks the children of the top entry: 2^64 offsets / 64^10 = 16.
	topChildren = 1<<(1<<(64-logFan*topLevel)) - 1
)

// Set is a set of uint64 offsets that finds a free offset in any range in a bounded number of
// steps at any fill: it is a sparse hierarchical bit set.
//
// Level 0 maps a word index w to the 64-bit mask of the members among offsets 64w … 64w+63. Each
// level k ≥ 1 maps an index g to the mask of which of its 64 children, the level-(k-1) entries
// 64g … 64g+63, are full (all ones). Only non-zero masks are stored, so a sparse set keeps level 0
// only and a dense one adds a small summary: memory is proportional to the number of members
// (about 30 bytes each when no two share a word, as with random offsets in an IPv6 /64; under two
// bytes each in a dense range), never to the range. A free offset is in the word of the start
// offset, or else found by climbing the summary to the first entry that is not full and going back
// down: at most 2×10 map lookups for the whole uint64 space, and one or two in practice.
//
// The zero Set is empty and ready to use. A Set is not safe for concurrent use; Clone gives an
// independent copy.
type Set struct {
	levels [topLevel + 1]map[uint64]uint64 // levels[0]: members; levels[k]: full children; no zero values
	n      uint64                          // number of members, saturating at math.MaxUint64
}

// Len returns the number of offsets in s. It saturates at math.MaxUint64 (all 2^64 offsets).
func (s *Set) Len() uint64 { return s.n }

// Has reports whether x is in s. It costs one map lookup.
func (s *Set) Has(x uint64) bool {
	return s.levels[0][x>>logFan]&(1<<(x%fanout)) != 0
}

// set stores mask m at level k, index i, deleting it when zero.
func (s *Set) set(k int, i, m uint64) {
	if m == 0 {
		delete(s.levels[k], i)
		return
	}
	if s.levels[k] == nil {
		s.levels[k] = make(map[uint64]uint64)
	}
	s.levels[k][i] = m
}

// Add adds x to s and reports whether it was absent. It costs one map update, plus one per
// summary level that becomes full.
func (s *Set) Add(x uint64) bool {
	i, bit := x>>logFan, uint64(1)<<(x%fanout)
	m := s.levels[0][i]
	if m&bit != 0 {
		return false
	}
	m |= bit
	s.set(0, i, m)
	for k := 1; m == allOnes && k <= topLevel; k++ {
		// Child i of level k-1 became full: mark it in its parent.
		i, bit = i>>logFan, uint64(1)<<(i%fanout)
		m = s.levels[k][i] | bit
		s.set(k, i, m)
	}
	if s.n < math.MaxUint64 {
		s.n++
	}
	return true
}

// Remove removes x from s and reports whether it was present. It costs one map update, plus one
// per summary level that stops being full.
func (s *Set) Remove(x uint64) bool {
	i, bit := x>>logFan, uint64(1)<<(x%fanout)
	m := s.levels[0][i]
	if m&bit == 0 {
		return false
	}
	wasFull := m == allOnes
	s.set(0, i, m&^bit)
	for k := 1; wasFull && k <= topLevel; k++ {
		// Child i of level k-1 is no longer full: unmark it in its parent.
		i, bit = i>>logFan, uint64(1)<<(i%fanout)
		m = s.levels[k][i]
		wasFull = m == allOnes
		s.set(k, i, m&^bit)
	}
	s.n--
	return true
}

// firstNonFullWord returns the smallest word index ≥ w whose word is not full, or false if every
// word from w to the end of the uint64 space is full.
func (s *Set) firstNonFullWord(w uint64) (uint64, bool) {
	// Climb: i is a child index at level k-1; look for a non-full sibling at or after it.
	i := w
	k := 1
	for ; ; k++ {
		if k > topLevel {
			return 0, false
		}
		g := i >> logFan
		free := ^s.levels[k][g] & (allOnes << (i % fanout))
		if k == topLevel {
			free &= topChildren
		}
		if free != 0 {
			i = g<<logFan + uint64(bits.TrailingZeros64(free))
			break
		}
		if k == topLevel {
			return 0, false
		}
		i = g + 1 // the next entry of level k, a child of level k+1
		if i == 0 || (k < topLevel-1 && i > allOnes>>(logFan*(k+1))) {
			return 0, false
		}
	}
	// Descend: i is a non-full child at level k-1; take its first non-full child until level 0.
	for k--; k > 0; k-- {
		i = i<<logFan + uint64(bits.TrailingZeros64(^s.levels[k][i]))
	}
	return i, true
}

// firstFree returns the first offset of [x, hi) that is not in s.
func (s *Set) firstFree(x, hi uint64) (uint64, bool) {
	if x >= hi {
		return 0, false
	}
	w := x >> logFan
	if free := ^s.levels[0][w] & (allOnes << (x % fanout)); free != 0 {
		return below(w<<logFan+uint64(bits.TrailingZeros64(free)), hi)
	}
	if w == allOnes>>logFan {
		return 0, false
	}
	w, ok := s.firstNonFullWord(w + 1)
	if !ok || w > (hi-1)>>logFan {
		return 0, false
	}
	// Word w is not full and every word between x and it is: its first free offset is the answer.
	return below(w<<logFan+uint64(bits.TrailingZeros64(^s.levels[0][w])), hi)
}

// below returns y, true if y < hi, else 0, false.
func below(y, hi uint64) (uint64, bool) {
	if y < hi {
		return y, true
	}
	return 0, false
}

// NextFree returns the first offset in [from, hi) that is not in s, or else the first one in
// [lo, from), and reports whether there is one. A from outside [lo, hi) is taken as lo; an empty
// [lo, hi) reports false. It does not allocate, and costs a few map lookups at any fill: one when
// the word of from has a free offset after it, and at most about 40 for the whole uint64 space.
func (s *Set) NextFree(lo, hi, from uint64) (uint64, bool) {
	if lo >= hi {
		return 0, false
	}
	if from < lo || from >= hi {
		from = lo
	}
	if x, ok := s.firstFree(from, hi); ok {
		return x, true
	}
	return s.firstFree(lo, from)
}

// All yields the offsets of s in ascending order. It sorts the words in use first: O(w log w) for
// w words before the first offset. s must not change during the iteration; iterate over a Clone
// to change s meanwhile.
func (s *Set) All() iter.Seq[uint64] {
	return func(yield func(uint64) bool) {
		for _, w := range slices.Sorted(maps.Keys(s.levels[0])) {
			for m := s.levels[0][w]; m != 0; m &= m - 1 {
				if !yield(w<<logFan + uint64(bits.TrailingZeros64(m))) {
					return
				}
			}
		}
	}
}

// Clone returns an independent copy of s. It copies the maps' memory: O(w) for w words in use.
func (s *Set) Clone() *Set {
	c := &Set{n: s.n}
	for k, m := range s.levels {
		if m != nil {
			c.levels[k] = maps.Clone(m)
		}
	}
	return c
}
