package servicecidr

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"k8s.io/client-go/kubernetes"

	"github.com/kube-ipam/clusterip/internal/testenv"
)

// BenchmarkAllocateNext measures AllocateNext across four ServiceCIDRs with 1, 4 and 16
// concurrent callers, on the fake clientset and on a real kube-apiserver v1.33.13 with etcd. It
// reports ops/s: on the real apiserver, where each call is an API round trip, throughput that
// grows with callers shows that the Allocator does not serialise them.
//
//	go test -run '^$' -bench AllocateNext ./servicecidr
func BenchmarkAllocateNext(b *testing.B) {
	for _, be := range []struct {
		name   string
		client func(testing.TB) kubernetes.Interface
	}{
		{"Fake", nil},
		{"KubeAPIServer", sharedKubeAPIServer},
	} {
		for _, callers := range []int{1, 4, 16} {
			b.Run(fmt.Sprintf("%s/callers=%d", be.name, callers), func(b *testing.B) {
				cfg := fixtureConfig{}
				if be.client != nil {
					cfg.client = be.client(b)
					cfg.label = nextLabel()
				}
				benchAllocateNext(b, newFixture(b, cfg), callers)
			})
		}
	}
}

func benchAllocateNext(b *testing.B, f *fixture, callers int) {
	cidrs := []string{"10.128.0.0/16", "10.129.0.0/16", "10.130.0.0/16", "10.131.0.0/16"}
	for i, c := range cidrs {
		f.create(testenv.ServiceCIDR(fmt.Sprintf("bench-%d", i), c))
	}
	f.waitReady(cidrs...)
	var (
		next atomic.Int64
		wg   sync.WaitGroup
	)
	n := int64(b.N)
	b.ResetTimer()
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= n {
				if _, err := f.alloc.AllocateNext(f.ctx, testOwner); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}
