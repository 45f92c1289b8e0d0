package clusterip

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/metrics/metricstest"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/servicecidr"
)

const (
	metricAllocated   = "kube_apiserver_clusterip_allocator_allocated_ips"
	metricAvailable   = "kube_apiserver_clusterip_allocator_available_ips"
	metricAllocations = "kube_apiserver_clusterip_allocator_allocation_total"
	metricErrors      = "kube_apiserver_clusterip_allocator_allocation_errors_total"
	metricNotReady    = "clusterip_allocator_not_ready_total"
	metricUndos       = "clusterip_allocator_dualwrite_undo_total"
	metricUndoErrors  = "clusterip_allocator_dualwrite_undo_errors_total"
	metricBatches     = "clusterip_allocator_bitmap_batches_total"
	metricCASWrites   = "clusterip_allocator_bitmap_cas_writes_total"
	metricConflicts   = "clusterip_allocator_bitmap_cas_conflicts_total"
	metricRetries     = "clusterip_allocator_bitmap_cas_retries_total"
)

// instrumented wraps the DualWriteAllocator of f (over f's servicecidr allocator and bitmap) as
// New does with Config.Registerer set, and returns the wrapped allocator and the registry.
func instrumented(t *testing.T, f *dualFixture) (allocator.Interface, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	fam := f.dw.Family()
	a := &Allocators{
		families: []corev1.IPFamily{fam},
		ranges:   map[corev1.IPFamily]netip.Prefix{fam: f.flag},
		allocs:   map[corev1.IPFamily]allocator.Interface{fam: f.dw},
		bitmaps:  map[corev1.IPFamily]*bitmap.Persistent{fam: f.bm},
		cidrs:    map[corev1.IPFamily]*servicecidr.Allocator{fam: f.sc},
		dual:     map[corev1.IPFamily]*DualWriteAllocator{fam: f.dw},
	}
	if err := a.instrument(reg); err != nil {
		t.Fatalf("instrument() = %v", err)
	}
	return a.allocs[fam], reg
}

func TestMetricsCountDualWriteUndos(t *testing.T) {
	f := newDualFixture(t, "10.0.0.0/28")
	a, reg := instrumented(t, f)
	f.setFailCreate(func(ip string) error { return forbidden(ip) }) // refused: the bit is undone
	if _, err := a.AllocateNext(f.ctx, testOwner); err == nil {
		t.Fatal("AllocateNext() with every create failing = nil error, want one")
	}
	if err := a.Allocate(f.ctx, netip.MustParseAddr("10.0.0.3"), testOwner); err == nil {
		t.Fatal("Allocate() with every create failing = nil error, want one")
	}
	f.setFailCreate(nil)
	ip, err := a.AllocateNext(f.ctx, testOwner)
	if err != nil {
		t.Fatalf("AllocateNext() = %v", err)
	}
	want := `
clusterip_allocator_dualwrite_undo_total{cidr="10.0.0.0/28"} 2
clusterip_allocator_dualwrite_undo_errors_total{cidr="10.0.0.0/28"} 0
kube_apiserver_clusterip_allocator_allocated_ips{cidr="10.0.0.0/28"} 1
kube_apiserver_clusterip_allocator_available_ips{cidr="10.0.0.0/28"} 13
kube_apiserver_clusterip_allocator_allocation_total{cidr="10.0.0.0/28",scope="dynamic"} 1
kube_apiserver_clusterip_allocator_allocation_errors_total{cidr="10.0.0.0/28",scope="dynamic"} 1
kube_apiserver_clusterip_allocator_allocation_errors_total{cidr="10.0.0.0/28",scope="static"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(metricstest.Exposition(want)), metricUndos, metricUndoErrors, metricAllocated, metricAvailable, metricAllocations, metricErrors); err != nil {
		t.Errorf("after two failed creates and one allocation of %v: %v", ip, err)
	}
}

func TestMetricsCountNotReadyRefusals(t *testing.T) {
	f := newDualFixtureServing(t, "10.0.0.0/28") // no ServiceCIDR: the primary is never ready
	a, reg := instrumented(t, f)
	if _, err := a.AllocateNext(f.ctx, testOwner); !errors.Is(err, allocator.ErrNotReady) {
		t.Fatalf("AllocateNext() = %v, want ErrNotReady", err)
	}
	want := `
clusterip_allocator_not_ready_total{cidr="10.0.0.0/28",scope="dynamic"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(metricstest.Exposition(want)), metricNotReady, metricErrors, metricAllocations); err != nil {
		t.Error(err)
	}
}

func TestNewWithRegistererWrapsEveryFamily(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	f := newDualFixture(t, "10.0.0.0/28")
	cfg := Config{
		Mode:       featuregate.IPAddressOnly,
		Ranges:     []netip.Prefix{f.flag},
		Client:     f.client,
		Informers:  informers.NewSharedInformerFactory(f.client, 0),
		Registerer: reg,
	}
	a, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("New() = %v", err)
	}
	defer a.Close()
	al := a.For(corev1.IPv4Protocol)
	u, ok := al.(interface{ Unwrap() allocator.Interface })
	if !ok {
		t.Fatalf("For(IPv4) = %T, want a metrics wrapper", al)
	}
	if got := u.Unwrap(); got != a.ServiceCIDRs(corev1.IPv4Protocol) {
		t.Errorf("For(IPv4).Unwrap() = %T %p, want the servicecidr allocator", got, got)
	}
	// The gauges are per ServiceCIDR prefix, seeded when Run creates a prefix's allocator: before
	// Run there is none, so there is no series yet.
	if got, err := testutil.GatherAndCount(reg, metricAllocated, metricAvailable); err != nil || got != 0 {
		t.Errorf("gauge series before Run = %d, %v; want 0, nil", got, err)
	}
}

