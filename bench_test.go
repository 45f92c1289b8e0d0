package clusterip

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-ipam/clusterip/featuregate"
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
// range, and reports both rates and latencies (DESIGN §9). Run it with -benchtime=960x.
func BenchmarkDualWriteBesideKubeAPIServer(b *testing.B) { benchmarkDualWrite(b, true) }

// BenchmarkDualWriteAlone measures the pairs of BenchmarkDualWriteBesideKubeAPIServer without the
// kube-apiserver's own Service churn, on the same etcd and kube-apiserver, so that our own latency
// can be told from contention with its writes. Run it with -benchtime=960x.
func BenchmarkDualWriteAlone(b *testing.B) { benchmarkDualWrite(b, false) }

// benchmarkDualWrite runs b.N DualWrite AllocateNext+Release pairs on 16 workers and reports their
// rate and latencies; with beside, 16 more workers have the kube-apiserver create and delete
// ClusterIP Services meanwhile, whose rate and latencies it reports too.
func benchmarkDualWrite(b *testing.B, beside bool) {
	_, etcd, api := realCluster(b)
	a := startAllocators(b, etcd, api.Client, featuregate.DualWrite, "")
	dw := a.Family(corev1.IPv4Protocol)
	ctx := context.Background()
	const workers = 16

	var ours, theirs latencies
	var ourFails, theirFails, theirPairs atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	churners := workers
	if !beside {
		churners = 0
	}
	theirStart := time.Now()
	for w := range churners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				name := fmt.Sprintf("bench-%d-%d", w, i)
				t0 := time.Now()
				_, err := api.Client.CoreV1().Services(metav1.NamespaceDefault).Create(ctx, clusterIPService(name), metav1.CreateOptions{})
				if err != nil {
					theirFails.Add(1)
					continue
				}
				if err := api.Client.CoreV1().Services(metav1.NamespaceDefault).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
					b.Errorf("delete Service %s: %v", name, err)
				}
				theirs.add(time.Since(t0))
				theirPairs.Add(1)
			}
		}()
	}

	b.ResetTimer()
	ourStart := time.Now()
	run(workers, b.N, func(int) {
		t0 := time.Now()
		ip, err := dw.AllocateNext(ctx, testOwner)
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
	wg.Wait()
	theirDur := time.Since(theirStart)

	ourRate := float64(b.N-int(ourFails.Load())) / ourDur.Seconds()
	theirRate := float64(theirPairs.Load()) / theirDur.Seconds()
	p50, p99 := ours.quantile(0.5), ours.quantile(0.99)
	b.ReportMetric(ourRate, "ours-pairs/s")
	b.ReportMetric(float64(p50.Microseconds())/1000, "ours-p50-ms")
	b.ReportMetric(float64(p99.Microseconds())/1000, "ours-p99-ms")
	if p50 > 0 {
		b.ReportMetric(float64(p99)/float64(p50), "ours-p99/p50")
	}
	b.ReportMetric(float64(ourFails.Load()), "ours-failures")
	if !beside {
		return
	}
	b.ReportMetric(theirRate, "kas-pairs/s")
	b.ReportMetric(float64(theirs.quantile(0.5).Microseconds())/1000, "kas-p50-ms")
	b.ReportMetric(float64(theirs.quantile(0.99).Microseconds())/1000, "kas-p99-ms")
	b.ReportMetric(float64(theirFails.Load()), "kas-failures")
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
