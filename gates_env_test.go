package clusterip

import (
	"context"
	"net/netip"
	"slices"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/ipmath"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

// The helpers of the tests against a real etcd and kube-apiserver: the gate × Service matrix,
// skew, faults and fairness.

// startAllocatorsOf builds the Allocators of cfg, starts their informers and Run, and waits until
// every family's ServiceCIDR allocator serves (DualWrite, IPAddressOnly). Everything stops when
// t ends.
func startAllocatorsOf(t testing.TB, cfg Config) *Allocators {
	t.Helper()
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), klog.Background().V(1)))
	var inf informers.SharedInformerFactory
	if cfg.Mode != featuregate.Legacy {
		inf = informers.NewSharedInformerFactory(cfg.Client, 0)
		cfg.Informers = inf
	}
	a, err := New(ctx, cfg)
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

// waitForKubernetesService waits until the apiserver has allocated the ClusterIP of its own
// Service default/kubernetes and, in its default dual-write mode, created the IPAddress object,
// so that a test's baseline does not change under it.
func waitForKubernetesService(t testing.TB, c kubernetes.Interface) {
	t.Helper()
	ctx := context.Background()
	testenv.WaitFor(t, "Service default/kubernetes and its IPAddress", func() bool {
		svc, err := c.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
		if err != nil || svc.Spec.ClusterIP == "" {
			return false
		}
		_, err = c.NetworkingV1().IPAddresses().Get(ctx, svc.Spec.ClusterIP, metav1.GetOptions{})
		return err == nil
	})
	testenv.WaitFor(t, "ServiceCIDR kubernetes", func() bool {
		_, err := c.NetworkingV1().ServiceCIDRs().Get(ctx, "kubernetes", metav1.GetOptions{})
		return err == nil
	})
}

// addrSet is a set of addresses.
type addrSet map[netip.Addr]bool

func setOf(ips ...netip.Addr) addrSet {
	s := addrSet{}
	for _, ip := range ips {
		s[ip] = true
	}
	return s
}

// union returns a new set holding s and every address of ips.
func (s addrSet) union(ips ...netip.Addr) addrSet {
	out := s.clone()
	for _, ip := range ips {
		out[ip] = true
	}
	return out
}

// clone returns a copy of s.
func (s addrSet) clone() addrSet {
	out := addrSet{}
	for ip := range s {
		out[ip] = true
	}
	return out
}

// within returns the addresses of s that have a slot in a bitmap of r.
func (s addrSet) within(r netip.Prefix) addrSet {
	out := addrSet{}
	for ip := range s {
		if inBitmapWindow(r, ip) {
			out[ip] = true
		}
	}
	return out
}

// addrs returns the addresses of s in ascending order.
func (s addrSet) addrs() []netip.Addr {
	ips := make([]netip.Addr, 0, len(s))
	for ip := range s {
		ips = append(ips, ip)
	}
	slices.SortFunc(ips, netip.Addr.Compare)
	return ips
}

// sorted returns the addresses of s in ascending order, as strings (for readable diffs).
func (s addrSet) sorted() []string {
	ips := s.addrs()
	out := make([]string, len(ips))
	for i, ip := range ips {
		out[i] = ip.String()
	}
	return out
}

// inBitmapWindow reports whether ip has a slot in a bitmap of r.
func inBitmapWindow(r netip.Prefix, ip netip.Addr) bool {
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

// startOwnCluster starts an etcd and a kube-apiserver serving flag for this test alone, and
// waits until the apiserver has allocated the ClusterIP of its own Service.
func startOwnCluster(t testing.TB, flag string) (*testenv.Etcd, *clientv3.Client, *testenv.KubeAPIServer) {
	t.Helper()
	etcd := testenv.NewEtcd(t)
	ec := etcd.TestClient(t)
	api := testenv.NewKubeAPIServer(t, etcd, testenv.KubeAPIServerOptions{ServiceClusterIPRange: flag})
	waitForKubernetesService(t, api.Client)
	return etcd, ec, api
}

// apiserverBaseline returns what kube-apiserver holds before a test starts: the bits of its
// bitmap of rg (at the default key, which it returns) and its IPAddress objects. It fails t if
// kube-apiserver has not created the bitmap.
func apiserverBaseline(t testing.TB, ec *clientv3.Client, c kubernetes.Interface, rg netip.Prefix) (key string, bits, objs addrSet) {
	t.Helper()
	key = etcdstore.ServiceIPsKey("/registry")
	bits, ok := etcdBits(t, ec, key, rg)
	if !ok {
		t.Fatalf("no bitmap at %s: kube-apiserver has not created it", key)
	}
	return key, bits, apiIPAddressSet(t, c)
}

// etcdBits reads the bitmap at key from etcd: ok is false if the key does not exist. It fails t
// if the stored range is not r.
func etcdBits(t testing.TB, c *clientv3.Client, key string, r netip.Prefix) (bits addrSet, ok bool) {
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
	return setOf(bitsOf(t, r, s)...), true
}

// apiIPAddressSet lists the IPAddress objects from the API server.
func apiIPAddressSet(t testing.TB, c kubernetes.Interface) addrSet {
	t.Helper()
	list, err := c.NetworkingV1().IPAddresses().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list IPAddress objects: %v", err)
	}
	out := addrSet{}
	for _, o := range list.Items {
		ip, err := netip.ParseAddr(o.Name)
		if err != nil {
			t.Fatalf("IPAddress %q does not parse: %v", o.Name, err)
		}
		out[ip] = true
	}
	return out
}

// bitmapKeys returns the etcd key of each range's bitmap under prefix, in the order of ranges.
func bitmapKeys(prefix string, ranges []netip.Prefix) []string {
	keys := make([]string, len(ranges))
	for i := range ranges {
		keys[i] = etcdstore.KeyFor(prefix, i)
	}
	return keys
}

// familyOfAddr returns the family of ip.
func familyOfAddr(ip netip.Addr) corev1.IPFamily { return allocator.FamilyOf(ip) }
