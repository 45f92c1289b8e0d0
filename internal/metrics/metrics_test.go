package metrics

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/bitmaptest"
	"github.com/kube-ipam/clusterip/internal/metrics/metricstest"
)

const (
	allocated   = "kube_apiserver_clusterip_allocator_allocated_ips"
	available   = "kube_apiserver_clusterip_allocator_available_ips"
	allocations = "kube_apiserver_clusterip_allocator_allocation_total"
	errorsTotal = "kube_apiserver_clusterip_allocator_allocation_errors_total"
	duration    = "kube_apiserver_clusterip_allocator_allocation_duration_seconds"
	notReady    = "clusterip_allocator_not_ready_total"
	undos       = "clusterip_allocator_dualwrite_undo_total"
	undoErrors  = "clusterip_allocator_dualwrite_undo_errors_total"

	batches      = "clusterip_allocator_bitmap_batches_total"
	casWrites    = "clusterip_allocator_bitmap_cas_writes_total"
	casConflicts = "clusterip_allocator_bitmap_cas_conflicts_total"
	casRetries   = "clusterip_allocator_bitmap_cas_retries_total"
)

// wrapped returns a bitmap allocator of cidr wrapped by a Recorder on a fresh registry.
func wrapped(t *testing.T, cidr string) (*Allocator, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	return newRecorder(t, reg).Wrap(newBitmap(t, cidr), Source{Label: cidr}), reg
}

// newRecorder returns New(reg), failing t on an error.
func newRecorder(t *testing.T, reg prometheus.Registerer) *Recorder {
	t.Helper()
	rec, err := New(reg)
	if err != nil {
		t.Fatalf("New() = %v", err)
	}
	return rec
}

// newBitmap returns a bitmap allocator of cidr, failing t on an error.
func newBitmap(t *testing.T, cidr string) *bitmap.Allocator {
	t.Helper()
	a, err := bitmap.New(netip.MustParsePrefix(cidr))
	if err != nil {
		t.Fatalf("bitmap.New(%s) = %v", cidr, err)
	}
	return a
}

func TestGaugesSeededWhenWrapped(t *testing.T) {
	_, reg := wrapped(t, "10.0.0.0/24")
	metricstest.Compare(t, reg, `
kube_apiserver_clusterip_allocator_allocated_ips{cidr="10.0.0.0/24"} 0
kube_apiserver_clusterip_allocator_available_ips{cidr="10.0.0.0/24"} 254
`, allocated, available)
}

func TestCountsPerScope(t *testing.T) {
	ctx := context.Background()
	a, reg := wrapped(t, "10.0.0.0/29") // 6 usable addresses
	for range 3 {
		if _, err := a.AllocateNext(ctx, allocator.Owner{}); err != nil {
			t.Fatalf("AllocateNext() = %v", err)
		}
	}
	ip := netip.MustParseAddr("10.0.0.1")
	for a.Has(ip) { // three of the six are taken at random: take the first free one
		ip = ip.Next()
	}
	if err := a.Allocate(ctx, ip, allocator.Owner{}); err != nil {
		t.Fatalf("Allocate(%v) = %v", ip, err)
	}
	// Static errors: taken, out of range, invalid.
	if err := a.Allocate(ctx, ip, allocator.Owner{}); !errors.Is(err, allocator.ErrAllocated) {
		t.Fatalf("Allocate(%v) again = %v, want ErrAllocated", ip, err)
	}
	if err := a.Allocate(ctx, netip.MustParseAddr("10.0.1.1"), allocator.Owner{}); err == nil {
		t.Fatal("Allocate(10.0.1.1) = nil, want a range error")
	}
	if err := a.Allocate(ctx, netip.Addr{}, allocator.Owner{}); err == nil {
		t.Fatal("Allocate(invalid) = nil, want an error")
	}
	for range 2 {
		if _, err := a.AllocateNext(ctx, allocator.Owner{}); err != nil {
			t.Fatalf("AllocateNext() = %v", err)
		}
	}
	if _, err := a.AllocateNext(ctx, allocator.Owner{}); !errors.Is(err, allocator.ErrFull) {
		t.Fatalf("AllocateNext() on a full range = %v, want ErrFull", err)
	}
	if err := a.Release(ctx, ip); err != nil {
		t.Fatalf("Release(%v) = %v", ip, err)
	}
	metricstest.Compare(t, reg, `
kube_apiserver_clusterip_allocator_allocated_ips{cidr="10.0.0.0/29"} 5
kube_apiserver_clusterip_allocator_available_ips{cidr="10.0.0.0/29"} 1
kube_apiserver_clusterip_allocator_allocation_total{cidr="10.0.0.0/29",scope="dynamic"} 5
kube_apiserver_clusterip_allocator_allocation_total{cidr="10.0.0.0/29",scope="static"} 1
kube_apiserver_clusterip_allocator_allocation_errors_total{cidr="10.0.0.0/29",scope="dynamic"} 1
kube_apiserver_clusterip_allocator_allocation_errors_total{cidr="10.0.0.0/29",scope="static"} 3
`, allocated, available, allocations, errorsTotal)
	if got, want := testutil.CollectAndCount(a.rec.duration, duration), 1; got != want {
		t.Errorf("%s series = %d, want %d", duration, got, want)
	}
}

