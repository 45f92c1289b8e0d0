package servicecidr

import (
	"fmt"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kube-ipam/clusterip/internal/fakeclient"
	"github.com/kube-ipam/clusterip/internal/ipmath"
	"github.com/kube-ipam/clusterip/internal/localcluster"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/ipaddress"
)

// TestReleaseAndReuseOutrunTheInformer is the release/reuse loop of issue 18 item 15 through the
// multi-CIDR Allocator, whose per-CIDR allocators are ipaddress Allocators: on a /126 ServiceCIDR
// holding two of its three addresses, it releases one of two fixed addresses in turn, twice (the
// second Delete gets NotFound; the first may too, when AllocateNext had picked the third
// address), allocates again at once, and checks after every call that Has, Used and AllocateNext
// follow its own writes, faster than the informer reports them.
func TestReleaseAndReuseOutrunTheInformer(t *testing.T) {
	runScenario(t, testReleaseAndReuse, fakeBackend, apiserverBackend)
}

func testReleaseAndReuse(t *testing.T, b backend) {
	f := b.fixture(t, fixtureConfig{family: corev1.IPv6Protocol})
	p := netip.MustParsePrefix("fd00:18::/126")
	f.create(testenv.ServiceCIDR("a", p.String()))
	f.waitReady(p.String())
	releaseAndReuse(t, f, p, 25, true)
}

// TestReleaseAndReuseInsideAPrefixThatIsNotReady runs the loop on a ready /126 ServiceCIDR inside
// a /120 one that is not ready: Allocate and AllocateNext go through the /126, and so must
// Release, or the /126's allocator learns of each release only from the informer and AllocateNext
// finds the range full. Used counts the outer /120, whose allocator learns of the writes from
// the informer, so the loop leaves it unchecked until the informer has caught up.
func TestReleaseAndReuseInsideAPrefixThatIsNotReady(t *testing.T) {
	runScenario(t, func(t *testing.T, b backend) {
		f := b.fixture(t, fixtureConfig{family: corev1.IPv6Protocol})
		p := netip.MustParsePrefix("fd00:19::/126")
		f.create(notReady(testenv.ServiceCIDR("outer", "fd00:19::/120")))
		f.create(testenv.ServiceCIDR("inner", p.String()))
		f.waitReady(p.String())
		releaseAndReuse(t, f, p, 25, false)
	}, fakeBackend, apiserverBackend)
}

// releaseAndReuse runs the loop of TestReleaseAndReuseOutrunTheInformer on f's Allocator, which
// serves the /126 p. With checkUsed false it checks Used only at the end, once the informer has
// caught up.
func releaseAndReuse(t *testing.T, f *fixture, p netip.Prefix, rounds int, checkUsed bool) {
	t.Helper()
	a := f.alloc
	ips := []netip.Addr{p.Addr().Next(), p.Addr().Next().Next()}
	all := append(ips, ips[1].Next())
	held := map[netip.Addr]bool{}
	for _, ip := range ips {
		if err := a.Allocate(f.ctx, ip, testOwner); err != nil {
			t.Fatal(err)
		}
		held[ip] = true
	}
	mismatch := func(checkUsed bool) string {
		for _, ip := range all {
			if a.Has(ip) != held[ip] {
				return fmt.Sprintf("Has(%v) = %v, want %v", ip, a.Has(ip), held[ip])
			}
		}
		if got := a.Used(); checkUsed && got != uint64(len(held)) {
			return fmt.Sprintf("Used() = %d, want %d", got, len(held))
		}
		return ""
	}
	check := func(when string) {
		t.Helper()
		if m := mismatch(checkUsed); m != "" {
			t.Fatalf("%s: %s", when, m)
		}
	}
	for i := range rounds {
		ip := ips[i%2]
		for range 2 {
			if err := a.Release(f.ctx, ip); err != nil {
				t.Fatalf("round %d: Release(%v) = %v", i, ip, err)
			}
			delete(held, ip)
			check(fmt.Sprintf("round %d: after Release(%v)", i, ip))
		}
		got, err := a.AllocateNext(f.ctx, testOwner)
		if err != nil {
			t.Fatalf("round %d: AllocateNext() = %v, %v with %d of 3 addresses held", i, got, err, len(held))
		}
		if held[got] {
			t.Fatalf("round %d: AllocateNext() = %v, which is held", i, got)
		}
		held[got] = true
		check(fmt.Sprintf("round %d: after AllocateNext() = %v", i, got))
	}
	testenv.WaitFor(t, "the informer to catch up", func() bool { return mismatch(true) == "" })
}

