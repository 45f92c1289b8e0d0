package freeindex

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
)

// The ranges of the free-index targets (a pick in ≤ 1 µs at 99.9% fill): an IPv4 /12 (1048574
// usable offsets, static band of 256) and an IPv6 /64 (2^64-1 usable offsets) holding a million
// addresses.
const (
	size12 = 1<<20 - 2
	band   = 256
	size64 = math.MaxUint64
)

// fillRandom adds n distinct random offsets of [0, size) to s.
func fillRandom(s *Set, r *rand.Rand, size, n uint64) {
	for s.Len() < n {
		s.Add(r.Uint64N(size))
	}
}

// BenchmarkPick measures what AllocateNext does to the index at steady fill: pick a free offset
// of the upper band from a random start, mark it, and unmark it (the matching Release).
func BenchmarkPick(b *testing.B) {
	cases := []struct {
		name string
		size uint64
		n    uint64
	}{
		{"v4-12/fill=0", size12, 0},
		{"v4-12/fill=50", size12, size12 / 2},
		{"v4-12/fill=99", size12, size12 * 99 / 100},
		{"v4-12/fill=99.9", size12, size12 * 999 / 1000},
		{"v6-64/ips=1M", size64, 1 << 20},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			r := rand.New(rand.NewPCG(1, 2))
			var s Set
			fillRandom(&s, r, c.size, c.n)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				x, ok := s.NextFree(band, c.size, band+r.Uint64N(c.size-band))
				if !ok {
					b.Fatal("no free offset")
				}
				s.Add(x)
				s.Remove(x)
			}
			b.ReportMetric(float64(len(s.levels[0])), "words")
		})
	}
}

// BenchmarkBytesPerOffset reports the heap the Set takes per member, filled at random (the worst
// case for runs) to the same levels.
func BenchmarkBytesPerOffset(b *testing.B) {
	cases := []struct {
		name string
		size uint64
		n    uint64
	}{
		{"v4-12/fill=50", size12, size12 / 2},
		{"v4-12/fill=99.9", size12, size12 * 999 / 1000},
		{"v6-64/ips=1M", size64, 1 << 20},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			var perIP float64
			for b.Loop() {
				perIP = bytesPerOffset(c.size, c.n)
			}
			b.ReportMetric(perIP, "B/ip")
		})
	}
}

func bytesPerOffset(size, n uint64) float64 {
	r := rand.New(rand.NewPCG(5, 6))
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	s := new(Set)
	fillRandom(s, r, size, n)
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(s)
	return float64(after.HeapAlloc-before.HeapAlloc) / float64(n)
}

// TestBytesPerOffset checks the free index's memory target (at most 64 bytes per allocated
// address) in the worst case: random, mostly isolated offsets in an IPv6 /64.
func TestBytesPerOffset(t *testing.T) {
	n := uint64(200000)
	if testing.Short() {
		n = 20000
	}
	got := bytesPerOffset(size64, n)
	t.Logf("%.1f bytes per offset with %d random offsets", got, n)
	if got > 64 {
		t.Errorf("Set takes %.1f bytes per offset, want ≤ 64", got)
	}
}

func Example() {
	var s Set
	for _, x := range []uint64{3, 4, 5, 9} {
		s.Add(x)
	}
	x, _ := s.NextFree(0, 10, 4) // first free at or after 4, wrapping to 0
	fmt.Println(x, s.Len())
	x, ok := s.NextFree(9, 10, 9) // only 9, taken
	fmt.Println(x, ok)
	// Output:
	// 6 4
	// 0 false
}