func TestDurationHasKubeAPIServerBuckets(t *testing.T) {
	ctx := context.Background()
	a, reg := wrapped(t, "10.0.0.0/24")
	a.now = func() func() time.Time {
		// Each call to now is 30 ms after the previous one: every allocation takes 30 ms.
		t0 := time.Unix(0, 0)
		return func() time.Time { t0 = t0.Add(30 * time.Millisecond); return t0 }
	}()
	if _, err := a.AllocateNext(ctx, allocator.Owner{}); err != nil {
		t.Fatalf("AllocateNext() = %v", err)
	}
	metricstest.Compare(t, reg, `
kube_apiserver_clusterip_allocator_allocation_duration_seconds_bucket{cidr="10.0.0.0/24",le="0.005"} 0
kube_apiserver_clusterip_allocator_allocation_duration_seconds_bucket{cidr="10.0.0.0/24",le="0.01"} 0
kube_apiserver_clusterip_allocator_allocation_duration_seconds_bucket{cidr="10.0.0.0/24",le="0.025"} 0
kube_apiserver_clusterip_allocator_allocation_duration_seconds_bucket{cidr="10.0.0.0/24",le="0.05"} 1
kube_apiserver_clusterip_allocator_allocation_duration_seconds_bucket{cidr="10.0.0.0/24",le="0.1"} 1
kube_apiserver_clusterip_allocator_allocation_duration_seconds_bucket{cidr="10.0.0.0/24",le="0.25"} 1
kube_apiserver_clusterip_allocator_allocation_duration_seconds_bucket{cidr="10.0.0.0/24",le="0.5"} 1
kube_apiserver_clusterip_allocator_allocation_duration_seconds_bucket{cidr="10.0.0.0/24",le="1"} 1
kube_apiserver_clusterip_allocator_allocation_duration_seconds_bucket{cidr="10.0.0.0/24",le="2.5"} 1
kube_apiserver_clusterip_allocator_allocation_duration_seconds_bucket{cidr="10.0.0.0/24",le="5"} 1
kube_apiserver_clusterip_allocator_allocation_duration_seconds_bucket{cidr="10.0.0.0/24",le="10"} 1
kube_apiserver_clusterip_allocator_allocation_duration_seconds_bucket{cidr="10.0.0.0/24",le="+Inf"} 1
kube_apiserver_clusterip_allocator_allocation_duration_seconds_sum{cidr="10.0.0.0/24"} 0.03
kube_apiserver_clusterip_allocator_allocation_duration_seconds_count{cidr="10.0.0.0/24"} 1
`, duration)
}

// notReadyAllocator refuses every allocation with ErrNotReady.
type notReadyAllocator struct{ allocator.Interface }

func (notReadyAllocator) Allocate(context.Context, netip.Addr, allocator.Owner) error {
	return allocator.ErrNotReady
}

func (notReadyAllocator) AllocateNext(context.Context, allocator.Owner) (netip.Addr, error) {
	return netip.Addr{}, fmt.Errorf("wrapped: %w", allocator.ErrNotReady)
}

