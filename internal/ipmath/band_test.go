package ipmath

import (
	"math/rand/v2"
	"testing"
)

// boolIndex is a naive FreeIndex: true marks a taken offset.
type boolIndex []bool

func (b boolIndex) NextFree(lo, hi, from uint64) (uint64, bool) {
	if from < lo || from >= hi {
		from = lo
	}
	for i := from; i < hi; i++ {
		if !b[i] {
			return i, true
		}
	}
	for i := lo; i < from; i++ {
		if !b[i] {
			return i, true
		}
	}
	return 0, false
}

// TestPickOffsetSkippingMatchesPickOffsetOverRefusedOffsets checks PickOffsetSkipping against its
// model: with the same random draws, it picks what PickOffset picks once the refused offsets are
// marked taken, and calls skip only for free offsets.
func TestPickOffsetSkippingMatchesPickOffsetOverRefusedOffsets(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 5000 {
		size := 1 + r.Uint64N(80)
		band := r.Uint64N(size + 2)
		taken, refused := make(boolIndex, size), make([]bool, size)
		pTaken, pRefused := r.Float64(), r.Float64()
		for off := range size {
			taken[off] = r.Float64() < pTaken
			refused[off] = r.Float64() < pRefused
		}
		model := make(boolIndex, size)
		for off := range size {
			model[off] = taken[off] || refused[off]
		}
		seed := r.Uint64()
		wantOff, wantOK := PickOffset(model, size, band, rand.New(rand.NewPCG(seed, 0)))
		asked := map[uint64]int{}
		gotOff, gotOK := PickOffsetSkipping(taken, size, band, rand.New(rand.NewPCG(seed, 0)), func(off uint64) bool {
			if taken[off] {
				t.Fatalf("case %d: skip(%d) called for a taken offset", i, off)
			}
			asked[off]++
			return refused[off]
		})
		if gotOff != wantOff || gotOK != wantOK {
			t.Fatalf("case %d (size %d, band %d, taken %v, refused %v): PickOffsetSkipping() = %d, %v; want %d, %v",
				i, size, band, taken, refused, gotOff, gotOK, wantOff, wantOK)
		}
		for off, n := range asked {
			if n > 1 {
				t.Fatalf("case %d: skip(%d) called %d times, want at most once", i, off, n)
			}
		}
	}
}

func TestPickOffsetSkippingNilSkipIsPickOffset(t *testing.T) {
	idx := boolIndex{true, false, true, false, false, true, false, false}
	for seed := range uint64(50) {
		want, wantOK := PickOffset(idx, 8, 2, rand.New(rand.NewPCG(seed, 0)))
		got, ok := PickOffsetSkipping(idx, 8, 2, rand.New(rand.NewPCG(seed, 0)), nil)
		if got != want || ok != wantOK {
			t.Errorf("seed %d: PickOffsetSkipping(nil) = %d, %v; want %d, %v", seed, got, ok, want, wantOK)
		}
	}
}
