package interop

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/test/integration/internal/clustertest"
)

var flagRange = netip.MustParsePrefix(kubeAPIServerRange)

// startAllocators builds our Allocators for mode against the shared cluster, starts their
// informers and Run, and waits until they serve.
func startAllocators(t testing.TB, etcd *clientv3.Client, client kubernetes.Interface, mode featuregate.Mode, prefix string) *clusterip.Allocators {
	t.Helper()
	return clustertest.StartAllocators(t, clusterip.Config{Mode: mode, Ranges: []netip.Prefix{flagRange}, Bitmaps: etcdstore.Stores{Client: etcd, Prefix: prefix}, Client: client})
}

// storedBits returns the addresses set in the bitmap of flagRange at key, in ascending order.
func storedBits(t testing.TB, etcd *clientv3.Client, key string) []netip.Addr {
	t.Helper()
	bits, ok := clustertest.EtcdBits(t, etcd, key, flagRange)
	if !ok {
		t.Fatalf("read the bitmap at %s: no such key", key)
	}
	return clustertest.Addrs(bits)
}

// ipAddressObjects returns the addresses of every IPAddress object, as the API server lists them,
// in ascending order.
func ipAddressObjects(t testing.TB, client kubernetes.Interface) []netip.Addr {
	t.Helper()
	return clustertest.Addrs(clustertest.APIIPAddresses(t, client))
}

// holdings records who holds which address, to catch one address held twice. An address is
// entered after its allocation returned and removed before it is released, so an overlap here
// is an overlap in the stores.
type holdings struct {
	mu   sync.Mutex
	held map[netip.Addr]string
	dups []string
}

func (h *holdings) take(ip netip.Addr, who string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.held == nil {
		h.held = map[netip.Addr]string{}
	}
	if other, ok := h.held[ip]; ok {
		h.dups = append(h.dups, fmt.Sprintf("%s held by %s and %s", ip, other, who))
	}
	h.held[ip] = who
}

func (h *holdings) drop(ip netip.Addr) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.held, ip)
}

func (h *holdings) duplicates() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.dups)
}

// run calls fn(i) for i in [0, n) on workers goroutines.
func run(workers, n int, fn func(i int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				fn(i)
			}
		}()
	}
	wg.Wait()
}

// allocateBeside has al and kube-apiserver (through client) allocate each addresses apiece at
// once, Services named namePrefix-i, and fails t if any address is handed out twice. It returns
// our addresses, the apiserver's, and the Services to delete.
func allocateBeside(t *testing.T, al allocator.Interface, client kubernetes.Interface, each int, namePrefix string) (ours, theirs []netip.Addr, services []string) {
	t.Helper()
	ctx := context.Background()
	var h holdings
	var mu sync.Mutex
	run(16, 2*each, func(i int) {
		if i%2 == 0 {
			ip, err := al.AllocateNext(ctx, clustertest.Owner)
			if err != nil {
				t.Errorf("AllocateNext() = %v", err)
				return
			}
			h.take(ip, "ours")
			mu.Lock()
			ours = append(ours, ip)
			mu.Unlock()
			return
		}
		name := fmt.Sprintf("%s-%d", namePrefix, i)
		svc, err := client.CoreV1().Services(metav1.NamespaceDefault).Create(ctx, testenv.ClusterIPService(name, ""), metav1.CreateOptions{})
		if err != nil {
			t.Errorf("create Service %s: %v", name, err)
			return
		}
		ip := netip.MustParseAddr(svc.Spec.ClusterIP)
		h.take(ip, "Service "+name)
		mu.Lock()
		services = append(services, name)
		theirs = append(theirs, ip)
		mu.Unlock()
	})
	if dups := h.duplicates(); len(dups) > 0 {
		t.Errorf("addresses held twice: %v", dups)
	}
	return ours, theirs, services
}

func deleteServices(t *testing.T, client kubernetes.Interface, names []string) {
	t.Helper()
	run(8, len(names), func(i int) {
		if err := client.CoreV1().Services(metav1.NamespaceDefault).Delete(context.Background(), names[i], metav1.DeleteOptions{}); err != nil {
			t.Errorf("delete Service %s: %v", names[i], err)
		}
	})
}

