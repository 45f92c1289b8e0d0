package interop

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/test/integration/internal/clustertest"
)

// latencies collects durations from several goroutines.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

// quantile returns the q-quantile (0 ≤ q < 1) of the durations collected.
func (l *latencies) quantile(q float64) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.d) == 0 {
		return 0
	}
	s := slices.Clone(l.d)
	slices.Sort(s)
	return s[int(float64(len(s))*q)]
}

// BenchmarkDualWriteBesideKubeAPIServer measures our DualWrite AllocateNext+Release pairs with 16
// workers against real etcd and kube-apiserver v1.33.13, while 16 workers of the same
// kube-apiserver create and delete ClusterIP Services in its own dual-write mode on the same
// range, and reports both rates and latencies. Run it with -benchtime=960x.
func BenchmarkDualWriteBesideKubeAPIServer(b *testing.B) { benchmarkDualWrite(b, true, 0) }

// BenchmarkDualWriteAlone measures the pairs of BenchmarkDualWriteBesideKubeAPIServer without the
// kube-apiserver's own Service churn, on the same etcd and kube-apiserver, so that our own latency
// can be told from contention with its writes. Run it with -benchtime=960x.
func BenchmarkDualWriteAlone(b *testing.B) { benchmarkDualWrite(b, false, 0) }

// BenchmarkDualWriteNearlyFullFlagRange is BenchmarkDualWriteAlone with the flag range's bitmap
// nearly full of bits that have no IPAddress object (250 of its 254, as a Legacy peer's Services
// and kube-apiserver's own stale bits leave them) and an extra /28 ServiceCIDR outside it: with
// the 4 free bits taken, the other workers must be served from the extra ServiceCIDR. Besides
// rates and latencies it reports the undos per pair, and among them the addresses the
// ServiceCIDRs offered in the flag range only to find their bits held (each an IPAddress create
// and delete). Run it with -benchtime=960x.
func BenchmarkDualWriteNearlyFullFlagRange(b *testing.B) { benchmarkDualWrite(b, false, 250) }

// BenchmarkDualWriteNearlyFullFlagRangeBeside is BenchmarkDualWriteNearlyFullFlagRange beside the
// kube-apiserver's churn of BenchmarkDualWriteBesideKubeAPIServer, with 230 of the 254 bits held
// so that the 24 left and the /28 leave our 16 workers room beside its 16. Run it with
// -benchtime=960x.
func BenchmarkDualWriteNearlyFullFlagRangeBeside(b *testing.B) { benchmarkDualWrite(b, true, 230) }

// extraServiceCIDR is the ServiceCIDR outside the flag range that the NearlyFullFlagRange
// benchmarks serve from.
const extraServiceCIDR = "10.97.0.0/28"

