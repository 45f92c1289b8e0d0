package clustertest

import (
	"context"
	"net/netip"
	"slices"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/component-base/compatibility"
	"k8s.io/klog/v2"

	"github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/ipmath"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

// Owner is the owner of the addresses the tests allocate for no Service in particular.
var Owner = allocator.Owner{Resource: "services", Namespace: "default", Name: "test"}

// StartAllocators builds the Allocators of cfg, starts their informers (of cfg.Client, in
// DualWrite and IPAddressOnly mode) and Run, and waits until every family's allocator serves.
// Everything stops when t ends. It fails t if New fails or the allocators do not serve within
// [testenv.WaitTimeout].
func StartAllocators(t testing.TB, cfg clusterip.Config) *clusterip.Allocators {
	t.Helper()
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), klog.Background().V(1)))
	var inf informers.SharedInformerFactory
	if cfg.Mode != featuregate.Legacy {
		inf = informers.NewSharedInformerFactory(cfg.Client, 0)
		cfg.Informers = inf
	}
	a, err := clusterip.New(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatalf("New(%v, %v) = %v", cfg.Mode, cfg.Ranges, err)
	}
	done := make(chan struct{})
	if inf != nil {
		inf.Start(ctx.Done())
	}
	go func() {
		defer close(done)
		if err := a.Run(ctx); err != nil {
			t.Errorf("Run() = %v", err)
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		if inf != nil {
			inf.Shutdown()
		}
		if err := a.Close(); err != nil {
			t.Errorf("Close() = %v", err)
		}
	})
	readyCtx, cancelReady := context.WithTimeout(ctx, testenv.WaitTimeout)
	defer cancelReady()
	if err := a.WaitReady(readyCtx); err != nil {
		t.Fatalf("WaitReady() = %v", err)
	}
	return a
}

// WaitForKubernetesService waits until the apiserver has allocated the ClusterIP of its own
// Service default/kubernetes and, in its default dual-write mode, created the IPAddress object,
// and has created the ServiceCIDR kubernetes, so that a test's baseline does not change under it.
func WaitForKubernetesService(t testing.TB, c kubernetes.Interface) {
	t.Helper()
	ctx := context.Background()
	ip := testenv.WaitForKubernetesService(t, c)
	testenv.WaitFor(t, "the IPAddress of Service default/kubernetes", func() bool {
		_, err := c.NetworkingV1().IPAddresses().Get(ctx, ip.String(), metav1.GetOptions{})
		return err == nil
	})
	testenv.WaitFor(t, "ServiceCIDR kubernetes", func() bool {
		_, err := c.NetworkingV1().ServiceCIDRs().Get(ctx, "kubernetes", metav1.GetOptions{})
		return err == nil
	})
}

// StartOwnCluster starts an etcd and a kube-apiserver (default gates: dual write) serving flag for
// the test t alone, and waits until the apiserver has allocated the ClusterIP of its own Service.
// It returns the etcd, a client of it and the kube-apiserver, all closed when t ends.
func StartOwnCluster(t testing.TB, flag string) (*testenv.Etcd, *clientv3.Client, *testenv.KubeAPIServer) {
	t.Helper()
	etcd := testenv.NewEtcd(t)
	ec := etcd.TestClient(t)
	api := testenv.NewKubeAPIServer(t, etcd, testenv.KubeAPIServerOptions{ServiceClusterIPRange: flag})
	WaitForKubernetesService(t, api.Client)
	return etcd, ec, api
}

// APIServerBaseline returns what kube-apiserver holds before a test starts: the bits of its
// bitmap of rg (at the default key, which it returns) and its IPAddress objects. It fails t if
// kube-apiserver has not created the bitmap.
func APIServerBaseline(t testing.TB, ec *clientv3.Client, c kubernetes.Interface, rg netip.Prefix) (key string, bits, objs sets.Set[netip.Addr]) {
	t.Helper()
	key = etcdstore.ServiceIPsKey("/registry")
	bits, ok := EtcdBits(t, ec, key, rg)
	if !ok {
		t.Fatalf("no bitmap at %s: kube-apiserver has not created it", key)
	}
	return key, bits, APIIPAddresses(t, c)
}

