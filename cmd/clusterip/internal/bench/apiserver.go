package bench

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/localcluster"
)

// The kube-apiserver rows run against one server whose own Service range is IPv6, so that the
// IPv4 ranges measured are served by nothing but the ServiceCIDR the bench creates for each: the
// DualWrite allocator's primary then allocates from that range alone and is full when it is.
const (
	apiServerServiceRange = "fd00:10:96::/112"
	// fillManagedBy labels the IPAddress objects that hold a range at its fill level. It is not
	// kube-apiserver's "ipallocator.k8s.io", so the server's IPAddress repair leaves them alone:
	// it deletes its own IPAddresses whose Service does not exist once they are a minute old.
	fillManagedBy = "clusterip-bench"
	// maxAPIServerRange is the most addresses an APIServer range may hold: filling it creates one
	// IPAddress object per address through the server.
	maxAPIServerRange = 1 << 16
	// fillWorkers is how many IPAddress objects are created at once while filling.
	fillWorkers = 8
	// apiServerBatch is the batch size of a measurement through the server: an operation takes
	// milliseconds there.
	apiServerBatch = 4
	// readyTimeout bounds the wait for an allocator to serve once its informers started.
	readyTimeout = time.Minute
)

// runAPIServer measures the ipaddress+apiserver and dualwrite+apiserver rows: it starts the
// kube-apiserver opts.KubeAPIServer on etcd and, for each range of opts.APIServer, creates a
// ServiceCIDR for it, then for each fill level in ascending order tops the range up with
// IPAddress objects and measures both allocators, each built afresh so that it starts from the
// objects as they are. The server's IPAddress repair leaves the filling objects alone (see
// fillManagedBy); it would delete the measured allocators' own a minute after they were created,
// but each operation has deleted its object long before. It passes each Result to say as it is
// measured and returns them in Run's order. The allocators' own logs are demoted to -v=1: they
// would drown the progress lines.
func runAPIServer(ctx context.Context, etcd *localcluster.Etcd, etcdClient *clientv3.Client, opts Options, say func(Result)) ([]Result, error) {
	ctx = klog.NewContext(ctx, klog.FromContext(ctx).V(1))
	fmt.Fprintf(opts.Progress, "starting kube-apiserver %s (%s) on the embedded etcd\n", localcluster.KubeAPIServerVersion, opts.KubeAPIServer)
	start := time.Now()
	srv, err := localcluster.StartKubeAPIServer(ctx, etcd, localcluster.KubeAPIServerOptions{
		Binary:                opts.KubeAPIServer,
		ServiceClusterIPRange: apiServerServiceRange,
	})
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	defer srv.Close()
	fmt.Fprintf(opts.Progress, "kube-apiserver ready in %v; filling a range creates one IPAddress object per address through it, so these ranges are small\n",
		time.Since(start).Round(time.Millisecond))

	var ipas, dws []Result
	n := 0
	for i, cidr := range opts.APIServer {
		if i > 0 {
			// A later range may overlap an earlier one: start it from an empty cluster.
			if err := clearRange(ctx, srv.Client, opts.APIServer[i-1]); err != nil {
				return nil, err
			}
		}
		if err := createServiceCIDR(ctx, srv.Client, cidr); err != nil {
			return nil, err
		}
		filling := func(fill float64, objects uint64) {
			fmt.Fprintf(opts.Progress, "filling %v to %g%%: %d more IPAddress objects\n", cidr, fill, objects)
		}
		rs, err := atEachFill(ctx, srv.Client, cidr, opts.Fills, filling, func(fill float64) ([]Result, error) {
			ipa, err := benchIPAddressOn(ctx, IPAddressAPIServer, srv.Client, cidr, fill, opts.Duration, apiServerBatch)
			if err != nil {
				return nil, err
			}
			say(ipa)
			n++
			dw, err := benchDualWriteAPIServer(ctx, etcdClient, srv.Client, cidr, n, fill, opts.Duration)
			if err != nil {
				return nil, err
			}
			say(dw)
			return []Result{ipa, dw}, nil
		})
		if err != nil {
			return nil, err
		}
		for j := 0; j+1 < len(rs); j += 2 {
			ipas, dws = append(ipas, rs[j]), append(dws, rs[j+1])
		}
	}
	// Run's order: allocator, then range, then fill level.
	return append(ipas, dws...), nil
}

// usable returns the number of addresses of cidr that allocators hand out: all but the network
// address and, for IPv4, the broadcast address; at most math.MaxUint64.
func usable(cidr netip.Prefix) uint64 {
	host := cidr.Addr().BitLen() - cidr.Bits()
	if host >= 64 {
		return math.MaxUint64
	}
	n := uint64(1)<<host - 1
	if cidr.Addr().Is4() && n > 0 {
		n--
	}
	return n
}