func TestNotReadyIsARefusalNotAnError(t *testing.T) {
	ctx := context.Background()
	reg := prometheus.NewPedanticRegistry()
	rec, inner := newRecorder(t, reg), newBitmap(t, "10.0.0.0/24")
	a := rec.Wrap(notReadyAllocator{inner}, Source{Label: "10.0.0.0/24"})
	if err := a.Allocate(ctx, netip.MustParseAddr("10.0.0.7"), allocator.Owner{}); !errors.Is(err, allocator.ErrNotReady) {
		t.Fatalf("Allocate() = %v, want ErrNotReady", err)
	}
	for range 2 {
		if _, err := a.AllocateNext(ctx, allocator.Owner{}); !errors.Is(err, allocator.ErrNotReady) {
			t.Fatalf("AllocateNext() = %v, want ErrNotReady", err)
		}
	}
	metricstest.Compare(t, reg, `
clusterip_allocator_not_ready_total{cidr="10.0.0.0/24",scope="dynamic"} 2
clusterip_allocator_not_ready_total{cidr="10.0.0.0/24",scope="static"} 1
`, notReady, errorsTotal, allocations)
}

func TestDryRunIsNotCounted(t *testing.T) {
	ctx := context.Background()
	a, reg := wrapped(t, "10.0.0.0/24")
	dry := a.DryRun()
	if _, err := dry.AllocateNext(ctx, allocator.Owner{}); err != nil {
		t.Fatalf("DryRun().AllocateNext() = %v", err)
	}
	if err := dry.Allocate(ctx, netip.MustParseAddr("10.0.0.9"), allocator.Owner{}); err != nil {
		t.Fatalf("DryRun().Allocate() = %v", err)
	}
	if err := dry.Allocate(ctx, netip.MustParseAddr("10.9.0.9"), allocator.Owner{}); err == nil {
		t.Fatal("DryRun().Allocate(out of range) = nil, want an error")
	}
	if got, err := testutil.GatherAndCount(reg, allocations, errorsTotal, duration, notReady); err != nil || got != 0 {
		t.Errorf("allocation series after dry runs = %d, %v; want 0, nil", got, err)
	}
	metricstest.Compare(t, reg, `
kube_apiserver_clusterip_allocator_allocated_ips{cidr="10.0.0.0/24"} 0
`, allocated)
}

func TestUndoCountersReadFromSource(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	rec, inner := newRecorder(t, reg), newBitmap(t, "fd00::/120")
	undone, failed := uint64(4), uint64(1)
	rec.Wrap(inner, Source{Label: "fd00::/120", Undos: func() (uint64, uint64) { return undone, failed }})
	metricstest.Compare(t, reg, `
clusterip_allocator_dualwrite_undo_total{cidr="fd00::/120"} 4
clusterip_allocator_dualwrite_undo_errors_total{cidr="fd00::/120"} 1
`, undos, undoErrors)
}

func TestNewTwiceOnOneRegistryShares(t *testing.T) {
	ctx := context.Background()
	reg := prometheus.NewPedanticRegistry()
	var ws []*Allocator
	for _, cidr := range []string{"10.0.0.0/24", "10.1.0.0/24"} {
		ws = append(ws, newRecorder(t, reg).Wrap(newBitmap(t, cidr), Source{Label: cidr}))
	}
	for _, w := range ws {
		if _, err := w.AllocateNext(ctx, allocator.Owner{}); err != nil {
			t.Fatalf("AllocateNext() = %v", err)
		}
	}
	if err := ws[1].Close(); err != nil {
		t.Fatalf("Close() = %v", err)
	}
	metricstest.Compare(t, reg, `
kube_apiserver_clusterip_allocator_allocated_ips{cidr="10.0.0.0/24"} 1
kube_apiserver_clusterip_allocator_allocation_total{cidr="10.0.0.0/24",scope="dynamic"} 1
kube_apiserver_clusterip_allocator_allocation_total{cidr="10.1.0.0/24",scope="dynamic"} 1
`, allocated, allocations)
}

func TestNewRejectsNilRegisterer(t *testing.T) {
	if _, err := New(nil); err == nil {
		t.Error("New(nil) = nil error, want one")
	}
}

