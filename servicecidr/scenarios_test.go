package servicecidr

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/allocator/allocatortest"
	"github.com/kube-ipam/clusterip/internal/ipmath"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

// backend is one way to run the scenarios: the per-CIDR allocator and the API server behind it.
type backend struct {
	name string
	// fixture starts an Allocator for the test with no ServiceCIDR of its own yet.
	fixture func(t *testing.T, cfg fixtureConfig) *fixture
}

var (
	memBackend = backend{"InMemory", func(t *testing.T, cfg fixtureConfig) *fixture {
		if cfg.mem == nil {
			cfg.mem = newMemFactory()
		}
		return newFixture(t, cfg)
	}}
	fakeBackend = backend{"IPAddressFake", func(t *testing.T, cfg fixtureConfig) *fixture {
		return newFixture(t, cfg)
	}}
	apiserverBackend = backend{"IPAddressKubeAPIServer", func(t *testing.T, cfg fixtureConfig) *fixture {
		cfg.client = sharedKubeAPIServer(t)
		cfg.label = nextLabel()
		return newFixture(t, cfg)
	}}
)

var labelSeq atomic.Int64

// nextLabel returns a label value no other test of this process uses.
func nextLabel() string { return fmt.Sprintf("t%d", labelSeq.Add(1)) }

// runScenario runs fn on backends, by default all of them.
func runScenario(t *testing.T, fn func(*testing.T, backend), backends ...backend) {
	if len(backends) == 0 {
		backends = []backend{memBackend, fakeBackend, apiserverBackend}
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) { fn(t, b) })
	}
}

func TestAllocateNextUsesEveryCIDR(t *testing.T) { runScenario(t, testUsesEveryCIDR) }

func testUsesEveryCIDR(t *testing.T, b backend) {
	f := b.fixture(t, fixtureConfig{})
	cidrs := []string{"10.1.0.0/28", "10.2.0.0/28", "10.3.0.0/28"}
	f.create(testenv.ServiceCIDR("a", cidrs[0]))
	f.create(testenv.ServiceCIDR("b", cidrs[1]))
	f.create(testenv.ServiceCIDR("c", cidrs[2], "fd00:3::/120"))
	f.waitReady(cidrs...)
	allocatortest.CheckCounts(t, f.alloc, 0, 3*14)
	got := allocatortest.Fill(t, f.ctx, f.alloc, testOwner)
	if len(got) != 3*14 {
		t.Fatalf("AllocateNext() gave %d addresses before ErrFull, want %d", len(got), 3*14)
	}
	per := map[netip.Prefix]int{}
	seen := map[netip.Addr]bool{}
	for _, ip := range got {
		if seen[ip] {
			t.Errorf("AllocateNext() returned %v twice", ip)
		}
		seen[ip] = true
		for _, s := range cidrs {
			if p := netip.MustParsePrefix(s); ipmath.Usable(p, ip) {
				per[p]++
			}
		}
	}
	for _, s := range cidrs {
		if n := per[netip.MustParsePrefix(s)]; n != 14 {
			t.Errorf("%d addresses from %s, want 14", n, s)
		}
	}
	allocatortest.CheckCounts(t, f.alloc, 3*14, 0)
	all := slices.Collect(f.alloc.All())
	slices.SortFunc(got, netip.Addr.Compare)
	if !slices.Equal(all, got) {
		t.Errorf("All() = %v, want %v", all, got)
	}
}

func TestGrowsWhenAServiceCIDRIsAdded(t *testing.T) { runScenario(t, testGrows) }

func testGrows(t *testing.T, b backend) {
	f := b.fixture(t, fixtureConfig{})
	f.create(testenv.ServiceCIDR("a", "10.1.0.0/29"))
	f.waitReady("10.1.0.0/29")
	if got := allocatortest.Fill(t, f.ctx, f.alloc, testOwner); len(got) != 6 {
		t.Fatalf("filled %d addresses, want 6", len(got))
	}
	if _, err := f.alloc.AllocateNext(f.ctx, testOwner); !errors.Is(err, allocator.ErrFull) {
		t.Fatalf("AllocateNext() on a full allocator = %v, want ErrFull", err)
	}
	f.create(testenv.ServiceCIDR("b", "10.2.0.0/29"))
	f.waitReady("10.1.0.0/29", "10.2.0.0/29")
	allocatortest.CheckCounts(t, f.alloc, 6, 6)
	fillFrom(t, f, "10.2.0.0/29", 6)
}