// EtcdBits reads the bitmap at key from etcd: ok is false if the key does not exist. It fails t
// if the stored range is not r.
func EtcdBits(t testing.TB, c *clientv3.Client, key string, r netip.Prefix) (bits sets.Set[netip.Addr], ok bool) {
	t.Helper()
	s, rev, err := etcdstore.New(c, key).Get(context.Background())
	if err != nil {
		t.Fatalf("read the bitmap at %s: %v", key, err)
	}
	if rev == 0 {
		return nil, false
	}
	if s.Range != r.String() {
		t.Fatalf("the bitmap at %s is of %q, want %q", key, s.Range, r)
	}
	a, err := bitmap.New(r)
	if err != nil {
		t.Fatalf("bitmap.New(%s) = %v", r, err)
	}
	if err := a.Restore(s); err != nil {
		t.Fatalf("restore the bitmap at %s: %v", key, err)
	}
	return sets.New(slices.Collect(a.All())...), true
}

// ListsFromEtcd is the --feature-gates value that makes a test's kube-apiserver (of
// testenv.KubeAPIServerVersion, v1.33, where the gate can still be turned off) serve a consistent
// List from etcd rather than from its watch cache. The watch cache answers one only once it has
// seen etcd's current revision, and when that revision has moved on through writes it does not
// watch (the bitmaps of Legacy and DualWrite allocators) it asks etcd for progress every 100 ms
// and waits: about 50 ms a List, which a test that checks the objects after every step pays
// thousands of times. The answers are the same.
const ListsFromEtcd = "ConsistentListFromCache=false"

// APIIPAddresses lists the IPAddress objects from the API server (not from a cache). It fails t if
// the list fails or a name is not an address.
func APIIPAddresses(t testing.TB, c kubernetes.Interface) sets.Set[netip.Addr] {
	t.Helper()
	list, err := c.NetworkingV1().IPAddresses().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list IPAddress objects: %v", err)
	}
	out := sets.New[netip.Addr]()
	for _, o := range list.Items {
		ip, err := netip.ParseAddr(o.Name)
		if err != nil {
			t.Fatalf("IPAddress %q does not parse: %v", o.Name, err)
		}
		out.Insert(ip)
	}
	return out
}

// BitmapKeys returns the etcd key of each range's bitmap under prefix, in the order of ranges.
func BitmapKeys(prefix string, ranges []netip.Prefix) []string {
	keys := make([]string, len(ranges))
	for i := range ranges {
		keys[i] = etcdstore.KeyFor(prefix, i)
	}
	return keys
}

// InBitmapWindow reports whether ip has a slot in a bitmap of r: a usable address of r, and in an
// IPv6 range one of the first [bitmap.MaxIPv6Slots].
func InBitmapWindow(r netip.Prefix, ip netip.Addr) bool {
	if allocator.CheckAddr(ip) != nil {
		return false
	}
	off, ok := ipmath.Offset(r, ip)
	if !ok {
		return false
	}
	slots := ipmath.Size(r)
	if r.Addr().Is6() {
		slots = min(slots, bitmap.MaxIPv6Slots)
	}
	return off < slots
}

// FamilyOf returns the IP family of ip.
func FamilyOf(ip netip.Addr) corev1.IPFamily { return allocator.FamilyOf(ip) }

// StockVersion returns the compatibility version of the stock kube-apiserver the tests run
// (testenv.KubeAPIServerVersion, emulating its own minor): the Config.Version of allocators whose
// answers a test compares with that server's.
func StockVersion(t testing.TB) compatibility.EffectiveVersion {
	t.Helper()
	v, err := featuregate.KubeVersion(testenv.KubeAPIServerVersion, "")
	if err != nil {
		t.Fatal(err)
	}
	return v
}