// Concurrent allocations, releases and scrapes: the counts add up and the gauges match the
// allocator once the calls are done.
func TestConcurrentCallsAndScrapes(t *testing.T) {
	ctx := context.Background()
	a, reg := wrapped(t, "10.0.0.0/22") // 1022 usable addresses
	const workers, each = 8, 50
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				ip, err := a.AllocateNext(ctx, allocator.Owner{})
				if err != nil {
					t.Errorf("AllocateNext() = %v", err)
					return
				}
				if i%2 == 0 {
					if err := a.Release(ctx, ip); err != nil {
						t.Errorf("Release(%v) = %v", ip, err)
					}
				}
				if w == 0 {
					if _, err := reg.Gather(); err != nil {
						t.Errorf("Gather() = %v", err)
					}
				}
			}
		}()
	}
	wg.Wait()
	const kept = workers * each / 2
	metricstest.Compare(t, reg, fmt.Sprintf(`
kube_apiserver_clusterip_allocator_allocated_ips{cidr="10.0.0.0/22"} %d
kube_apiserver_clusterip_allocator_available_ips{cidr="10.0.0.0/22"} %d
kube_apiserver_clusterip_allocator_allocation_total{cidr="10.0.0.0/22",scope="dynamic"} %d
`, kept, 1022-kept, workers*each), allocated, available, allocations)
}

func TestGaugesPerServiceCIDRPrefix(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	rec, inner := newRecorder(t, reg), newBitmap(t, "10.0.0.0/16")
	// What the Source reports changes between scrapes, as the ServiceCIDRs of a cluster do.
	var cidrs []CIDRGauges
	w := rec.Wrap(inner, Source{Label: "10.0.0.0/16", CIDRs: func() []CIDRGauges { return cidrs }})
	steps := []struct {
		name  string
		cidrs []CIDRGauges
		want  string
	}{{
		name: "no ServiceCIDR yet: no series",
	}, {
		name: "overlapping prefixes each count what they contain",
		cidrs: []CIDRGauges{
			{Label: "10.0.0.0/16", Used: 2, Free: 65532},
			{Label: "10.0.0.0/24", Used: 1, Free: 253},
		},
		want: `
kube_apiserver_clusterip_allocator_allocated_ips{cidr="10.0.0.0/16"} 2
kube_apiserver_clusterip_allocator_allocated_ips{cidr="10.0.0.0/24"} 1
kube_apiserver_clusterip_allocator_available_ips{cidr="10.0.0.0/16"} 65532
kube_apiserver_clusterip_allocator_available_ips{cidr="10.0.0.0/24"} 253
`,
	}, {
		name:  "a removed prefix's series go with it",
		cidrs: []CIDRGauges{{Label: "10.0.0.0/24", Used: 0, Free: 254}},
		want: `
kube_apiserver_clusterip_allocator_allocated_ips{cidr="10.0.0.0/24"} 0
kube_apiserver_clusterip_allocator_available_ips{cidr="10.0.0.0/24"} 254
`,
	}}
	for _, s := range steps {
		cidrs = s.cidrs
		if s.want == "" {
			if got, err := testutil.GatherAndCount(reg, allocated, available); err != nil || got != 0 {
				t.Errorf("%s: gauge series = %d, %v; want 0, nil", s.name, got, err)
			}
			continue
		}
		t.Run(s.name, func(t *testing.T) { metricstest.Compare(t, reg, s.want, allocated, available) })
	}
	if err := w.Close(); err != nil {
		t.Fatalf("Close() = %v", err)
	}
	if got, err := testutil.GatherAndCount(reg, allocated, available); err != nil || got != 0 {
		t.Errorf("gauge series after Close = %d, %v; want 0, nil", got, err)
	}
}

func TestGaugeSeriesOfTwoSourcesAreGivenOnce(t *testing.T) {
	// Two allocators on one registry that both report 10.0.0.0/24: the registry must still
	// gather (a pedantic one fails on a duplicate series) and give the series once.
	reg := prometheus.NewPedanticRegistry()
	rec := newRecorder(t, reg)
	rec.Wrap(newBitmap(t, "10.0.0.0/24"), Source{Label: "10.0.0.0/24"})
	rec.Wrap(newBitmap(t, "10.0.0.0/16"), Source{Label: "10.0.0.0/16", CIDRs: func() []CIDRGauges {
		return []CIDRGauges{{Label: "10.0.0.0/16", Used: 0, Free: 65534}, {Label: "10.0.0.0/24", Used: 9, Free: 245}}
	}})
	metricstest.Compare(t, reg, `
kube_apiserver_clusterip_allocator_allocated_ips{cidr="10.0.0.0/16"} 0
kube_apiserver_clusterip_allocator_allocated_ips{cidr="10.0.0.0/24"} 9
`, allocated)
}