// fillFrom fills f's allocator (see allocatortest.Fill) and checks that it gave n addresses, all
// usable in the prefix want.
func fillFrom(t *testing.T, f *fixture, want string, n int) {
	t.Helper()
	got := allocatortest.Fill(t, f.ctx, f.alloc, testOwner)
	for _, ip := range got {
		if !ipmath.Usable(netip.MustParsePrefix(want), ip) {
			t.Errorf("AllocateNext() = %v, want an address of %s", ip, want)
		}
	}
	if len(got) != n {
		t.Errorf("filled %d addresses, want %d, all from %s", len(got), n, want)
	}
}

func TestShrinksWhenAServiceCIDRIsDeleted(t *testing.T) { runScenario(t, testShrinks) }

func testShrinks(t *testing.T, b backend) {
	f := b.fixture(t, fixtureConfig{})
	f.create(testenv.ServiceCIDR("a", "10.1.0.0/28"))
	f.create(testenv.ServiceCIDR("b", "10.2.0.0/28"))
	f.waitReady("10.1.0.0/28", "10.2.0.0/28")
	inB := netip.MustParseAddr("10.2.0.5")
	if err := f.alloc.Allocate(f.ctx, inB, testOwner); err != nil {
		t.Fatal(err)
	}
	f.delete("b")
	f.waitReady("10.1.0.0/28")
	if f.mem != nil && !f.mem.allocs(netip.MustParsePrefix("10.2.0.0/28"))[0].closed.Load() {
		t.Errorf("the allocator of 10.2.0.0/28 is not closed after its ServiceCIDR was deleted")
	}
	err := f.alloc.Allocate(f.ctx, netip.MustParseAddr("10.2.0.6"), testOwner)
	var nir *allocator.NotInRangeError
	if !errors.As(err, &nir) || nir.Range.IsValid() || !errors.Is(err, allocator.ErrMismatchedNetwork) {
		t.Errorf("Allocate() in a deleted ServiceCIDR = %v, want a range-less *NotInRangeError", err)
	}
	if f.alloc.Has(inB) {
		t.Errorf("Has(%v) = true after its only ServiceCIDR was deleted", inB)
	}
	fillFrom(t, f, "10.1.0.0/28", 14)
}

func TestShadowedNetworkAddress(t *testing.T) { runScenario(t, testShadowed) }

// testShadowed checks that the network and broadcast addresses of a /24 are allocatable only once
// a ServiceCIDR containing the /24 exists, and that addresses in both are counted once.
func testShadowed(t *testing.T, b backend) {
	f := b.fixture(t, fixtureConfig{})
	f.create(testenv.ServiceCIDR("small", "192.168.1.0/24"))
	f.waitReady("192.168.1.0/24")
	network, broadcast, inside := netip.MustParseAddr("192.168.1.0"), netip.MustParseAddr("192.168.1.255"), netip.MustParseAddr("192.168.1.5")
	for _, ip := range []netip.Addr{network, broadcast} {
		if err := f.alloc.Allocate(f.ctx, ip, testOwner); !errors.Is(err, allocator.ErrMismatchedNetwork) {
			t.Errorf("Allocate(%v) with only 192.168.1.0/24 = %v, want a range-less *NotInRangeError", ip, err)
		}
	}
	if err := f.alloc.Allocate(f.ctx, inside, testOwner); err != nil {
		t.Fatal(err)
	}

	f.create(testenv.ServiceCIDR("big", "192.168.0.0/16"))
	f.waitReady("192.168.0.0/16", "192.168.1.0/24")
	for _, ip := range []netip.Addr{network, broadcast} {
		if err := f.alloc.Allocate(f.ctx, ip, testOwner); err != nil {
			t.Errorf("Allocate(%v) with 192.168.0.0/16 = %v, want nil", ip, err)
		}
		if !f.alloc.Has(ip) {
			t.Errorf("Has(%v) = false after Allocate", ip)
		}
		if err := f.alloc.Allocate(f.ctx, ip, testOwner); !errors.Is(err, allocator.ErrAllocated) {
			t.Errorf("second Allocate(%v) = %v, want ErrAllocated", ip, err)
		}
	}
	// 192.168.1.5 is in both prefixes and counted once; the /24 adds nothing to Free.
	allocatortest.CheckCounts(t, f.alloc, 3, ipmath.Size(netip.MustParsePrefix("192.168.0.0/16"))-3)
	if got, want := slices.Collect(f.alloc.All()), []netip.Addr{network, inside, broadcast}; !slices.Equal(got, want) {
		t.Errorf("All() = %v, want %v", got, want)
	}
	if err := f.alloc.Release(f.ctx, network); err != nil || f.alloc.Has(network) {
		t.Errorf("Release(%v) = %v, Has = %v; want nil, false", network, err, f.alloc.Has(network))
	}
	if err := f.alloc.Allocate(f.ctx, netip.MustParseAddr("192.168.0.0"), testOwner); !errors.Is(err, allocator.ErrMismatchedNetwork) {
		t.Errorf("Allocate(192.168.0.0), the network address of the /16, = %v, want a range-less *NotInRangeError", err)
	}
	// Deleting the /16 shadows them again.
	f.delete("big")
	f.waitReady("192.168.1.0/24")
	if err := f.alloc.Allocate(f.ctx, network, testOwner); !errors.Is(err, allocator.ErrMismatchedNetwork) {
		t.Errorf("Allocate(%v) after deleting the /16 = %v, want a range-less *NotInRangeError", network, err)
	}
}