// Our DualWrite allocator and kube-apiserver v1.33 in its default dual-write mode allocate from one
// range at once: no address is handed out twice, and every address is both a bit and an IPAddress.
func TestDualWriteBesideKubeAPIServer(t *testing.T) {
	_, etcd, api := realCluster(t)
	a := startAllocators(t, etcd, api.Client, featuregate.DualWrite, "")
	dw := a.For(corev1.IPv4Protocol)
	ctx := context.Background()

	ours, theirs, services := allocateBeside(t, dw, api.Client, 60, "beside")
	bits := storedBits(t, etcd, etcdstore.DefaultServiceIPsKey)
	objs := ipAddressObjects(t, api.Client)
	for _, ip := range append(slices.Clone(ours), theirs...) {
		if !slices.Contains(bits, ip) || !slices.Contains(objs, ip) {
			t.Errorf("%s: bit set %t, IPAddress %t; want both", ip, slices.Contains(bits, ip), slices.Contains(objs, ip))
		}
	}
	t.Logf("ours %d, the apiserver's %d; %d bits, %d IPAddress objects; %+v", len(ours), len(theirs), len(bits), len(objs), dw.(*clusterip.DualWriteAllocator).Stats())

	deleteServices(t, api.Client, services)
	for _, ip := range ours {
		if err := dw.Release(ctx, ip); err != nil {
			t.Errorf("Release(%v) = %v", ip, err)
		}
	}
	bits = storedBits(t, etcd, etcdstore.DefaultServiceIPsKey)
	objs = ipAddressObjects(t, api.Client)
	for _, ip := range ours {
		if slices.Contains(bits, ip) || slices.Contains(objs, ip) {
			t.Errorf("released %s: bit set %t, IPAddress %t; want neither", ip, slices.Contains(bits, ip), slices.Contains(objs, ip))
		}
	}
}

