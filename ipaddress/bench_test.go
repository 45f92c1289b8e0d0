package ipaddress

import (
	"context"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// fillIndex marks n random usable offsets of a's range allocated, as informer events for objects
// of other writers would, and returns the heap bytes this took per address.
func fillIndex(a *Allocator, n uint64) float64 {
	r := rand.New(rand.NewPCG(1, 2))
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	a.mu.Lock()
	for a.index.Len() < n {
		a.index.Add(r.Uint64N(a.size))
	}
	a.mu.Unlock()
	runtime.GC()
	runtime.ReadMemStats(&after)
	if n == 0 {
		return 0
	}
	return float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n)
}

var fills = []struct {
	name string
	cidr string
	n    func(size uint64) uint64
}{
	{"v4-12/fill=0", "10.96.0.0/12", func(uint64) uint64 { return 0 }},
	{"v4-12/fill=50", "10.96.0.0/12", func(s uint64) uint64 { return s / 2 }},
	{"v4-12/fill=99", "10.96.0.0/12", func(s uint64) uint64 { return s * 99 / 100 }},
	{"v4-12/fill=99.9", "10.96.0.0/12", func(s uint64) uint64 { return s * 999 / 1000 }},
	{"v6-64/ips=1M", "fd00:1::/64", func(uint64) uint64 { return 1 << 20 }},
}

// BenchmarkPick measures what AllocateNext does locally, without the API call: under the lock, pick
// an offset of the dynamic band from a random start, mark it, and unmark it (the matching Release).
// B/ip is the index's heap per allocated address.
func BenchmarkPick(b *testing.B) {
	for _, tt := range fills {
		b.Run(tt.name, func(b *testing.B) {
			f := newFixture(b, netip.MustParsePrefix(tt.cidr), fixtureOptions{noStart: true}, WithSeed(3))
			a := f.a
			perIP := fillIndex(a, tt.n(a.size))
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				a.mu.Lock()
				off, ok := a.pickLocked()
				if !ok {
					a.mu.Unlock()
					b.Fatal("full")
				}
				a.index.Add(off)
				a.index.Remove(off)
				a.mu.Unlock()
			}
			b.ReportMetric(perIP, "B/ip")
		})
	}
}

// BenchmarkFakeAllocateNextRelease measures the whole Allocator, one AllocateNext and one Release
// through the client-go fake clientset and its informer, at the fills of BenchmarkPick. The fake's
// own cost (object tracker, watch, deep copies) dominates.
func BenchmarkFakeAllocateNextRelease(b *testing.B) {
	ctx := context.Background()
	// The fake's watchers panic when their buffer (default 100 events) is full, and the loop
	// below writes faster than the informer reads.
	defer func(n int32) { watch.DefaultChanSize = n }(watch.DefaultChanSize)
	watch.DefaultChanSize = 1 << 20
	for _, tt := range fills {
		b.Run(tt.name, func(b *testing.B) {
			f := newFixture(b, netip.MustParsePrefix(tt.cidr), fixtureOptions{simple: true}, WithSeed(3))
			a := f.a
			fillIndex(a, tt.n(a.size))
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				ip, err := a.AllocateNext(ctx, testOwner)
				if err != nil {
					b.Fatal(err)
				}
				if err := a.Release(ctx, ip); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkAPIServerAllocateNext measures AllocateNext against the real kube-apiserver with 1, 4
// and 16 concurrent callers sharing one Allocator: allocations per second and the latency
// percentiles of single calls. The addresses are deleted after each run.
func BenchmarkAPIServerAllocateNext(b *testing.B) {
	s := apiServer(b)
	ctx := context.Background()
	for _, workers := range []int{1, 4, 16} {
		b.Run("workers="+strconv.Itoa(workers), func(b *testing.B) {
			p := netip.MustParsePrefix("10.200.0.0/16")
			a := realAllocator(b, s, p, WithManagedBy("clusterip-bench"))
			lat := make([][]time.Duration, workers)
			var wg sync.WaitGroup
			next := make(chan struct{}, b.N)
			for range b.N {
				next <- struct{}{}
			}
			close(next)
			b.ResetTimer()
			start := time.Now()
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range next {
						t0 := time.Now()
						if _, err := a.AllocateNext(ctx, testOwner); err != nil {
							b.Error(err)
							return
						}
						lat[w] = append(lat[w], time.Since(t0))
					}
				}()
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			all := slices.Concat(lat...)
			slices.Sort(all)
			if len(all) > 0 {
				b.ReportMetric(float64(len(all))/elapsed.Seconds(), "ips/s")
				b.ReportMetric(ms(all[len(all)/2]), "p50-ms")
				b.ReportMetric(ms(all[len(all)*99/100]), "p99-ms")
			}
			// Delete the run's addresses in one call so that the next run starts empty.
			err := s.Client.NetworkingV1().IPAddresses().DeleteCollection(ctx, metav1.DeleteOptions{},
				metav1.ListOptions{LabelSelector: "ipaddress.kubernetes.io/managed-by=clusterip-bench"})
			if err != nil {
				b.Fatal(err)
			}
		})
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