func TestBitmapCountersScrapedFromPersistent(t *testing.T) {
	// Two Persistents on one store: the second is stale after the first writes, so its next
	// compare-and-swap conflicts, and it retries on the state that won.
	ctx := context.Background()
	cidr := netip.MustParsePrefix("10.0.0.0/24")
	store := bitmaptest.NewMemStore()
	first, err := bitmap.NewPersistent(ctx, cidr, store)
	if err != nil {
		t.Fatalf("NewPersistent() = %v", err)
	}
	second, err := bitmap.NewPersistent(ctx, cidr, store)
	if err != nil {
		t.Fatalf("NewPersistent() = %v", err)
	}
	reg := prometheus.NewPedanticRegistry()
	a := newRecorder(t, reg).Wrap(second, Source{Label: cidr.String(), Bitmap: second.Stats})
	metricstest.Compare(t, reg, `
clusterip_allocator_bitmap_batches_total{cidr="10.0.0.0/24"} 0
clusterip_allocator_bitmap_cas_writes_total{cidr="10.0.0.0/24"} 0
clusterip_allocator_bitmap_cas_conflicts_total{cidr="10.0.0.0/24"} 0
clusterip_allocator_bitmap_cas_retries_total{cidr="10.0.0.0/24"} 0
`, batches, casWrites, casConflicts, casRetries)

	if err := first.Allocate(ctx, netip.MustParseAddr("10.0.0.7"), allocator.Owner{}); err != nil {
		t.Fatalf("first.Allocate() = %v", err)
	}
	if _, err := a.AllocateNext(ctx, allocator.Owner{}); err != nil {
		t.Fatalf("AllocateNext() = %v", err)
	}
	if err := a.Allocate(ctx, netip.MustParseAddr("10.0.0.7"), allocator.Owner{}); !errors.Is(err, allocator.ErrAllocated) {
		t.Fatalf("Allocate(10.0.0.7) = %v, want ErrAllocated", err)
	}
	metricstest.Compare(t, reg, `
clusterip_allocator_bitmap_batches_total{cidr="10.0.0.0/24"} 2
clusterip_allocator_bitmap_cas_writes_total{cidr="10.0.0.0/24"} 1
clusterip_allocator_bitmap_cas_conflicts_total{cidr="10.0.0.0/24"} 1
clusterip_allocator_bitmap_cas_retries_total{cidr="10.0.0.0/24"} 1
kube_apiserver_clusterip_allocator_allocated_ips{cidr="10.0.0.0/24"} 2
`, batches, casWrites, casConflicts, casRetries, allocated)
}

func TestCountsUnderTheServingPrefix(t *testing.T) {
	// LabelOf stands for the ServiceCIDRs: 10.0.0.0/28 has a ServiceCIDR of its own, the rest of
	// the bitmap's /24 only the Source's.
	ctx := context.Background()
	reg := prometheus.NewPedanticRegistry()
	inner := newBitmap(t, "10.0.0.0/24")
	own := netip.MustParsePrefix("10.0.0.0/28")
	a := newRecorder(t, reg).Wrap(inner, Source{Label: "10.0.0.0/24", LabelOf: func(ip netip.Addr) string {
		if own.Contains(ip) {
			return own.String()
		}
		return ""
	}})
	for _, s := range []string{"10.0.0.3", "10.0.0.200"} {
		if err := a.Allocate(ctx, netip.MustParseAddr(s), allocator.Owner{}); err != nil {
			t.Fatalf("Allocate(%s) = %v", s, err)
		}
		if err := a.Allocate(ctx, netip.MustParseAddr(s), allocator.Owner{}); !errors.Is(err, allocator.ErrAllocated) {
			t.Fatalf("Allocate(%s) again = %v, want ErrAllocated", s, err)
		}
	}
	metricstest.Compare(t, reg, `
kube_apiserver_clusterip_allocator_allocation_total{cidr="10.0.0.0/24",scope="static"} 1
kube_apiserver_clusterip_allocator_allocation_total{cidr="10.0.0.0/28",scope="static"} 1
kube_apiserver_clusterip_allocator_allocation_errors_total{cidr="10.0.0.0/24",scope="static"} 1
kube_apiserver_clusterip_allocator_allocation_errors_total{cidr="10.0.0.0/28",scope="static"} 1
`, allocations, errorsTotal)
	if got, err := testutil.GatherAndCount(reg, duration); err != nil || got != 2 {
		t.Errorf("%s series = %d, %v; want 2 (one per prefix), nil", duration, got, err)
	}
}