// Over overlapping ServiceCIDRs the gauges have one series per prefix, each counting the
// addresses its prefix contains, as kube-apiserver's per-prefix allocators do; an allocation
// counts under the prefix that served it.
func TestMetricsPerServiceCIDRPrefix(t *testing.T) {
	f := newDualFixture(t, "10.0.0.0/28", "10.0.0.0/29", "10.0.0.0/30", "10.1.0.0/29")
	a, reg := instrumented(t, f)
	for _, s := range []string{"10.0.0.1", "10.0.0.2", "10.0.0.5", "10.0.0.9", "10.1.0.1"} {
		if err := a.Allocate(f.ctx, netip.MustParseAddr(s), testOwner); err != nil {
			t.Fatalf("Allocate(%s) = %v", s, err)
		}
	}
	if err := a.Allocate(f.ctx, netip.MustParseAddr("10.1.0.1"), testOwner); !errors.Is(err, allocator.ErrAllocated) {
		t.Fatalf("Allocate(10.1.0.1) again = %v, want ErrAllocated", err)
	}
	// The /28 holds 14 usable addresses, the /29s 6 each, the /30 2. The nested prefixes are
	// served through the /28 that contains them.
	want := `
kube_apiserver_clusterip_allocator_allocated_ips{cidr="10.0.0.0/28"} 4
kube_apiserver_clusterip_allocator_allocated_ips{cidr="10.0.0.0/29"} 3
kube_apiserver_clusterip_allocator_allocated_ips{cidr="10.0.0.0/30"} 2
kube_apiserver_clusterip_allocator_allocated_ips{cidr="10.1.0.0/29"} 1
kube_apiserver_clusterip_allocator_available_ips{cidr="10.0.0.0/28"} 10
kube_apiserver_clusterip_allocator_available_ips{cidr="10.0.0.0/29"} 3
kube_apiserver_clusterip_allocator_available_ips{cidr="10.0.0.0/30"} 0
kube_apiserver_clusterip_allocator_available_ips{cidr="10.1.0.0/29"} 5
kube_apiserver_clusterip_allocator_allocation_total{cidr="10.0.0.0/28",scope="static"} 4
kube_apiserver_clusterip_allocator_allocation_total{cidr="10.1.0.0/29",scope="static"} 1
kube_apiserver_clusterip_allocator_allocation_errors_total{cidr="10.1.0.0/29",scope="static"} 1
`
	compareEventually(t, reg, want, metricAllocated, metricAvailable, metricAllocations, metricErrors)

	// A prefix's series go when its last ServiceCIDR does.
	if err := f.client.NetworkingV1().ServiceCIDRs().Delete(f.ctx, "cidr-2", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete ServiceCIDR cidr-2 (10.0.0.0/30): %v", err)
	}
	testenv.WaitFor(t, "the /30's series to go", func() bool {
		n, err := testutil.GatherAndCount(reg, metricAllocated)
		return err == nil && n == 3
	})
	want = `
kube_apiserver_clusterip_allocator_allocated_ips{cidr="10.0.0.0/28"} 4
kube_apiserver_clusterip_allocator_allocated_ips{cidr="10.0.0.0/29"} 3
kube_apiserver_clusterip_allocator_allocated_ips{cidr="10.1.0.0/29"} 1
`
	compareEventually(t, reg, want, metricAllocated)
}

// compareEventually compares the metrics names of reg with want (metricstest.Exposition adds
// their headers) until they agree, and fails t with the last difference if they still do not after
// testenv.WaitTimeout. The gauges of a prefix that did not serve an allocation count it once its
// allocator's informer has seen the IPAddress object, as kube-apiserver's per-prefix allocators do.
func compareEventually(t *testing.T, reg *prometheus.Registry, want string, names ...string) {
	t.Helper()
	deadline := time.Now().Add(testenv.WaitTimeout)
	for {
		err := testutil.GatherAndCompare(reg, strings.NewReader(metricstest.Exposition(want)), names...)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Error(err)
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Another bitmap allocator on the same store writes first: the next write of the family's mirror
// conflicts and is retried, and the counters read from bitmap.Persistent.Stats show it.
func TestMetricsCountBitmapConflicts(t *testing.T) {
	f := newDualFixture(t, "10.0.0.0/28")
	a, reg := instrumented(t, f)
	before := f.bm.Stats()
	other, err := bitmap.NewPersistent(f.ctx, f.flag, f.store)
	if err != nil {
		t.Fatalf("NewPersistent() = %v", err)
	}
	defer other.Close()
	if err := other.Allocate(f.ctx, netip.MustParseAddr("10.0.0.14"), allocator.Owner{}); err != nil {
		t.Fatalf("other.Allocate() = %v", err)
	}
	if _, err := a.AllocateNext(f.ctx, testOwner); err != nil {
		t.Fatalf("AllocateNext() = %v", err)
	}
	want := fmt.Sprintf(`
clusterip_allocator_bitmap_batches_total{cidr="10.0.0.0/28"} %d
clusterip_allocator_bitmap_cas_writes_total{cidr="10.0.0.0/28"} %d
clusterip_allocator_bitmap_cas_conflicts_total{cidr="10.0.0.0/28"} %d
clusterip_allocator_bitmap_cas_retries_total{cidr="10.0.0.0/28"} %d
`, before.Batches+1, before.Writes+1, before.Conflicts+1, before.Retries+1)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(metricstest.Exposition(want)), metricBatches, metricCASWrites, metricConflicts, metricRetries); err != nil {
		t.Error(err)
	}
}