// Churn: 16 workers of kube-apiserver create and delete Services while 16 of ours allocate and
// release. kube-apiserver v1.33 frees a bit before deleting the IPAddress object, which makes a few
// of its own creates fail; ours must skip such addresses and never fail.
func TestDualWriteChurnBesideKubeAPIServerNeverFails(t *testing.T) {
	_, etcd, api := realCluster(t)
	a := startAllocators(t, etcd, api.Client, featuregate.DualWrite, "")
	dw := a.For(corev1.IPv4Protocol)
	ctx := context.Background()
	const ops, workers = 960, 16

	var h holdings
	var ourFails, theirFails atomic.Int64
	var latMu sync.Mutex
	var lat []time.Duration
	var wg sync.WaitGroup
	wg.Add(2)
	var ourDur time.Duration
	go func() {
		defer wg.Done()
		start := time.Now()
		defer func() { ourDur = time.Since(start) }()
		run(workers, ops, func(i int) {
			t0 := time.Now()
			ip, err := dw.AllocateNext(ctx, clustertest.Owner)
			if err != nil {
				ourFails.Add(1)
				t.Errorf("AllocateNext() = %v", err)
				return
			}
			h.take(ip, "ours")
			h.drop(ip)
			if err := dw.Release(ctx, ip); err != nil {
				ourFails.Add(1)
				t.Errorf("Release(%v) = %v", ip, err)
			}
			latMu.Lock()
			lat = append(lat, time.Since(t0))
			latMu.Unlock()
		})
	}()
	var theirs testenv.ChurnResult
	go func() {
		defer wg.Done()
		theirs = testenv.ServiceChurn{
			Workers: workers, Count: ops, Prefix: "churn", Delete: true,
			Created: func(svc *corev1.Service) {
				ip := netip.MustParseAddr(svc.Spec.ClusterIP)
				h.take(ip, "Service "+svc.Name)
				h.drop(ip)
			},
			Failed: func(name string, err error) {
				if theirFails.Add(1) <= 5 {
					t.Logf("kube-apiserver: create Service %s: %v", name, err)
				}
			},
		}.Run(ctx, t, api.Client)
	}()
	wg.Wait()
	if n := ourFails.Load(); n != 0 {
		t.Errorf("our allocator failed %d of %d operations, want 0", n, ops)
	}
	if dups := h.duplicates(); len(dups) > 0 {
		t.Errorf("addresses held twice: %v", dups)
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	if len(lat) > 0 {
		t.Logf("ours: %d AllocateNext+Release pairs, p50 %v, p99 %v, %+v; kube-apiserver: %d of %d creates failed, %.0f create+delete pairs/s",
			len(lat), lat[len(lat)/2], lat[len(lat)*99/100], dw.(*clusterip.DualWriteAllocator).Stats(), theirFails.Load(), ops, float64(ops)/theirs.Took.Seconds())
	}
	t.Logf("ours: %.0f pairs/s", float64(len(lat))/ourDur.Seconds())
	testenv.WaitFor(t, "the apiserver's IPAddress objects to go", func() bool {
		return len(ipAddressObjects(t, api.Client)) <= 1 // the kubernetes Service's
	})
	// No IPAddress object is left without its bit. kube-apiserver v1.33 leaves the bit of each of
	// its failed creates set (a stale bit that only repair frees); ours leave none.
	bits := storedBits(t, etcd, etcdstore.DefaultServiceIPsKey)
	objs := ipAddressObjects(t, api.Client)
	for _, ip := range objs {
		if !slices.Contains(bits, ip) {
			t.Errorf("after churn: IPAddress %s has no bit", ip)
		}
	}
	if stale := len(bits) - len(objs); stale > int(theirFails.Load()) {
		t.Errorf("after churn: %d bits without an IPAddress object (%v), more than kube-apiserver's %d failed creates can leave", stale, bits, theirFails.Load())
	} else {
		t.Logf("after churn: %d stale bits, all accounted for by kube-apiserver's failed creates", stale)
	}
	if got := dw.(*clusterip.DualWriteAllocator).Stats().UndoFailed; got != 0 {
		t.Errorf("Stats().UndoFailed = %d, want 0", got)
	}
	// Free the stale bits for the tests that follow.
	bm := a.Bitmap(corev1.IPv4Protocol)
	for _, ip := range bits {
		if !slices.Contains(objs, ip) {
			if err := bm.Release(ctx, ip); err != nil {
				t.Errorf("release the stale bit %s: %v", ip, err)
			}
		}
	}
}

// Our Legacy allocator (bitmap only) beside kube-apiserver in dual-write mode: no address twice,
// ours are set in the bitmap the apiserver reads, and the apiserver's are bits and objects.
func TestLegacyBesideKubeAPIServer(t *testing.T) {
	_, etcd, api := realCluster(t)
	a := startAllocators(t, etcd, api.Client, featuregate.Legacy, "")
	legacy := a.For(corev1.IPv4Protocol)
	ctx := context.Background()

	ours, theirs, services := allocateBeside(t, legacy, api.Client, 40, "legacy")
	bits := storedBits(t, etcd, etcdstore.DefaultServiceIPsKey)
	objs := ipAddressObjects(t, api.Client)
	for _, ip := range ours {
		if !slices.Contains(bits, ip) {
			t.Errorf("our %s: no bit", ip)
		}
	}
	for _, ip := range theirs {
		if !slices.Contains(bits, ip) || !slices.Contains(objs, ip) {
			t.Errorf("the apiserver's %s: bit set %t, IPAddress %t; want both", ip, slices.Contains(bits, ip), slices.Contains(objs, ip))
		}
	}
	deleteServices(t, api.Client, services)
	for _, ip := range ours {
		if err := legacy.Release(ctx, ip); err != nil {
			t.Errorf("Release(%v) = %v", ip, err)
		}
	}
}

// Going back from IPAddressOnly to DualWrite against a real cluster: the missing bitmap is
// created holding exactly the addresses of the IPAddress objects in its range.
func TestDualWriteBootstrapFromKubeAPIServer(t *testing.T) {
	_, etcd, api := realCluster(t)
	ctx := context.Background()
	var names []string
	for i := range 20 {
		name := fmt.Sprintf("bootstrap-%d", i)
		if _, err := api.Client.CoreV1().Services(metav1.NamespaceDefault).Create(ctx, testenv.ClusterIPService(name, ""), metav1.CreateOptions{}); err != nil {
			t.Fatalf("create Service %s: %v", name, err)
		}
		names = append(names, name)
	}
	defer deleteServices(t, api.Client, names)
	const prefix = "/clusterip-bootstrap-test"
	key := etcdstore.ServiceIPsKey(prefix)
	defer etcd.Delete(ctx, key)
	startAllocators(t, etcd, api.Client, featuregate.DualWrite, prefix)
	bits := storedBits(t, etcd, key)
	objs := ipAddressObjects(t, api.Client)
	if len(objs) < 21 || !slices.Equal(bits, objs) {
		t.Errorf("bootstrapped bits %v, want the %d IPAddress objects %v", bits, len(objs), objs)
	}
}