// benchmarkDualWrite runs b.N DualWrite AllocateNext+Release pairs on 16 workers and reports their
// rate and latencies; with beside, 16 more workers have the kube-apiserver create and delete
// ClusterIP Services meanwhile, whose rate and latencies it reports too. With held > 0, the flag
// range's bitmap first gets that many bits without IPAddress objects and an extra ServiceCIDR is
// served (see BenchmarkDualWriteNearlyFullFlagRange).
func benchmarkDualWrite(b *testing.B, beside bool, held int) {
	_, etcd, api := realCluster(b)
	a := startAllocators(b, etcd, api.Client, featuregate.DualWrite, "")
	dw := a.For(corev1.IPv4Protocol)
	ctx := context.Background()
	const workers = 16
	if held > 0 {
		fillFlagRange(b, a, etcd, api.Client, held)
	}
	stats0 := dw.(*clusterip.DualWriteAllocator).Stats()

	var ours latencies
	var ourFails atomic.Int64
	stop := make(chan struct{})
	churned := make(chan testenv.ChurnResult, 1)
	if beside {
		go func() {
			churned <- testenv.ServiceChurn{Workers: workers, Stop: stop, Prefix: "bench", Delete: true}.Run(ctx, b, api.Client)
		}()
	}

	b.ResetTimer()
	ourStart := time.Now()
	run(workers, b.N, func(int) {
		t0 := time.Now()
		ip, err := dw.AllocateNext(ctx, clustertest.Owner)
		if err != nil {
			ourFails.Add(1)
			return
		}
		if err := dw.Release(ctx, ip); err != nil {
			ourFails.Add(1)
			return
		}
		ours.add(time.Since(t0))
	})
	ourDur := time.Since(ourStart)
	b.StopTimer()
	close(stop)
	var theirs testenv.ChurnResult
	if beside {
		theirs = <-churned
	}

	ourRate := float64(b.N-int(ourFails.Load())) / ourDur.Seconds()
	p50, p99 := ours.quantile(0.5), ours.quantile(0.99)
	b.ReportMetric(ourRate, "ours-pairs/s")
	b.ReportMetric(float64(p50.Microseconds())/1000, "ours-p50-ms")
	b.ReportMetric(float64(p99.Microseconds())/1000, "ours-p99-ms")
	if p50 > 0 {
		b.ReportMetric(float64(p99)/float64(p50), "ours-p99/p50")
	}
	b.ReportMetric(float64(ourFails.Load()), "ours-failures")
	stats := dw.(*clusterip.DualWriteAllocator).Stats()
	b.ReportMetric(float64(stats.Undone-stats0.Undone)/float64(b.N), "ours-undos/op")
	b.ReportMetric(float64(stats.Refused-stats0.Refused)/float64(b.N), "ours-refused/op")
	if !beside {
		return
	}
	theirRate := float64(theirs.Created) / theirs.Took.Seconds()
	b.ReportMetric(theirRate, "kas-pairs/s")
	b.ReportMetric(float64(theirs.Quantile(0.5).Microseconds())/1000, "kas-p50-ms")
	b.ReportMetric(float64(theirs.Quantile(0.99).Microseconds())/1000, "kas-p99-ms")
	b.ReportMetric(float64(theirs.Failed), "kas-failures")
	if theirRate > 0 {
		b.ReportMetric(ourRate/theirRate, "ratio")
	}
	// The kube-apiserver's failed creates leave stale bits; free them for whatever runs next.
	bits := storedBits(b, etcd, "/registry/ranges/serviceips")
	objs := ipAddressObjects(b, api.Client)
	for _, ip := range bits {
		if !slices.Contains(objs, ip) {
			_ = a.Bitmap(corev1.IPv4Protocol).Release(ctx, ip)
		}
	}
}

// fillFlagRange sets bits of the flag range with no IPAddress object, through a Legacy allocator
// on the same key, until held are set, and serves extraServiceCIDR; both are undone when b ends.
func fillFlagRange(b *testing.B, a *clusterip.Allocators, etcd *clientv3.Client, client kubernetes.Interface, held int) {
	b.Helper()
	ctx := context.Background()
	legacy := clustertest.StartAllocators(b, clusterip.Config{Mode: featuregate.Legacy, Ranges: []netip.Prefix{flagRange}, Bitmaps: etcdstore.Stores{Client: etcd}}).For(corev1.IPv4Protocol)
	var legacyIPs []netip.Addr
	for legacy.Used() < uint64(held) {
		ip, err := legacy.AllocateNext(ctx, clustertest.Owner)
		if err != nil {
			b.Fatalf("fill the flag range: %v", err)
		}
		legacyIPs = append(legacyIPs, ip)
	}
	extra := &networkingv1.ServiceCIDR{
		ObjectMeta: metav1.ObjectMeta{Name: "bench-extra"},
		Spec:       networkingv1.ServiceCIDRSpec{CIDRs: []string{extraServiceCIDR}},
	}
	if _, err := client.NetworkingV1().ServiceCIDRs().Create(ctx, extra, metav1.CreateOptions{}); err != nil {
		b.Fatalf("create ServiceCIDR %s: %v", extraServiceCIDR, err)
	}
	b.Cleanup(func() {
		for _, ip := range legacyIPs {
			_ = legacy.Release(ctx, ip)
		}
		if err := client.NetworkingV1().ServiceCIDRs().Delete(ctx, extra.Name, metav1.DeleteOptions{}); err != nil {
			b.Errorf("delete ServiceCIDR %s: %v", extraServiceCIDR, err)
		}
	})
	want := netip.MustParsePrefix(extraServiceCIDR)
	testenv.WaitFor(b, "the extra ServiceCIDR to be served", func() bool {
		return slices.Contains(a.ServiceCIDRs(corev1.IPv4Protocol).ReadyCIDRs(), want)
	})
	b.Logf("flag range %s: %d of 254 bits held without IPAddress objects; extra ServiceCIDR %s", flagRange, legacy.Used(), extraServiceCIDR)
}
