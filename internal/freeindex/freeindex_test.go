package freeindex

import (
	"maps"
	"math"
	"math/bits"
	"math/rand/v2"
	"slices"
	"testing"
)

// model is the naive reference: a map of members.
type model map[uint64]bool

func (m model) nextFree(lo, hi, from uint64) (uint64, bool) {
	if lo >= hi {
		return 0, false
	}
	if from < lo || from >= hi {
		from = lo
	}
	for x := from; x < hi; x++ {
		if !m[x] {
			return x, true
		}
	}
	for x := lo; x < from; x++ {
		if !m[x] {
			return x, true
		}
	}
	return 0, false
}

func (m model) sorted() []uint64 {
	var out []uint64
	for x := range m {
		out = append(out, x)
	}
	slices.Sort(out)
	return out
}

// checkSet verifies the invariants of a Set: no zero masks stored, every summary bit set exactly
// when its child is full, and Len counts the members.
func checkSet(t *testing.T, s *Set) {
	t.Helper()
	var n uint64
	for _, m := range s.levels[0] {
		n += uint64(bits.OnesCount64(m))
	}
	if n != s.n {
		t.Fatalf("words hold %d offsets, Len() = %d", n, s.n)
	}
	for k := 0; k < topLevel; k++ {
		want := map[uint64]uint64{}
		for i, m := range s.levels[k] {
			if m == 0 {
				t.Fatalf("level %d stores a zero mask at %d", k, i)
			}
			if m == allOnes {
				want[i>>logFan] |= 1 << (i % fanout)
			}
		}
		if got := s.levels[k+1]; !maps.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
			t.Fatalf("level %d = %v, want %v", k+1, got, want)
		}
	}
}

// TestSetMatchesMapModel applies random Add/Remove/Has/NextFree calls to a Set and to a map and
// compares every answer: in small spans where words fill up and empty often, at the bottom and at
// the top of the uint64 range, at low and at high fill.
func TestSetMatchesMapModel(t *testing.T) {
	tests := []struct {
		name  string
		base  uint64
		span  uint64
		adds  int // out of 10 operations
		steps int
	}{
		{"bottom/low", 0, 300, 4, 20000},
		{"bottom/high", 0, 300, 6, 20000},
		{"top/high", math.MaxUint64 - 299, 300, 6, 20000},
		{"top/low", math.MaxUint64 - 299, 300, 3, 20000},
		{"unaligned/high", 1<<40 + 17, 200, 6, 20000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, uint64(len(tt.name))))
			var s Set
			m := model{}
			for i := range tt.steps {
				x := tt.base + r.Uint64N(tt.span)
				switch op := r.IntN(10); {
				case op < tt.adds:
					if got, want := s.Add(x), !m[x]; got != want {
						t.Fatalf("step %d: Add(%d) = %v, want %v", i, x, got, want)
					}
					m[x] = true
				case op < 8:
					if got, want := s.Remove(x), m[x]; got != want {
						t.Fatalf("step %d: Remove(%d) = %v, want %v", i, x, got, want)
					}
					delete(m, x)
				case op < 9:
					if got, want := s.Has(x), m[x]; got != want {
						t.Fatalf("step %d: Has(%d) = %v, want %v", i, x, got, want)
					}
				default:
					lo := tt.base + r.Uint64N(tt.span)
					hi := tt.base + r.Uint64N(tt.span) + 1
					if tt.base+tt.span == 0 && r.IntN(4) == 0 {
						hi = math.MaxUint64
					}
					got, gotOK := s.NextFree(lo, hi, x)
					want, wantOK := m.nextFree(lo, hi, x)
					if got != want || gotOK != wantOK {
						t.Fatalf("step %d: NextFree(%d, %d, %d) = %d, %v, want %d, %v", i, lo, hi, x, got, gotOK, want, wantOK)
					}
				}
				if s.Len() != uint64(len(m)) {
					t.Fatalf("step %d: Len() = %d, want %d", i, s.Len(), len(m))
				}
				if i%500 == 0 {
					checkSet(t, &s)
					if got, want := slices.Collect(s.All()), m.sorted(); !slices.Equal(got, want) {
						t.Fatalf("step %d: All() = %v, want %v", i, got, want)
					}
				}
			}
		})
	}
}

