// Package bitset is a fixed-size set of small integers kept as a hierarchy of bit words, so that
// finding the next free (non-member) integer costs a few word operations per level at any fill instead of a scan.
//
// Level 0 holds one bit per element (1 = member). Each higher level holds one bit per word of the
// level below, set exactly when that word is full. The top level is a single word. A set of n bits
// has ⌈log64 n⌉ levels: two for 4096 elements, four for 16 million.
package bitset

import (
	"encoding/binary"
	"errors"
	"iter"
	"math/bits"
	"slices"
)

// ErrTooLarge is returned by SetBigEndian when the data has a bit at or beyond the set's capacity.
var ErrTooLarge = errors.New("bitset: data has bits beyond the set's capacity")

// Set is a set of the integers [0, Cap()). The zero Set is empty with capacity 0.
// A Set is not safe for concurrent use.
type Set struct {
	n      int
	count  int
	levels [][]uint64 // levels[0] = members; levels[k+1] bit j = levels[k] word j is full
	nbits  []int      // number of meaningful bits of each level
}

// New returns an empty set of the integers [0, n). n < 0 is taken as 0.
func New(n int) *Set {
	n = max(n, 0)
	s := &Set{n: n}
	for nb := n; ; nb = words(nb) {
		s.levels = append(s.levels, make([]uint64, words(nb)))
		s.nbits = append(s.nbits, nb)
		if nb <= 64 {
			break
		}
	}
	return s
}

func words(nbits int) int { return (nbits + 63) >> 6 }

// Cap returns the number of integers the set can hold: its capacity, fixed by New.
func (s *Set) Cap() int { return s.n }

// Len returns the number of members.
func (s *Set) Len() int { return s.count }

// Has reports whether i is a member. Out-of-range i reports false.
func (s *Set) Has(i int) bool {
	if i < 0 || i >= s.n {
		return false
	}
	return s.levels[0][i>>6]&(1<<(i&63)) != 0
}

// Add adds i and reports whether it was absent. Out-of-range i reports false.
func (s *Set) Add(i int) bool {
	if i < 0 || i >= s.n || s.Has(i) {
		return false
	}
	s.count++
	for lv := 0; lv < len(s.levels); lv++ {
		wi := i >> 6
		s.levels[lv][wi] |= 1 << (i & 63)
		if s.levels[lv][wi] != s.fullWord(lv, wi) {
			break
		}
		i = wi // the word just became full: mark it in the level above
	}
	return true
}

// Remove removes i and reports whether it was present. Out-of-range i reports false.
func (s *Set) Remove(i int) bool {
	if !s.Has(i) {
		return false
	}
	s.count--
	for lv := 0; lv < len(s.levels); lv++ {
		wi := i >> 6
		wasFull := s.levels[lv][wi] == s.fullWord(lv, wi)
		s.levels[lv][wi] &^= 1 << (i & 63)
		if !wasFull {
			break
		}
		i = wi // the word is no longer full: clear its mark in the level above
	}
	return true
}

// fullWord returns the value word wi of level lv has when every meaningful bit is set.
func (s *Set) fullWord(lv, wi int) uint64 {
	if rest := s.nbits[lv] - wi<<6; rest < 64 {
		return 1<<rest - 1
	}
	return ^uint64(0)
}

// FirstFree returns the smallest non-member i with from <= i < Cap(), and reports whether there is
// one. Its cost grows with the number of levels, not with the number of members.
func (s *Set) FirstFree(from int) (int, bool) {
	return s.firstFreeAt(0, max(from, 0))
}

func (s *Set) firstFreeAt(lv, from int) (int, bool) {
	if from >= s.nbits[lv] {
		return 0, false
	}
	ws := s.levels[lv]
	wi := from >> 6
	if w := ws[wi] | (1<<(from&63) - 1); w != s.fullWord(lv, wi) {
		return wi<<6 + bits.TrailingZeros64(^w), true
	}
	if lv+1 == len(s.levels) {
		return 0, false
	}
	// The rest of word wi is full: the level above knows the next word that is not.
	wj, ok := s.firstFreeAt(lv+1, wi+1)
	if !ok {
		return 0, false
	}
	return wj<<6 + bits.TrailingZeros64(^ws[wj]), true
}

