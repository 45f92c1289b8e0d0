package bitset

import (
	"bytes"
	"math/big"
	"math/rand/v2"
	"slices"
	"testing"
)

// naiveFirstFree is the model FirstFree must agree with.
func naiveFirstFree(m map[int]bool, n, from int) (int, bool) {
	for i := max(from, 0); i < n; i++ {
		if !m[i] {
			return i, true
		}
	}
	return 0, false
}

func TestSetMatchesMapModel(t *testing.T) {
	for _, n := range []int{0, 1, 63, 64, 65, 4095, 4096, 4097, 262145} {
		r := rand.New(rand.NewPCG(uint64(n), 1))
		s := New(n)
		m := map[int]bool{}
		for step := range 4000 {
			i := r.IntN(n+2) - 1
			if n > 64 && step%3 == 0 {
				// Fill a run so that whole words and summaries become full.
				base := r.IntN(n)
				for j := base; j < min(base+200, n); j++ {
					s.Add(j)
					m[j] = true
				}
				continue
			}
			inRange := i >= 0 && i < n
			if r.IntN(2) == 0 {
				if got, want := s.Add(i), inRange && !m[i]; got != want {
					t.Fatalf("n=%d Add(%d) = %v, want %v", n, i, got, want)
				}
				if inRange {
					m[i] = true
				}
			} else {
				if got, want := s.Remove(i), m[i]; got != want {
					t.Fatalf("n=%d Remove(%d) = %v, want %v", n, i, got, want)
				}
				delete(m, i)
			}
			from := r.IntN(n + 1)
			gi, gok := s.FirstFree(from)
			wi, wok := naiveFirstFree(m, n, from)
			if gi != wi || gok != wok {
				t.Fatalf("n=%d FirstFree(%d) = %d, %v; want %d, %v", n, from, gi, gok, wi, wok)
			}
			if s.Len() != len(m) {
				t.Fatalf("n=%d Len() = %d, want %d", n, s.Len(), len(m))
			}
		}
		got := slices.Collect(s.All())
		var want []int
		for i := range m {
			want = append(want, i)
		}
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("n=%d All() differs from the model", n)
		}
	}
}

func TestFirstFreeFullAndWrap(t *testing.T) {
	s := New(200)
	for i := range 200 {
		s.Add(i)
	}
	if i, ok := s.FirstFree(0); ok {
		t.Fatalf("FirstFree on a full set = %d, true", i)
	}
	s.Remove(7)
	tests := []struct {
		lo, hi, from int
		want         int
		ok           bool
	}{
		{0, 200, 0, 7, true},
		{0, 200, 100, 7, true}, // wraps
		{8, 200, 100, 0, false},
		{0, 7, 3, 0, false},
		{7, 8, 7, 7, true},
		{0, 200, -5, 7, true}, // from outside is lo
		{5, 5, 5, 0, false},
	}
	for _, tt := range tests {
		got, ok := s.nextFree(tt.lo, tt.hi, tt.from)
		if got != tt.want || ok != tt.ok {
			t.Errorf("nextFree(%d, %d, %d) = %d, %v; want %d, %v", tt.lo, tt.hi, tt.from, got, ok, tt.want, tt.ok)
		}
	}
}

func TestBigEndianMatchesMathBig(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	for _, n := range []int{1, 8, 9, 64, 65, 254, 65535, 1048574} {
		s := New(n)
		want := new(big.Int)
		for range min(n, 500) {
			i := r.IntN(n)
			s.Add(i)
			want.SetBit(want, i, 1)
		}
		got := s.AppendBigEndian(nil)
		if !bytes.Equal(got, want.Bytes()) {
			t.Fatalf("n=%d AppendBigEndian differs from big.Int.Bytes", n)
		}
		c := New(n)
		if err := c.SetBigEndian(append([]byte{0, 0}, got...)); err != nil {
			t.Fatalf("n=%d SetBigEndian: %v", n, err)
		}
		if !slices.Equal(slices.Collect(c.All()), slices.Collect(s.All())) || c.Len() != s.Len() {
			t.Fatalf("n=%d SetBigEndian(AppendBigEndian(s)) != s", n)
		}
	}
}

func TestSetBigEndianRejectsBitsBeyondLength(t *testing.T) {
	s := New(10)
	s.Add(3)
	for _, data := range [][]byte{{0x04, 0x00}, {0x01, 0x00, 0x00}} { // bit 10; bit 16
		if err := s.SetBigEndian(data); err != ErrTooLarge {
			t.Errorf("SetBigEndian(%x) = %v, want ErrTooLarge", data, err)
		}
	}
	if !s.Has(3) || s.Len() != 1 {
		t.Errorf("a rejected SetBigEndian changed the set")
	}
	if err := s.SetBigEndian([]byte{0x02, 0x00}); err != nil { // bit 9 is the last one
		t.Errorf("SetBigEndian(bit 9) = %v", err)
	}
}

func TestEmptySetEncodesToNothing(t *testing.T) {
	if got := New(100).AppendBigEndian(nil); len(got) != 0 {
		t.Errorf("AppendBigEndian of an empty set = %x, want nothing", got)
	}
	if got := New(0).AppendBigEndian(nil); len(got) != 0 {
		t.Errorf("AppendBigEndian of a zero-length set = %x, want nothing", got)
	}
}
