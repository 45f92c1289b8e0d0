package bench

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-ipam/clusterip/internal/localcluster"
	"github.com/kube-ipam/clusterip/ipaddress"
)

// benchIPAddressFake measures the IPAddress-object allocator over client-go's fake clientset at
// each fill level: the allocator's own cost (free-index pick, assume cache, informer events)
// and the fake clientset's, without a network or an API server's validation and storage. The
// fake clientset is client-go's public package and imports no testing code. One clientset holds
// the range, topped up with IPAddress objects from one fill level to the next, and each level
// gets a new allocator that starts from the objects as they are. The Results come in the order
// of fills.
func benchIPAddressFake(ctx context.Context, cidr netip.Prefix, fills []float64, d time.Duration) ([]Result, error) {
	client := localcluster.NewFakeClient()
	return atEachFill(ctx, client, cidr, fills, nil, func(fill float64) ([]Result, error) {
		r, err := benchIPAddressOn(ctx, IPAddress, client, cidr, fill, d, 16)
		return []Result{r}, err
	})
}

// benchIPAddressOn measures ipaddress.New over client as the allocator name, with batches of
// batch operations. The allocator writes IPAddress objects as kube-apiserver's own does: with
// its managed-by label.
func benchIPAddressOn(ctx context.Context, name string, client kubernetes.Interface, cidr netip.Prefix, fill float64, d time.Duration, batch int) (Result, error) {
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
	if err := waitReady(ctx, fmt.Sprintf("the IPAddress allocator of %v", cidr), a.Ready); err != nil {
		return Result{}, err
	}
	return measure(ctx, name, cidr, a, fill, d, batch)
}

// atEachFill fills cidr with IPAddress objects through client to each level of fills in
// ascending order, calling measure at each level, and returns what measure returned in the
// order of fills (a level given twice is measured once). With progress not nil it says how many
// objects each level takes.
func atEachFill(ctx context.Context, client kubernetes.Interface, cidr netip.Prefix, fills []float64, progress func(fill float64, objects uint64), measure func(fill float64) ([]Result, error)) ([]Result, error) {
	ascending := slices.Clone(fills)
	slices.Sort(ascending)
	ascending = slices.Compact(ascending)
	at := make(map[float64][]Result, len(ascending))
	filled := uint64(0)
	for _, fill := range ascending {
		if want := target(usable(cidr), fill); want > filled {
			if progress != nil {
				progress(fill, want-filled)
			}
			if err := fillRange(ctx, client, cidr, filled, want); err != nil {
				return nil, err
			}
			filled = want
		}
		rs, err := measure(fill)
		if err != nil {
			return nil, err
		}
		at[fill] = rs
	}
	var results []Result
	for _, fill := range fills {
		results = append(results, at[fill]...)
	}
	return results, nil
}