// nextFree returns a non-member in [lo, hi), looking first at [from, hi) and then wrapping
// to [lo, from), and reports whether there is one. from outside [lo, hi) is taken as lo.
func (s *Set) nextFree(lo, hi, from int) (int, bool) {
	lo, hi = max(lo, 0), min(hi, s.n)
	if lo >= hi {
		return 0, false
	}
	if from < lo || from >= hi {
		from = lo
	}
	if i, ok := s.FirstFree(from); ok && i < hi {
		return i, true
	}
	if i, ok := s.FirstFree(lo); ok && i < from {
		return i, true
	}
	return 0, false
}

// NextFree is nextFree for uint64 bounds, so that a Set serves as an ipmath.FreeIndex.
func (s *Set) NextFree(lo, hi, from uint64) (uint64, bool) {
	n := uint64(s.n)
	i, ok := s.nextFree(int(min(lo, n)), int(min(hi, n)), int(min(from, n)))
	return uint64(i), ok
}

// All yields the members in ascending order. The set must not change during iteration.
func (s *Set) All() iter.Seq[int] {
	return func(yield func(int) bool) {
		for wi, w := range s.levels[0] {
			for w != 0 {
				b := bits.TrailingZeros64(w)
				if !yield(wi<<6 + b) {
					return
				}
				w &= w - 1
			}
		}
	}
}

// Clone returns an independent copy of s.
func (s *Set) Clone() *Set {
	c := &Set{n: s.n, count: s.count, nbits: s.nbits}
	c.levels = make([][]uint64, len(s.levels))
	for i, l := range s.levels {
		c.levels[i] = append([]uint64(nil), l...)
	}
	return c
}

// AppendBigEndian appends the members to dst as the big-endian bytes of the integer whose bit i is
// set for each member i, without leading zero bytes: the encoding of math/big's Int.Bytes, which
// kube-apiserver stores. An empty set appends nothing.
func (s *Set) AppendBigEndian(dst []byte) []byte {
	ws := s.levels[0]
	top := len(ws) - 1
	for top >= 0 && ws[top] == 0 {
		top--
	}
	if top < 0 {
		return dst
	}
	lead := bits.LeadingZeros64(ws[top]) / 8
	n := (top+1)*8 - lead
	start := len(dst)
	dst = slices.Grow(dst, n)[:start+n]
	out := dst[start:]
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], ws[top])
	pos := copy(out, b[lead:])
	for k := top - 1; k >= 0; k-- {
		binary.BigEndian.PutUint64(out[pos:], ws[k])
		pos += 8
	}
	return dst
}

// SetBigEndian replaces the members with those encoded in data as by AppendBigEndian (leading zero
// bytes allowed). It returns ErrTooLarge, leaving s unchanged, if data has a bit at or beyond Cap().
// It allocates nothing.
func (s *Set) SetBigEndian(data []byte) error {
	for len(data) > 0 && data[0] == 0 {
		data = data[1:]
	}
	if len(data) > 0 && (len(data)-1)*8+bits.Len8(data[0]) > s.n {
		return ErrTooLarge
	}
	ws := s.levels[0]
	clear(ws)
	k := 0
	for end := len(data); end > 0; end -= 8 {
		if end >= 8 {
			ws[k] = binary.BigEndian.Uint64(data[end-8 : end])
		} else {
			var b [8]byte
			copy(b[8-end:], data[:end])
			ws[k] = binary.BigEndian.Uint64(b[:])
		}
		k++
	}
	s.rebuild()
	return nil
}

// rebuild recomputes the count and every level above 0 from level 0.
func (s *Set) rebuild() {
	s.count = 0
	for _, w := range s.levels[0] {
		s.count += bits.OnesCount64(w)
	}
	for lv := 1; lv < len(s.levels); lv++ {
		up := s.levels[lv]
		clear(up)
		for wi, w := range s.levels[lv-1] {
			if w == s.fullWord(lv-1, wi) {
				up[wi>>6] |= 1 << (wi & 63)
			}
		}
	}
}
