package interop

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"

	"github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/metrics/metricstest"
	"github.com/kube-ipam/clusterip/servicecidr"
	"github.com/kube-ipam/clusterip/test/integration/internal/clustertest"
)

// The metrics of the allocators New builds with Config.Registerer, against the shared etcd and
// kube-apiserver; the root package's metrics_test.go tests them over fakes.

const (
	metricAllocated   = "kube_apiserver_clusterip_allocator_allocated_ips"
	metricAvailable   = "kube_apiserver_clusterip_allocator_available_ips"
	metricAllocations = "kube_apiserver_clusterip_allocator_allocation_total"
	metricErrors      = "kube_apiserver_clusterip_allocator_allocation_errors_total"
	metricDuration    = "kube_apiserver_clusterip_allocator_allocation_duration_seconds"
	metricUndos       = "clusterip_allocator_dualwrite_undo_total"
	metricBatches     = "clusterip_allocator_bitmap_batches_total"
	metricCASWrites   = "clusterip_allocator_bitmap_cas_writes_total"
	metricConflicts   = "clusterip_allocator_bitmap_cas_conflicts_total"
	metricRetries     = "clusterip_allocator_bitmap_cas_retries_total"
)

// value returns the value of the one sample of the metric name with label cidr, or 0 if none.
func value(t *testing.T, reg prometheus.Gatherer, name, cidr string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather() = %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			want := map[string]string{"cidr": cidr}
			for i := 0; i+1 < len(labels); i += 2 {
				want[labels[i]] = labels[i+1]
			}
			if len(m.GetLabel()) != len(want) {
				continue
			}
			for _, l := range m.GetLabel() {
				if want[l.GetName()] != l.GetValue() {
					continue next
				}
			}
			switch {
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			case m.GetHistogram() != nil:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return 0
}

// The metrics of allocators beside a real kube-apiserver v1.33 in DualWrite mode, built by New
// with Config.Registerer: counts per scope, gauges that follow Used and Free and the IPAddress
// objects, and DryRun calls left uncounted.
func TestMetricsBesideKubeAPIServer(t *testing.T) {
	_, etcd, api := realCluster(t)
	reg := prometheus.NewPedanticRegistry()
	a := clustertest.StartAllocators(t, clusterip.Config{Mode: featuregate.DualWrite, Ranges: []netip.Prefix{flagRange}, Bitmaps: etcdstore.Stores{Client: etcd, Prefix: "/metrics"}, Client: api.Client, Registerer: reg})
	ctx := context.Background()

	al := a.For(corev1.IPv4Protocol)
	cidr := flagRange.String()
	// The gauges of the flag range's label are those of the default ServiceCIDR's prefix, which
	// kube-apiserver made from its flag: they count that prefix alone, whatever other
	// ServiceCIDRs the shared server has.
	flagUsage := func() servicecidr.PrefixUsage {
		for _, u := range a.ServiceCIDRs(corev1.IPv4Protocol).Usage() {
			if u.Prefix == flagRange {
				return u
			}
		}
		t.Fatalf("Usage() has no %s", flagRange)
		return servicecidr.PrefixUsage{}
	}
	base := value(t, reg, metricAllocated, cidr)
	if got, want := base, float64(flagUsage().Used); got != want {
		t.Errorf("%s = %v before any call, want Usage()[%s].Used = %v", metricAllocated, got, flagRange, want)
	}

	const n = 5
	var ips []netip.Addr
	for i := range n {
		ip, err := al.AllocateNext(ctx, allocator.Owner{Resource: "services", Namespace: "default", Name: fmt.Sprintf("metrics-%d", i)})
		if err != nil {
			t.Fatalf("AllocateNext() = %v", err)
		}
		ips = append(ips, ip)
	}
	if err := al.Allocate(ctx, ips[0], clustertest.Owner); !errors.Is(err, allocator.ErrAllocated) {
		t.Errorf("Allocate(%v) again = %v, want ErrAllocated", ips[0], err)
	}
	if err := al.Release(ctx, ips[0]); err != nil {
		t.Fatalf("Release(%v) = %v", ips[0], err)
	}
	if err := al.Allocate(ctx, ips[0], clustertest.Owner); err != nil {
		t.Fatalf("Allocate(%v) = %v", ips[0], err)
	}
	dry := al.DryRun()
	if _, err := dry.AllocateNext(ctx, clustertest.Owner); err != nil {
		t.Errorf("DryRun().AllocateNext() = %v", err)
	}
	if err := dry.Allocate(ctx, ips[1], clustertest.Owner); !errors.Is(err, allocator.ErrAllocated) {
		t.Errorf("DryRun().Allocate(%v) = %v, want ErrAllocated", ips[1], err)
	}

	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{metricAllocations, []string{"scope", "dynamic"}, n},
		{metricAllocations, []string{"scope", "static"}, 1},
		{metricErrors, []string{"scope", "static"}, 1},
		{metricErrors, []string{"scope", "dynamic"}, 0},
		{metricDuration, nil, n + 1},
		{metricAllocated, nil, float64(flagUsage().Used)},
		{metricAvailable, nil, float64(flagUsage().Free)},
		{metricUndos, nil, 0},
	} {
		if got := value(t, reg, c.name, cidr, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if got, want := value(t, reg, metricAllocated, cidr), base+n; got != want {
		t.Errorf("%s = %v after %d allocations, want %v", metricAllocated, got, n, want)
	}
	objs := ipAddressObjects(t, api.Client)
	inRange := 0
	for _, ip := range objs {
		if flagRange.Contains(ip) {
			inRange++
		}
	}
	if got, want := value(t, reg, metricAllocated, cidr), float64(inRange); got != want {
		t.Errorf("%s = %v, want the %d IPAddress objects of %s", metricAllocated, got, inRange, flagRange)
	}

	for _, ip := range ips {
		if err := al.Release(ctx, ip); err != nil {
			t.Errorf("Release(%v) = %v", ip, err)
		}
	}
	if got, want := value(t, reg, metricAllocated, cidr), base; got != want {
		t.Errorf("%s = %v after releasing all, want %v", metricAllocated, got, want)
	}
}

// In Legacy mode the family's allocator is the etcd bitmap itself: a second bitmap allocator on
// the same etcd key writes first, so the next allocation's compare-and-swap conflicts, and the
// counters scraped from the registry New was given show the conflict and its retry.
func TestMetricsCountLegacyCASConflictsOnEtcd(t *testing.T) {
	etcd := shared.Etcd(t).TestClient(t)
	reg := prometheus.NewPedanticRegistry()
	const prefix = "/metrics-legacy-cas"
	cfg := clusterip.Config{Mode: featuregate.Legacy, Ranges: []netip.Prefix{netip.MustParsePrefix("10.20.0.0/24")}, Bitmaps: etcdstore.Stores{Client: etcd, Prefix: prefix}, Registerer: reg}
	ctx := context.Background()
	// The etcd is shared: leave no bitmap behind for the next run of this test (-count).
	t.Cleanup(func() {
		if _, err := etcd.Delete(ctx, prefix+"/", clientv3.WithPrefix()); err != nil {
			t.Errorf("delete the bitmaps under %s: %v", prefix, err)
		}
	})
	a := clustertest.StartAllocators(t, cfg)
	other, err := bitmap.NewPersistent(ctx, cfg.Ranges[0], etcdstore.New(etcd, etcdstore.KeyFor(prefix, 0)))
	if err != nil {
		t.Fatalf("NewPersistent() = %v", err)
	}
	defer other.Close()
	if err := other.Allocate(ctx, netip.MustParseAddr("10.20.0.9"), allocator.Owner{}); err != nil {
		t.Fatalf("other.Allocate() = %v", err)
	}
	if _, err := a.For(corev1.IPv4Protocol).AllocateNext(ctx, clustertest.Owner); err != nil {
		t.Fatalf("AllocateNext() = %v", err)
	}
	want := `
clusterip_allocator_bitmap_batches_total{cidr="10.20.0.0/24"} 1
clusterip_allocator_bitmap_cas_writes_total{cidr="10.20.0.0/24"} 1
clusterip_allocator_bitmap_cas_conflicts_total{cidr="10.20.0.0/24"} 1
clusterip_allocator_bitmap_cas_retries_total{cidr="10.20.0.0/24"} 1
kube_apiserver_clusterip_allocator_allocated_ips{cidr="10.20.0.0/24"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(metricstest.Exposition(want)), metricBatches, metricCASWrites, metricConflicts, metricRetries, metricAllocated); err != nil {
		t.Error(err)
	}
}