// createServiceCIDR creates a ServiceCIDR of cidr, as an administrator adds a Service range.
// No kube-controller-manager runs, so it gets no finalizer and no Ready condition, which counts
// as ready.
func createServiceCIDR(ctx context.Context, client kubernetes.Interface, cidr netip.Prefix) error {
	sc := &networkingv1.ServiceCIDR{
		ObjectMeta: metav1.ObjectMeta{Name: serviceCIDRName(cidr)},
		Spec:       networkingv1.ServiceCIDRSpec{CIDRs: []string{cidr.String()}},
	}
	if _, err := client.NetworkingV1().ServiceCIDRs().Create(ctx, sc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("bench: create ServiceCIDR %s: %w", sc.Name, err)
	}
	return nil
}

// serviceCIDRName returns the name of the ServiceCIDR the bench creates for cidr.
func serviceCIDRName(cidr netip.Prefix) string {
	return fmt.Sprintf("clusterip-bench-%x-%d", cidr.Addr().AsSlice(), cidr.Bits())
}

// clearRange deletes the ServiceCIDR of cidr and every IPAddress object that filled it.
func clearRange(ctx context.Context, client kubernetes.Interface, cidr netip.Prefix) error {
	nw := client.NetworkingV1()
	if err := nw.ServiceCIDRs().Delete(ctx, serviceCIDRName(cidr), metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("bench: delete the ServiceCIDR of %v: %w", cidr, err)
	}
	sel := metav1.ListOptions{LabelSelector: networkingv1.LabelManagedBy + "=" + fillManagedBy}
	if err := nw.IPAddresses().DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil {
		return fmt.Errorf("bench: delete the IPAddress objects that filled %v: %w", cidr, err)
	}
	return nil
}

// fillRange creates the IPAddress objects of the usable addresses of cidr at offsets from+1 to
// to (offset 0 being the network address), with fillWorkers requests at a time.
func fillRange(ctx context.Context, client kubernetes.Interface, cidr netip.Prefix, from, to uint64) error {
	family := allocator.FamilyOf(cidr.Addr())
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	addrs := make(chan netip.Addr)
	var wg sync.WaitGroup
	for range fillWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ip := range addrs {
				ipa := &networkingv1.IPAddress{
					ObjectMeta: metav1.ObjectMeta{
						Name: ip.String(),
						Labels: map[string]string{
							networkingv1.LabelIPAddressFamily: string(family),
							networkingv1.LabelManagedBy:       fillManagedBy,
						},
					},
					Spec: networkingv1.IPAddressSpec{
						ParentRef: &networkingv1.ParentReference{Resource: "services", Namespace: "bench", Name: "fill"},
					},
				}
				if _, err := client.NetworkingV1().IPAddresses().Create(ctx, ipa, metav1.CreateOptions{}); err != nil {
					cancel(fmt.Errorf("bench: fill %v: create IPAddress %s: %w", cidr, ip, err))
				}
			}
		}()
	}
	ip := cidr.Addr()
	for range from {
		ip = ip.Next()
	}
send:
	for range to - from {
		ip = ip.Next()
		select {
		case addrs <- ip:
		case <-ctx.Done():
			break send
		}
	}
	close(addrs)
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return err
	}
	return nil
}

// benchDualWriteAPIServer measures clusterip.New in DualWrite mode for the one range cidr: its
// bitmap mirror goes to etcd under a prefix of its own (n numbers it), where kube-apiserver,
// whose range is elsewhere, never looks, and is created from the IPAddress objects already in
// cidr.
func benchDualWriteAPIServer(ctx context.Context, etcd *clientv3.Client, client kubernetes.Interface, cidr netip.Prefix, n int, fill float64, d time.Duration) (Result, error) {
	factory := informers.NewSharedInformerFactory(client, 0)
	a, err := clusterip.New(ctx, clusterip.Config{
		Mode:      featuregate.DualWrite,
		Ranges:    []netip.Prefix{cidr},
		Bitmaps:   etcdstore.Stores{Client: etcd, Prefix: fmt.Sprintf("/clusterip-bench/dualwrite/%d", n)},
		Client:    client,
		Informers: factory,
	})
	if err != nil {
		return Result{}, fmt.Errorf("bench: %w", err)
	}
	defer a.Close()
	runCtx, cancel := context.WithCancel(ctx)
	factory.Start(runCtx.Done())
	defer factory.Shutdown()
	runErr := make(chan error, 1)
	go func() { runErr <- a.Run(runCtx) }()
	defer func() {
		cancel()
		<-runErr
	}()
	family := allocator.FamilyOf(cidr.Addr())
	sc := a.ServiceCIDRs(family)
	served := func() bool { return slices.Contains(sc.ReadyCIDRs(), cidr) }
	if err := waitReady(ctx, fmt.Sprintf("the DualWrite allocator of %v", cidr), served); err != nil {
		return Result{}, err
	}
	return measure(ctx, DualWriteAPIServer, cidr, a.For(family), fill, d, apiServerBatch)
}

// waitReady polls ready until it reports true, ctx is done or readyTimeout passes.
func waitReady(ctx context.Context, what string, ready func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	if !cache.WaitForCacheSync(ctx.Done(), ready) {
		return fmt.Errorf("bench: %s did not become ready: %w", what, ctx.Err())
	}
	return nil
}