func TestNotReadyServiceCIDRIsSkipped(t *testing.T) { runScenario(t, testNotReadySkipped) }

func testNotReadySkipped(t *testing.T, b backend) {
	f := b.fixture(t, fixtureConfig{})
	f.create(notReady(testenv.ServiceCIDR("off", "10.1.0.0/28")))
	f.create(testenv.ServiceCIDR("on", "10.2.0.0/29"))
	f.waitReady("10.2.0.0/29")
	fillFrom(t, f, "10.2.0.0/29", 6) // the ready one only
	if err := f.alloc.Allocate(f.ctx, netip.MustParseAddr("10.1.0.3"), testOwner); !errors.Is(err, allocator.ErrNotReady) {
		t.Errorf("Allocate() in a not-ready ServiceCIDR = %v, want ErrNotReady", err)
	}
	allocatortest.CheckCounts(t, f.alloc, 6, 0) // Free counts ready ServiceCIDRs only

	f.delete("on")
	f.waitReady()
	if _, err := f.alloc.AllocateNext(f.ctx, testOwner); !errors.Is(err, allocator.ErrNotReady) {
		t.Errorf("AllocateNext() with no ready ServiceCIDR = %v, want ErrNotReady", err)
	}

	// Becoming ready makes it usable.
	sc := f.get("off")
	sc.Status.Conditions[0].Status = metav1.ConditionTrue
	if _, err := f.client.NetworkingV1().ServiceCIDRs().UpdateStatus(f.ctx, sc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitReady("10.1.0.0/28")
	ip := netip.MustParseAddr("10.1.0.3")
	if err := f.alloc.Allocate(f.ctx, ip, testOwner); err != nil {
		t.Errorf("Allocate() once ready = %v", err)
	}

	// Being deleted makes it not ready, whatever its condition says; Release still works.
	f.markDeleting("off")
	f.waitReady()
	if _, err := f.alloc.AllocateNext(f.ctx, testOwner); !errors.Is(err, allocator.ErrNotReady) {
		t.Errorf("AllocateNext() with only a terminating ServiceCIDR = %v, want ErrNotReady", err)
	}
	if err := f.alloc.Release(f.ctx, ip); err != nil {
		t.Errorf("Release() in a terminating ServiceCIDR = %v", err)
	}
	testenv.WaitFor(t, "the release to show", func() bool { return !f.alloc.Has(ip) })
}

func TestSharedPrefixLivesUntilLastServiceCIDR(t *testing.T) { runScenario(t, testSharedPrefix) }

func testSharedPrefix(t *testing.T, b backend) {
	f := b.fixture(t, fixtureConfig{})
	p := netip.MustParsePrefix("10.1.0.0/28")
	f.create(testenv.ServiceCIDR("one", p.String()))
	f.create(testenv.ServiceCIDR("two", p.String()))
	f.create(notReady(testenv.ServiceCIDR("off", p.String())))
	f.waitReady(p.String())
	testenv.WaitFor(t, "three ServiceCIDRs on one prefix", func() bool { return f.alloc.refs(p) == 3 })
	ip := netip.MustParseAddr("10.1.0.9")
	if err := f.alloc.Allocate(f.ctx, ip, testOwner); err != nil {
		t.Fatal(err)
	}
	f.delete("one")
	testenv.WaitFor(t, "the delete of one", func() bool { return f.alloc.refs(p) == 2 })
	if f.mem != nil {
		if got := f.mem.allocs(p); len(got) != 1 || got[0].closed.Load() {
			t.Fatalf("after deleting one of the ServiceCIDRs of %v: %d allocators; want the first, open", p, len(got))
		}
	}
	if !f.alloc.Has(ip) || !slices.Equal(f.alloc.ReadyCIDRs(), []netip.Prefix{p}) {
		t.Errorf("after deleting one of the ServiceCIDRs: Has = %v, ReadyCIDRs = %v", f.alloc.Has(ip), f.alloc.ReadyCIDRs())
	}
	// The one left is not ready: the prefix stays, not ready.
	f.delete("two")
	f.waitReady()
	if f.alloc.refs(p) != 1 || !f.alloc.Has(ip) {
		t.Errorf("with only a not-ready ServiceCIDR left: refs = %d, Has = %v; want 1, true", f.alloc.refs(p), f.alloc.Has(ip))
	}
	f.delete("off")
	testenv.WaitFor(t, "the prefix to go", func() bool { return f.alloc.refs(p) == 0 })
	if f.mem != nil && !f.mem.allocs(p)[0].closed.Load() {
		t.Errorf("the allocator of %v is still open after its last ServiceCIDR was deleted", p)
	}
}

// refs returns how many ServiceCIDRs hold p, 0 if the Allocator has no allocator for it.
func (a *Allocator) refs(p netip.Prefix) int {
	a.mu.RLock()
	defer a.mu.RUnlock()
	if e := a.entries[p]; e != nil {
		return len(e.refs)
	}
	return 0
}

func TestOnlyItsOwnFamily(t *testing.T) { runScenario(t, testOwnFamily) }

func testOwnFamily(t *testing.T, b backend) {
	for _, tt := range []struct {
		family corev1.IPFamily
		want   string
		other  netip.Addr
	}{
		{corev1.IPv4Protocol, "10.1.0.0/28", netip.MustParseAddr("fd00:1::5")},
		{corev1.IPv6Protocol, "fd00:1::/120", netip.MustParseAddr("10.1.0.5")},
	} {
		t.Run(string(tt.family), func(t *testing.T) {
			f := b.fixture(t, fixtureConfig{family: tt.family})
			f.create(testenv.ServiceCIDR("dual", "10.1.0.0/28", "fd00:1::/120"))
			f.waitReady(tt.want)
			if f.alloc.Family() != tt.family {
				t.Errorf("Family() = %v, want %v", f.alloc.Family(), tt.family)
			}
			if err := f.alloc.Allocate(f.ctx, tt.other, testOwner); !errors.Is(err, allocator.ErrMismatchedNetwork) {
				t.Errorf("Allocate(%v) = %v, want a range-less *NotInRangeError", tt.other, err)
			}
			ip, err := f.alloc.AllocateNext(f.ctx, testOwner)
			if err != nil || !netip.MustParsePrefix(tt.want).Contains(ip) {
				t.Errorf("AllocateNext() = %v, %v; want an address of %s", ip, err, tt.want)
			}
		})
	}
}

func TestDeleteRacingAllocationsStaysInReadyCIDRs(t *testing.T) {
	runScenario(t, func(t *testing.T, b backend) {
		var mem *memFactory
		if b.name == memBackend.name {
			mem = newMemFactory()
			mem.hook = func(*memAlloc) { time.Sleep(50 * time.Microsecond) }
		}
		f := b.fixture(t, fixtureConfig{mem: mem})
		keep, doomed := netip.MustParsePrefix("10.1.0.0/24"), netip.MustParsePrefix("10.2.0.0/24")
		f.create(testenv.ServiceCIDR("keep", keep.String()))
		f.create(testenv.ServiceCIDR("doomed", doomed.String()))
		f.waitReady(keep.String(), doomed.String())
		held := raceDelete(t, f.alloc, keep, doomed, 0, false, func() { f.delete("doomed") })
		release(t, f.alloc, held)
	})
}

// TestLifecycleHoldsDeletionRacingAllocations deletes a ServiceCIDR guarded by the
// LifecycleController while workers allocate and hold addresses: the ServiceCIDR stays until the
// addresses in it are released, and no address comes from it once the Allocator saw it go.
func TestLifecycleHoldsDeletionRacingAllocations(t *testing.T) {
	runScenario(t, func(t *testing.T, b backend) {
		f := b.fixture(t, fixtureConfig{lifecycle: &LifecycleOptions{GracePeriod: 500 * time.Millisecond, RecheckInterval: 100 * time.Millisecond}})
		keep, doomed := netip.MustParsePrefix("10.1.0.0/24"), netip.MustParsePrefix("10.2.0.0/24")
		f.create(testenv.ServiceCIDR("keep", keep.String()))
		f.create(testenv.ServiceCIDR("doomed", doomed.String()))
		f.waitFinalized("keep", "doomed")
		f.waitReady(keep.String(), doomed.String())
		held := raceDelete(t, f.alloc, keep, doomed, 2, true, func() { f.markDeleting("doomed") })
		f.waitTerminating("doomed")
		var inDoomed []netip.Addr
		for _, ip := range held {
			if doomed.Contains(ip) {
				inDoomed = append(inDoomed, ip)
			}
		}
		if len(inDoomed) == 0 {
			t.Fatalf("the workers hold no address of %v; the test proves nothing", doomed)
		}
		if !f.hasFinalizer("doomed") {
			t.Fatalf("finalizer removed while %d held addresses are in the ServiceCIDR", len(inDoomed))
		}
		release(t, f.alloc, held)
		f.waitGone("doomed")
		if n := f.countIPAddresses(doomed); n != 0 {
			t.Errorf("%d IPAddresses in %v after it was deleted", n, doomed)
		}
	}, fakeBackend, apiserverBackend)
}

// TestLifecycleBlocksThenAllowsDeletion is the plain case: one address blocks the deletion until
// it is released.
func TestLifecycleBlocksThenAllowsDeletion(t *testing.T) {
	runScenario(t, func(t *testing.T, b backend) {
		grace := 300 * time.Millisecond
		f := b.fixture(t, fixtureConfig{lifecycle: &LifecycleOptions{GracePeriod: grace, RecheckInterval: 100 * time.Millisecond}})
		f.create(testenv.ServiceCIDR("keep", "10.11.0.0/24"))
		f.create(testenv.ServiceCIDR("doomed", "10.12.0.0/24"))
		f.waitFinalized("keep", "doomed")
		f.waitReady("10.11.0.0/24", "10.12.0.0/24")
		ip := netip.MustParseAddr("10.12.0.10")
		if err := f.alloc.Allocate(f.ctx, ip, testOwner); err != nil {
			t.Fatal(err)
		}
		f.markDeleting("doomed")
		f.waitTerminating("doomed")
		f.waitReady("10.11.0.0/24")
		if err := f.alloc.Allocate(f.ctx, netip.MustParseAddr("10.12.0.11"), testOwner); !errors.Is(err, allocator.ErrNotReady) {
			t.Errorf("Allocate() in a terminating ServiceCIDR = %v, want ErrNotReady", err)
		}
		for range 10 {
			got, err := f.alloc.AllocateNext(f.ctx, testOwner)
			if err != nil || !netip.MustParsePrefix("10.11.0.0/24").Contains(got) {
				t.Errorf("AllocateNext() = %v, %v; want an address of the ServiceCIDR that is not being deleted", got, err)
			}
		}
		time.Sleep(2 * grace)
		if !f.hasFinalizer("doomed") {
			t.Fatalf("finalizer removed while %v is allocated in no other ServiceCIDR", ip)
		}
		if err := f.alloc.Release(f.ctx, ip); err != nil {
			t.Fatal(err)
		}
		f.waitGone("doomed")
	}, fakeBackend, apiserverBackend)
}

// waitFinalized waits until the LifecycleController has added its finalizer and Ready=True.
func (f *fixture) waitFinalized(names ...string) {
	f.t.Helper()
	for _, n := range names {
		testenv.WaitFor(f.t, "finalizer and Ready=True on "+n, func() bool {
			sc := f.get(n)
			c := readyCondition(sc)
			return slices.Contains(sc.Finalizers, Finalizer) && c != nil && c.Status == metav1.ConditionTrue
		})
	}
}

// countIPAddresses returns the number of IPAddress objects in p.
func (f *fixture) countIPAddresses(p netip.Prefix) int {
	f.t.Helper()
	list, err := f.client.NetworkingV1().IPAddresses().List(f.ctx, metav1.ListOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	n := 0
	for _, ipa := range list.Items {
		if ip, err := netip.ParseAddr(ipa.Name); err == nil && p.Contains(ip) {
			n++
		}
	}
	return n
}

func release(t *testing.T, a *Allocator, ips []netip.Addr) {
	t.Helper()
	for _, ip := range ips {
		if err := a.Release(context.Background(), ip); err != nil {
			t.Errorf("Release(%v) = %v", ip, err)
		}
	}
}

// raceDelete runs workers that AllocateNext in a loop, each holding its last hold addresses and
// releasing older ones (with holdDoomed, those in doomed are held for good), calls del after a while, and checks every address returned: inside keep
// or doomed, and never in doomed when the call began after the Allocator stopped serving doomed.
// It returns the addresses still held.
func raceDelete(t *testing.T, a *Allocator, keep, doomed netip.Prefix, hold int, holdDoomed bool, del func()) []netip.Addr {
	t.Helper()
	const workers = 8
	ctx := context.Background()
	var (
		stop     atomic.Bool
		calls    atomic.Int64
		late     atomic.Int64 // calls that began after doomed stopped being served
		fromDoom atomic.Int64
		wg       sync.WaitGroup
		mu       sync.Mutex // guards errs and held
		errs     []string
		held     []netip.Addr
	)
	fail := func(s string) {
		mu.Lock()
		errs = append(errs, s)
		mu.Unlock()
	}
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []netip.Addr
			defer func() {
				mu.Lock()
				held = append(held, mine...)
				mu.Unlock()
			}()
			for !stop.Load() {
				gone := !slices.Contains(a.ReadyCIDRs(), doomed)
				ip, err := a.AllocateNext(ctx, testOwner)
				calls.Add(1)
				if err != nil {
					fail("AllocateNext(): " + err.Error())
					return
				}
				switch {
				case doomed.Contains(ip) && gone:
					fail("AllocateNext() = " + ip.String() + " from a ServiceCIDR that was no longer ready when the call began")
				case doomed.Contains(ip):
					fromDoom.Add(1)
				case !keep.Contains(ip):
					fail("AllocateNext() = " + ip.String() + ", in no ServiceCIDR")
				}
				if gone {
					late.Add(1)
				}
				mine = append(mine, ip)
				if len(mine) > hold {
					i := 0
					for holdDoomed && i < len(mine)-1 && doomed.Contains(mine[i]) {
						i++
					}
					if err := a.Release(ctx, mine[i]); err != nil {
						fail("Release(): " + err.Error())
						return
					}
					mine = slices.Delete(mine, i, i+1)
				}
			}
		}()
	}
	testenv.WaitFor(t, "some allocations from the doomed ServiceCIDR", func() bool { return fromDoom.Load() >= 20 })
	del()
	testenv.WaitFor(t, "the Allocator to stop serving "+doomed.String(), func() bool { return !slices.Contains(a.ReadyCIDRs(), doomed) })
	start := late.Load()
	testenv.WaitFor(t, "allocations after the deletion", func() bool { return late.Load() >= start+50 })
	stop.Store(true)
	wg.Wait()
	for _, e := range errs {
		t.Error(e)
	}
	t.Logf("%d calls, %d from the doomed ServiceCIDR, %d after it went", calls.Load(), fromDoom.Load(), late.Load())
	return held
}

func TestConformance(t *testing.T) {
	runScenario(t, func(t *testing.T, b backend) {
		allocatortest.Run(t, func(t *testing.T, cidr netip.Prefix) allocator.Interface {
			f := b.fixture(t, fixtureConfig{family: allocator.FamilyOf(cidr.Addr())})
			f.create(testenv.ServiceCIDR("conformance", cidr.String()))
			f.waitReady(cidr.String())
			return f.alloc
		}, allocatortest.MultiCIDR())
	})
}