// clientGoFakeBackend runs a scenario on client-go's own fake clientset, as the bench and the
// demo do, which gives objects neither a UID nor a resourceVersion. The fake loses what is
// written between an informer's list and its watch: it holds cfg.objects from the start, and the
// fixture is returned once the IPAddress informer watches.
var clientGoFakeBackend = backend{"IPAddressClientGoFake", func(t *testing.T, cfg fixtureConfig) *fixture {
	c := localcluster.NewFakeClient()
	for _, obj := range cfg.objects {
		if err := c.Tracker().Add(obj); err != nil {
			t.Fatal(err)
		}
	}
	cfg.client = c
	f := newFixture(t, cfg)
	f.real = false // no shared server to clean up
	fakeclient.WaitShowsNewIPAddresses(t, c, f.ipInf.Networking().V1().IPAddresses().Informer())
	return f
}}

// TestAllocateNextAfterReleaseWithOneAddressFree is issue 25 part 5's loop through the multi-CIDR
// Allocator: a /24 ServiceCIDR with 253 addresses taken by another writer, AllocateNext and then
// Release, round after round. AllocateNext must take the one free address every time, never
// answering ErrFull, and Has, Used and Free must follow each call.
func TestAllocateNextAfterReleaseWithOneAddressFree(t *testing.T) {
	runScenario(t, func(t *testing.T, b backend) {
		p := netip.MustParsePrefix("192.168.125.0/24")
		free := netip.MustParseAddr("192.168.125.200")
		var taken []runtime.Object
		for ip := p.Addr().Next(); p.Contains(ip); ip = ip.Next() {
			if ip != free && ipmath.Usable(p, ip) {
				taken = append(taken, ipaddress.ObjectFor(ip, testOwner, ""))
			}
		}
		// The fakes hold the objects and the ServiceCIDR from the start; on kube-apiserver another
		// writer creates them.
		sc := testenv.ServiceCIDR("a", p.String())
		f := b.fixture(t, fixtureConfig{objects: append(taken, sc)})
		if f.label != "" {
			for _, obj := range taken {
				if _, err := f.client.NetworkingV1().IPAddresses().Create(f.ctx, obj.(*networkingv1.IPAddress), metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			f.create(sc)
		}
		f.waitReady(p.String())
		a := f.alloc
		testenv.WaitFor(t, "the informer to show the 253 addresses taken", func() bool { return a.Used() == 253 })
		rounds := 2000
		if b.name == apiserverBackend.name {
			rounds = 200
		}
		check := func(when string, has bool, used uint64) {
			t.Helper()
			if a.Has(free) != has || a.Used() != used || a.Free() != 254-used {
				t.Fatalf("%s: Has(%v) = %v, Used() = %d, Free() = %d; want %v, %d, %d", when, free, a.Has(free), a.Used(), a.Free(), has, used, 254-used)
			}
		}
		for i := range rounds {
			got, err := a.AllocateNext(f.ctx, testOwner)
			if err != nil || got != free {
				t.Fatalf("round %d: AllocateNext() = %v, %v (Used %d, Free %d); want %v, nil", i, got, err, a.Used(), a.Free(), free)
			}
			check(fmt.Sprintf("round %d: after AllocateNext", i), true, 254)
			if err := a.Release(f.ctx, free); err != nil {
				t.Fatalf("round %d: Release(%v) = %v", i, free, err)
			}
			check(fmt.Sprintf("round %d: after Release", i), false, 253)
		}
	}, clientGoFakeBackend, fakeBackend, apiserverBackend)
}
