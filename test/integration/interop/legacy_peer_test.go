package interop

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/test/integration/internal/clustertest"
)

// servesNetworkingV1 reports which of the networking.k8s.io/v1 resources ServiceCIDR and
// IPAddress the apiserver behind c serves, as its discovery answers.
func servesNetworkingV1(t testing.TB, c kubernetes.Interface) (serviceCIDRs, ipAddresses bool, answer string) {
	t.Helper()
	list, err := c.Discovery().ServerResourcesForGroupVersion(networkingv1.SchemeGroupVersion.String())
	if err != nil {
		return false, false, err.Error()
	}
	var names []string
	for _, r := range list.APIResources {
		names = append(names, r.Name)
		switch r.Name {
		case "servicecidrs":
			serviceCIDRs = true
		case "ipaddresses":
			ipAddresses = true
		}
	}
	return serviceCIDRs, ipAddresses, fmt.Sprint(names)
}

// Interop case (c) of issue 10: our DualWrite allocator beside a real kube-apiserver v1.33 started
// with MultiCIDRServiceAllocator=false, which allocates from the bitmap only and creates neither
// IPAddress objects nor the default ServiceCIDR. It still serves networking.k8s.io/v1, so the test
// creates the "kubernetes" ServiceCIDR of the flag range itself, as a cluster being moved to
// DualWrite would. Then, on one etcd and at once, the apiserver creates Services (some asking for
// chosen addresses) while we AllocateNext and Allocate the same chosen addresses: no address is
// held twice, each chosen address is won exactly once, every address we hold is refused by the
// apiserver with 422 Invalid, and every address its Services hold is a bit of the bitmap.
func TestDualWriteBesideLegacyKubeAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping kube-apiserver test in -short mode")
	}
	const flag = "10.96.0.0/22" // 1022 addresses: room for both sides' 480 and the chosen ones
	rg := netip.MustParsePrefix(flag)
	etcd := testenv.NewEtcd(t)
	ec := etcd.TestClient(t)
	api := testenv.NewKubeAPIServer(t, etcd, testenv.KubeAPIServerOptions{
		ServiceClusterIPRange: flag,
		FeatureGates:          "MultiCIDRServiceAllocator=false",
	})
	c := api.Client
	// Deadlines start once the environment is up.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// The legacy peer allocates the kubernetes Service from its bitmap and creates the bitmap.
	kubeIP := testenv.WaitForKubernetesService(t, c)
	key := etcdstore.ServiceIPsKey("/registry")
	baseBits, ok := clustertest.EtcdBits(t, ec, key, rg)
	if !ok {
		t.Fatalf("no bitmap at %s: kube-apiserver with MultiCIDRServiceAllocator=false has not created it", key)
	}
	if want := []string{kubeIP.String()}; !slices.Equal(want, clustertest.Sorted(baseBits)) {
		t.Fatalf("bitmap at %s holds %v, want only the kubernetes Service's %v", key, clustertest.Sorted(baseBits), want)
	}

	// What the legacy peer serves of networking.k8s.io/v1, and what it leaves out.
	servesCIDRs, servesIPs, answer := servesNetworkingV1(t, c)
	t.Logf("MultiCIDRServiceAllocator=false: discovery of networking.k8s.io/v1 = %s", answer)
	if !servesCIDRs || !servesIPs {
		// Not observed with v1.33.13; kept so that a peer that stops serving them shows how New
		// behaves: the ServiceCIDR allocator never becomes ready.
		t.Fatalf("the apiserver does not serve networking.k8s.io/v1 servicecidrs (%t) and ipaddresses (%t): %s", servesCIDRs, servesIPs, answer)
	}
	if _, err := c.NetworkingV1().ServiceCIDRs().Get(ctx, "kubernetes", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("ServiceCIDR kubernetes: got %v, want NotFound (the legacy peer creates no default ServiceCIDR)", err)
	}
	if objs := clustertest.APIIPAddresses(t, c); len(objs) != 0 {
		t.Errorf("IPAddress objects %v, want none (the legacy peer's kubernetes Service has only its bit)", clustertest.Sorted(objs))
	}

	// Without a ServiceCIDR, New succeeds but our DualWrite allocator cannot serve: once it has
	// synced, AllocateNext still returns ErrNotReady, and the bitmap is untouched.
	noCIDRErr := allocateNextWithoutServiceCIDR(t, clusterip.Config{Mode: featuregate.DualWrite, Ranges: []netip.Prefix{rg}, Bitmaps: etcdstore.Stores{Client: ec}, Client: c})
	if !errors.Is(noCIDRErr, allocator.ErrNotReady) {
		t.Fatalf("AllocateNext() without a ServiceCIDR = %v, want an error wrapping ErrNotReady", noCIDRErr)
	}
	t.Logf("without a ServiceCIDR: AllocateNext() = %v", noCIDRErr)
	if bits, _ := clustertest.EtcdBits(t, ec, key, rg); !bits.Equal(baseBits) {
		t.Errorf("after a failed AllocateNext the bitmap holds %v, want %v", clustertest.Sorted(bits), clustertest.Sorted(baseBits))
	}

	if _, err := c.NetworkingV1().ServiceCIDRs().Create(ctx, &networkingv1.ServiceCIDR{
		ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"},
		Spec:       networkingv1.ServiceCIDRSpec{CIDRs: []string{flag}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ServiceCIDR kubernetes for %s: %v", flag, err)
	}
	a := clustertest.StartAllocators(t, clusterip.Config{Mode: featuregate.DualWrite, Ranges: []netip.Prefix{rg}, Bitmaps: etcdstore.Stores{Client: ec}, Client: c})
	dw := a.For(corev1.IPv4Protocol)

	// Chosen addresses in the static band (the first 64 of a /22), which neither side's
	// AllocateNext takes while the rest of the range has room.
	var chosen []netip.Addr
	for ip, i := netip.MustParseAddr("10.96.0.10"), 0; i < 30; ip, i = ip.Next(), i+1 {
		chosen = append(chosen, ip)
	}
	const workers, each = 4, 60
	var (
		h        holdings
		mu       sync.Mutex
		ours     []netip.Addr
		theirs   []netip.Addr
		services []string
		won      = map[netip.Addr][]string{} // chosen address → who got it
	)
	var refusedTheirs, refusedOurs int
	var ourDur, theirDur time.Duration
	var wg sync.WaitGroup
	wg.Add(2)
	start := time.Now()
	go func() { // ours: AllocateNext, then Allocate of the chosen addresses, interleaved
		defer wg.Done()
		defer func() { ourDur = time.Since(start) }()
		run(workers, workers*each+len(chosen), func(i int) {
			var ip netip.Addr
			var err error
			if i%9 == 0 && i/9 < len(chosen) {
				ip = chosen[i/9]
				if err = dw.Allocate(ctx, ip, clustertest.Owner); errors.Is(err, allocator.ErrAllocated) {
					mu.Lock()
					refusedOurs++
					mu.Unlock()
					return
				}
			} else {
				ip, err = dw.AllocateNext(ctx, clustertest.Owner)
			}
			if err != nil {
				t.Errorf("ours: %v", err)
				return
			}
			h.take(ip, "ours")
			mu.Lock()
			ours = append(ours, ip)
			if slices.Contains(chosen, ip) {
				won[ip] = append(won[ip], "ours")
			}
			mu.Unlock()
		})
	}()
	go func() { // the apiserver's Services, asking for the chosen addresses in reverse order
		defer wg.Done()
		defer func() { theirDur = time.Since(start) }()
		run(workers, workers*each+len(chosen), func(i int) {
			name := fmt.Sprintf("legacy-peer-%d", i)
			svc := testenv.ClusterIPService(name, "")
			var want netip.Addr
			if i%9 == 0 && i/9 < len(chosen) {
				want = chosen[len(chosen)-1-i/9]
				svc.Spec.ClusterIP = want.String()
			}
			got, err := c.CoreV1().Services(metav1.NamespaceDefault).Create(ctx, svc, metav1.CreateOptions{})
			if want.IsValid() && apierrors.IsInvalid(err) {
				mu.Lock()
				refusedTheirs++
				mu.Unlock()
				return
			}
			if err != nil {
				t.Errorf("create Service %s: %v", name, err)
				return
			}
			ip := netip.MustParseAddr(got.Spec.ClusterIP)
			h.take(ip, "Service "+name)
			mu.Lock()
			services = append(services, name)
			theirs = append(theirs, ip)
			if slices.Contains(chosen, ip) {
				won[ip] = append(won[ip], "Service "+name)
			}
			mu.Unlock()
		})
	}()
	wg.Wait()
	if ctx.Err() != nil {
		t.Fatalf("the concurrent phase did not end within its deadline: %v", ctx.Err())
	}

	dups := h.duplicates()
	for _, d := range dups {
		t.Errorf("held twice: %s", d)
	}
	oursWon, theirsWon := 0, 0
	for _, ip := range chosen {
		switch who := won[ip]; {
		case len(who) != 1:
			t.Errorf("chosen %s won by %v, want exactly one", ip, who)
		case who[0] == "ours":
			oursWon++
		default:
			theirsWon++
		}
	}

	// Every address we hold is visible to the apiserver: a Service asking for it is refused.
	refused, refusal := 0, ""
	run(workers, len(ours), func(i int) {
		ip := ours[i]
		name := fmt.Sprintf("ask-%d", i)
		svc := testenv.ClusterIPService(name, "")
		svc.Spec.ClusterIP = ip.String()
		_, err := c.CoreV1().Services(metav1.NamespaceDefault).Create(ctx, svc, metav1.CreateOptions{})
		switch {
		case apierrors.IsInvalid(err):
			mu.Lock()
			refused++
			refusal = err.Error()
			mu.Unlock()
		case err == nil:
			t.Errorf("the apiserver gave our %s to Service %s, want 422 Invalid", ip, name)
			mu.Lock()
			services = append(services, name)
			mu.Unlock()
		default:
			t.Errorf("create Service %s asking for our %s: %v, want 422 Invalid", name, ip, err)
		}
	})

	// Every address the apiserver's Services hold is a bit of the bitmap we read, and so are ours;
	// ours have IPAddress objects, its have none.
	bits, _ := clustertest.EtcdBits(t, ec, key, rg)
	objs := clustertest.APIIPAddresses(t, c)
	for _, ip := range theirs {
		if !bits.Has(ip) {
			t.Errorf("the apiserver's %s: no bit at %s", ip, key)
		}
		if objs.Has(ip) {
			t.Errorf("the apiserver's %s: an IPAddress object, want none from a legacy peer", ip)
		}
	}
	for _, ip := range ours {
		if !bits.Has(ip) || !objs.Has(ip) {
			t.Errorf("our %s: bit %t, IPAddress %t; want both", ip, bits.Has(ip), objs.Has(ip))
		}
	}
	if want := sets.New(theirs...).Insert(ours...).Insert(kubeIP); !bits.Equal(want) {
		t.Errorf("bitmap holds %d addresses, want exactly the %d of both sides and the kubernetes Service", len(bits), len(want))
	}
	t.Logf("ours: %d held (%d by AllocateNext, %d chosen won, %d chosen refused with ErrAllocated); "+
		"the apiserver's: %d Services (%d chosen won, %d refused with 422); duplicates %d; "+
		"the apiserver refused %d of our %d addresses with 422; bitmap %d bits, %d IPAddress objects; %+v; ours took %v, the apiserver's %v",
		len(ours), len(ours)-oursWon, oursWon, refusedOurs, len(theirs), theirsWon, refusedTheirs, len(dups),
		refused, len(ours), len(bits), len(objs), dw.(*clusterip.DualWriteAllocator).Stats(), ourDur.Round(time.Millisecond), theirDur.Round(time.Millisecond))
	t.Logf("the apiserver's answer to a Service asking for one of ours: %s", refusal)
	if refused != len(ours) {
		t.Errorf("the apiserver refused %d of our %d addresses, want all", refused, len(ours))
	}

	// Clean up so that both stores hold only the kubernetes Service again.
	deleteServices(t, c, services)
	for _, ip := range ours {
		if err := dw.Release(ctx, ip); err != nil {
			t.Errorf("Release(%v) = %v", ip, err)
		}
	}
	bits, _ = clustertest.EtcdBits(t, ec, key, rg)
	if want := []string{kubeIP.String()}; !slices.Equal(want, clustertest.Sorted(bits)) {
		t.Errorf("after cleanup the bitmap holds %d addresses, want only the kubernetes Service's", len(bits))
	}
}

// allocateNextWithoutServiceCIDR starts the Allocators of cfg, waits until their IPv4 ServiceCIDR
// allocator has synced (its error no longer says so), returns what AllocateNext answers then, and
// stops them.
func allocateNextWithoutServiceCIDR(t testing.TB, cfg clusterip.Config) error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	inf := informers.NewSharedInformerFactory(cfg.Client, 0)
	cfg.Informers = inf
	a, err := clusterip.New(ctx, cfg)
	if err != nil {
		t.Fatalf("New(%v, %v) without a ServiceCIDR = %v", cfg.Mode, cfg.Ranges, err)
	}
	inf.Start(ctx.Done())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := a.Run(ctx); err != nil {
			t.Errorf("Run() = %v", err)
		}
	}()
	defer func() {
		cancel()
		<-done
		inf.Shutdown()
		if err := a.Close(); err != nil {
			t.Errorf("Close() = %v", err)
		}
	}()
	testenv.WaitFor(t, "the ServiceCIDR allocator to sync", func() bool {
		_, err = a.For(corev1.IPv4Protocol).AllocateNext(ctx, clustertest.Owner)
		return err == nil || !strings.Contains(err.Error(), "not synced yet")
	})
	return err
}
