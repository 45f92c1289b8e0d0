package bench

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/ipaddress"
)

// benchIPAddress measures the IPAddress-object allocator over client-go's fake clientset: the
// allocator's own cost (free-index pick, assume cache, informer events) without a network or
// an API server's validation and storage. The fake clientset is client-go's public package and
// imports no testing code.
func benchIPAddress(ctx context.Context, cidr netip.Prefix, fill float64, d time.Duration) (Result, error) {
	client := fake.NewClientset()
	factory := informers.NewSharedInformerFactory(client, 0)
	a, err := ipaddress.New(cidr, client, factory.Networking().V1().IPAddresses(), ipaddress.WithSeed(1))
	if err != nil {
		return Result{}, err
	}
	defer a.Close()
	stop := make(chan struct{})
	factory.Start(stop)
	defer factory.Shutdown()
	defer close(stop)
	if !cache.WaitForCacheSync(stop, a.Ready) {
		return Result{}, fmt.Errorf("bench: the IPAddress informer of %v did not sync", cidr)
	}
	owner := allocator.Owner{Resource: "services", Namespace: "bench", Name: "fill"}
	for range target(a.Used()+a.Free(), fill) {
		if _, err := a.AllocateNext(ctx, owner); err != nil {
			return Result{}, fmt.Errorf("bench: fill %v: %w", cidr, err)
		}
	}
	return measure(ctx, IPAddress, cidr, a, fill, d, 16)
}