func TestNextFreeEdges(t *testing.T) {
	var s Set
	for x := range uint64(10) {
		s.Add(x)
	}
	s.Add(math.MaxUint64)
	s.Add(math.MaxUint64 - 1)
	tests := []struct {
		name         string
		lo, hi, from uint64
		want         uint64
		wantOK       bool
	}{
		{"after run", 0, 100, 3, 10, true},
		{"run reaches hi", 0, 10, 3, 0, false},
		{"empty range", 5, 5, 5, 0, false},
		{"from below lo", 20, 30, 3, 20, true},
		{"from at hi", 20, 30, 30, 20, true},
		{"wrap", 0, 12, 11, 11, true},
		{"wrap to lo", 5, 12, 11, 11, true},
		{"top full", math.MaxUint64 - 1, math.MaxUint64, math.MaxUint64 - 1, 0, false},
		{"below top", math.MaxUint64 - 3, math.MaxUint64, math.MaxUint64 - 1, math.MaxUint64 - 3, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := s.NextFree(tt.lo, tt.hi, tt.from)
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("NextFree(%d, %d, %d) = %d, %v, want %d, %v", tt.lo, tt.hi, tt.from, got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

func TestZeroSet(t *testing.T) {
	var s Set
	if s.Has(0) || s.Remove(0) || s.Len() != 0 {
		t.Fatal("zero Set is not empty")
	}
	if x, ok := s.NextFree(0, math.MaxUint64, 7); x != 7 || !ok {
		t.Errorf("NextFree on zero Set = %d, %v, want 7, true", x, ok)
	}
	if got := slices.Collect(s.All()); len(got) != 0 {
		t.Errorf("All() = %v, want none", got)
	}
	if c := s.Clone(); c.Len() != 0 {
		t.Errorf("Clone().Len() = %d", c.Len())
	}
}

func TestCloneIsIndependent(t *testing.T) {
	var s Set
	for x := range uint64(1000) {
		s.Add(x * 2)
	}
	c := s.Clone()
	done := make(chan []uint64)
	go func() { done <- slices.Collect(c.All()) }()
	for x := range uint64(1000) {
		s.Remove(x * 2)
		s.Add(x*2 + 1)
	}
	got := <-done
	if len(got) != 1000 || got[0] != 0 || got[999] != 1998 {
		t.Fatalf("clone changed with the original: %d members, first %d", len(got), got[0])
	}
	if !s.Has(1) || s.Has(0) || c.Has(1) || !c.Has(0) {
		t.Fatal("original and clone are not independent")
	}
}

// TestFullWordsAcrossTheSpace fills whole words and checks that NextFree jumps over them.
func TestFullWordsAcrossTheSpace(t *testing.T) {
	var s Set
	// Fill words 0..99 and the last two words of the uint64 range (whose summaries reach the top).
	for x := range uint64(100 * fanout) {
		s.Add(x)
	}
	for x := uint64(math.MaxUint64 - 2*fanout + 1); ; x++ {
		s.Add(x)
		if x == math.MaxUint64 {
			break
		}
	}
	checkSet(t, &s)
	if x, ok := s.NextFree(0, math.MaxUint64, 5); x != 100*fanout || !ok {
		t.Errorf("NextFree(0, max, 5) = %d, %v, want %d", x, ok, 100*fanout)
	}
	if x, ok := s.NextFree(0, 100*fanout, 5); ok {
		t.Errorf("NextFree over full words = %d, want none", x)
	}
	top := uint64(math.MaxUint64 - 2*fanout + 1)
	if x, ok := s.NextFree(top, math.MaxUint64, top+3); ok {
		t.Errorf("NextFree at the top = %d, want none", x)
	}
	s.Remove(50*fanout + 7)
	if x, ok := s.NextFree(0, 100*fanout, 60*fanout); x != 50*fanout+7 || !ok {
		t.Errorf("NextFree wrapping = %d, %v, want %d", x, ok, 50*fanout+7)
	}
	checkSet(t, &s)
}

func TestHotPathsDoNotAllocate(t *testing.T) {
	var s Set
	r := rand.New(rand.NewPCG(3, 4))
	for range 100000 {
		s.Add(r.Uint64N(1 << 20))
	}
	var sink uint64
	allocs := testing.AllocsPerRun(1000, func() {
		x, _ := s.NextFree(256, 1<<20, r.Uint64N(1<<20))
		if s.Has(x) {
			sink++
		}
	})
	if allocs != 0 {
		t.Errorf("NextFree+Has allocate %.1f times per call, want 0", allocs)
	}
	// Add then Remove of a free offset: the tree reuses its nodes.
	allocs = testing.AllocsPerRun(1000, func() {
		x, _ := s.NextFree(256, 1<<20, r.Uint64N(1<<20))
		s.Add(x)
		s.Remove(x)
	})
	if allocs > 0.1 {
		t.Errorf("pick+Add+Remove allocates %.2f times per call, want ~0", allocs)
	}
	_ = sink
}

// TestTopEntryCoversAllSixteenChildren checks the climb to the top of the summary, which only a
// set with a full 2^62 offsets reaches: the state is written into the levels directly. The first
// four level-9 entries (offsets 0 … 2^62-1) are full, so the first free offset is 2^62, under
// level-9 entry 4, which the top entry must consider as much as entries 0 to 3.
func TestTopEntryCoversAllSixteenChildren(t *testing.T) {
	var s Set
	s.levels[0] = map[uint64]uint64{0: allOnes}
	for k := 1; k < topLevel; k++ {
		s.levels[k] = map[uint64]uint64{0: allOnes}
	}
	s.levels[topLevel] = map[uint64]uint64{0: 0b1111}
	got, ok := s.NextFree(0, math.MaxUint64, 0)
	if want := uint64(1) << 62; got != want || !ok {
		t.Errorf("NextFree(0, MaxUint64, 0) = %d, %v, want %d, true", got, ok, want)
	}
}
