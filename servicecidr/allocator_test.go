package servicecidr

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2/ktesting"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/allocator/allocatortest"
	"github.com/kube-ipam/clusterip/internal/ipmath"
)

func mustPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func mustAddr(s string) netip.Addr     { return netip.MustParseAddr(s) }

// fillAll calls AllocateNext until ErrFull and returns what it got.
func fillAll(t *testing.T, a allocator.Interface) []netip.Addr {
	t.Helper()
	var got []netip.Addr
	for {
		ip, err := a.AllocateNext(context.Background(), testOwner)
		if errors.Is(err, allocator.ErrFull) {
			return got
		}
		if err != nil {
			t.Fatalf("AllocateNext() after %d addresses = %v", len(got), err)
		}
		got = append(got, ip)
	}
}

func checkCounts(t *testing.T, a allocator.Interface, used, free uint64) {
	t.Helper()
	if got := a.Used(); got != used {
		t.Errorf("Used() = %d, want %d", got, used)
	}
	if got := a.Free(); got != free {
		t.Errorf("Free() = %d, want %d", got, free)
	}
}

func TestNewRejectsBadArguments(t *testing.T) {
	f := newFixture(t, fixtureConfig{mem: newMemFactory(), noRun: true})
	cidrs, ips := f.factory.Networking().V1().ServiceCIDRs(), f.factory.Networking().V1().IPAddresses()
	for _, tt := range []struct {
		name   string
		family corev1.IPFamily
		nilCl  bool
	}{
		{"no family", "", false},
		{"unknown family", "IPv5", false},
		{"nil client with the default allocator", corev1.IPv4Protocol, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			client := f.client
			if tt.nilCl {
				client = nil
			}
			if _, err := New(tt.family, client, cidrs, ips); err == nil {
				t.Errorf("New(%q) = nil error", tt.family)
			}
		})
	}
}

func TestNotReadyBeforeRun(t *testing.T) {
	f := newFixture(t, fixtureConfig{mem: newMemFactory(), noRun: true, objects: []runtime.Object{serviceCIDR("a", "10.1.0.0/28")}})
	if _, err := f.alloc.AllocateNext(f.ctx, testOwner); !errors.Is(err, allocator.ErrNotReady) {
		t.Errorf("AllocateNext() before Run = %v, want ErrNotReady", err)
	}
	if err := f.alloc.Allocate(f.ctx, mustAddr("10.1.0.1"), testOwner); err == nil {
		t.Errorf("Allocate() before Run = nil, want an error")
	}
	if f.alloc.Ready() {
		t.Errorf("Ready() before Run = true")
	}
	if got := f.alloc.CIDR(); got.IsValid() {
		t.Errorf("CIDR() = %v, want the zero Prefix", got)
	}
}

func TestRunTwiceFails(t *testing.T) {
	f := newFixture(t, fixtureConfig{mem: newMemFactory(), objects: []runtime.Object{serviceCIDR("a", "10.1.0.0/28")}})
	f.waitReady("10.1.0.0/28")
	if err := f.alloc.Run(f.ctx); err == nil {
		t.Errorf("second Run() = nil, want an error")
	}
}

func TestAllocateNextUsesEveryCIDR(t *testing.T) {
	cidrs := []string{"10.1.0.0/28", "10.2.0.0/28", "10.3.0.0/28"}
	f := newFixture(t, fixtureConfig{mem: newMemFactory(), objects: []runtime.Object{
		serviceCIDR("a", cidrs[0]), serviceCIDR("b", cidrs[1]), serviceCIDR("c", cidrs[2], "fd00:3::/120"),
	}})
	f.waitReady(cidrs...)
	checkCounts(t, f.alloc, 0, 3*14)
	got := fillAll(t, f.alloc)
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
			if p := mustPrefix(s); usable(p, ip) {
				per[p]++
			}
		}
	}
	for _, s := range cidrs {
		if n := per[mustPrefix(s)]; n != 14 {
			t.Errorf("%d addresses from %s, want 14", n, s)
		}
	}
	checkCounts(t, f.alloc, 3*14, 0)
	if n := len(slices.Collect(f.alloc.All())); n != 3*14 {
		t.Errorf("All() yields %d addresses, want %d", n, 3*14)
	}
	if !slices.IsSortedFunc(slices.Collect(f.alloc.All()), netip.Addr.Compare) {
		t.Errorf("All() is not in ascending order")
	}
}

func TestAllocateNextPrefersFreeSpace(t *testing.T) {
	// A /22 has 1022 free addresses and a /28 14: about 1.4% of picks go to the /28.
	f := newFixture(t, fixtureConfig{mem: newMemFactory(), objects: []runtime.Object{
		serviceCIDR("big", "10.1.0.0/22"), serviceCIDR("small", "10.2.0.0/28"),
	}})
	f.waitReady("10.1.0.0/22", "10.2.0.0/28")
	small := 0
	for range 200 {
		ip, err := f.alloc.AllocateNext(f.ctx, testOwner)
		if err != nil {
			t.Fatal(err)
		}
		if mustPrefix("10.2.0.0/28").Contains(ip) {
			small++
		}
	}
	// Expected about 3; 14 would be the whole /28, which uniform picks would exhaust.
	if small >= 14 {
		t.Errorf("%d of 200 addresses came from the /28, want far fewer: picks are not weighted by free space", small)
	}
}

func TestGrowsWhenAServiceCIDRIsAdded(t *testing.T) {
	f := newFixture(t, fixtureConfig{mem: newMemFactory(), objects: []runtime.Object{serviceCIDR("a", "10.1.0.0/29")}})
	f.waitReady("10.1.0.0/29")
	if got := fillAll(t, f.alloc); len(got) != 6 {
		t.Fatalf("filled %d addresses, want 6", len(got))
	}
	if _, err := f.alloc.AllocateNext(f.ctx, testOwner); !errors.Is(err, allocator.ErrFull) {
		t.Fatalf("AllocateNext() on a full allocator = %v, want ErrFull", err)
	}
	f.create(serviceCIDR("b", "10.2.0.0/29"))
	f.waitReady("10.1.0.0/29", "10.2.0.0/29")
	checkCounts(t, f.alloc, 6, 6)
	ip, err := f.alloc.AllocateNext(f.ctx, testOwner)
	if err != nil || !mustPrefix("10.2.0.0/29").Contains(ip) {
		t.Errorf("AllocateNext() after adding 10.2.0.0/29 = %v, %v; want an address of it", ip, err)
	}
}

func TestShrinksWhenAServiceCIDRIsDeleted(t *testing.T) {
	mem := newMemFactory()
	f := newFixture(t, fixtureConfig{mem: mem, objects: []runtime.Object{
		serviceCIDR("a", "10.1.0.0/28"), serviceCIDR("b", "10.2.0.0/28"),
	}})
	f.waitReady("10.1.0.0/28", "10.2.0.0/28")
	inB := mustAddr("10.2.0.5")
	if err := f.alloc.Allocate(f.ctx, inB, testOwner); err != nil {
		t.Fatal(err)
	}
	f.delete("b")
	f.waitReady("10.1.0.0/28")
	if !mem.allocs(mustPrefix("10.2.0.0/28"))[0].closed.Load() {
		t.Errorf("the allocator of 10.2.0.0/28 is not closed after its ServiceCIDR was deleted")
	}
	err := f.alloc.Allocate(f.ctx, mustAddr("10.2.0.6"), testOwner)
	var nir *allocator.NotInRangeError
	if !errors.As(err, &nir) || nir.Range.IsValid() || !errors.Is(err, allocator.ErrMismatchedNetwork) {
		t.Errorf("Allocate() in a deleted ServiceCIDR = %v, want a range-less *NotInRangeError", err)
	}
	if f.alloc.Has(inB) {
		t.Errorf("Has(%v) = true after its only ServiceCIDR was deleted", inB)
	}
	got := fillAll(t, f.alloc)
	for _, ip := range got {
		if !mustPrefix("10.1.0.0/28").Contains(ip) {
			t.Errorf("AllocateNext() = %v after 10.2.0.0/28 was deleted", ip)
		}
	}
	if len(got) != 14 {
		t.Errorf("filled %d addresses, want 14", len(got))
	}
}

func TestShadowedNetworkAddress(t *testing.T) {
	f := newFixture(t, fixtureConfig{mem: newMemFactory(), objects: []runtime.Object{serviceCIDR("small", "192.168.1.0/24")}})
	f.waitReady("192.168.1.0/24")
	network := mustAddr("192.168.1.0")
	broadcast := mustAddr("192.168.1.255")
	for _, ip := range []netip.Addr{network, broadcast} {
		if err := f.alloc.Allocate(f.ctx, ip, testOwner); !errors.Is(err, allocator.ErrMismatchedNetwork) {
			t.Errorf("Allocate(%v) with only 192.168.1.0/24 = %v, want a range-less *NotInRangeError", ip, err)
		}
	}
	if err := f.alloc.Allocate(f.ctx, mustAddr("192.168.1.5"), testOwner); err != nil {
		t.Fatal(err)
	}

	f.create(serviceCIDR("big", "192.168.0.0/16"))
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
	// 192.168.1.5 is in both prefixes but counted once; the /24 adds nothing to Free.
	checkCounts(t, f.alloc, 3, ipmath.Size(mustPrefix("192.168.0.0/16"))-3)
	if got, want := slices.Collect(f.alloc.All()), []netip.Addr{network, mustAddr("192.168.1.5"), broadcast}; !slices.Equal(got, want) {
		t.Errorf("All() = %v, want %v", got, want)
	}
	if err := f.alloc.Release(f.ctx, network); err != nil || f.alloc.Has(network) {
		t.Errorf("Release(%v) = %v, Has = %v; want nil, false", network, err, f.alloc.Has(network))
	}
	if err := f.alloc.Allocate(f.ctx, mustAddr("192.168.0.0"), testOwner); !errors.Is(err, allocator.ErrMismatchedNetwork) {
		t.Errorf("Allocate(192.168.0.0), the network address of the /16, = %v, want a range-less *NotInRangeError", err)
	}
}

func TestNotReadyServiceCIDRIsSkipped(t *testing.T) {
	f := newFixture(t, fixtureConfig{mem: newMemFactory(), objects: []runtime.Object{
		notReady(serviceCIDR("off", "10.1.0.0/28")), serviceCIDR("on", "10.2.0.0/29"),
	}})
	f.waitReady("10.2.0.0/29")
	got := fillAll(t, f.alloc)
	if len(got) != 6 {
		t.Errorf("filled %d addresses, want 6, all from the ready 10.2.0.0/29", len(got))
	}
	for _, ip := range got {
		if !mustPrefix("10.2.0.0/29").Contains(ip) {
			t.Errorf("AllocateNext() = %v, from a ServiceCIDR that is not ready", ip)
		}
	}
	if err := f.alloc.Allocate(f.ctx, mustAddr("10.1.0.3"), testOwner); !errors.Is(err, allocator.ErrNotReady) {
		t.Errorf("Allocate() in a not-ready ServiceCIDR = %v, want ErrNotReady", err)
	}
	// Free counts ready ServiceCIDRs only; Release works in any.
	checkCounts(t, f.alloc, 6, 0)

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
	if err := f.alloc.Allocate(f.ctx, mustAddr("10.1.0.3"), testOwner); err != nil {
		t.Errorf("Allocate() once ready = %v", err)
	}

	// Being deleted makes it not ready, whatever its condition says.
	sc = f.get("off")
	now := metav1.Now()
	sc.DeletionTimestamp = &now
	if _, err := f.client.NetworkingV1().ServiceCIDRs().Update(f.ctx, sc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitReady()
	if err := f.alloc.Release(f.ctx, mustAddr("10.1.0.3")); err != nil || f.alloc.Has(mustAddr("10.1.0.3")) {
		t.Errorf("Release() in a terminating ServiceCIDR = %v; want nil and the address freed", err)
	}
}

func TestSharedPrefixLivesUntilLastServiceCIDR(t *testing.T) {
	mem := newMemFactory()
	p := mustPrefix("10.1.0.0/28")
	f := newFixture(t, fixtureConfig{mem: mem, objects: []runtime.Object{
		serviceCIDR("one", p.String()), serviceCIDR("two", p.String()),
	}})
	f.waitReady(p.String())
	ip := mustAddr("10.1.0.9")
	if err := f.alloc.Allocate(f.ctx, ip, testOwner); err != nil {
		t.Fatal(err)
	}
	f.delete("one")
	// The delete is handled directly; wait until the other one's sync would have happened too.
	waitFor(t, "the delete of one", func() bool {
		f.alloc.mu.RLock()
		defer f.alloc.mu.RUnlock()
		e := f.alloc.entries[p]
		return e != nil && len(e.refs) == 1
	})
	if got := mem.allocs(p); len(got) != 1 || got[0].closed.Load() {
		t.Fatalf("after deleting one of two ServiceCIDRs of %v: %d allocators, first closed %v; want the one allocator, open", p, len(got), got[0].closed.Load())
	}
	if !f.alloc.Has(ip) || !slices.Equal(f.alloc.ReadyCIDRs(), []netip.Prefix{p}) {
		t.Errorf("after deleting one of two ServiceCIDRs: Has = %v, ReadyCIDRs = %v", f.alloc.Has(ip), f.alloc.ReadyCIDRs())
	}
	f.delete("two")
	f.waitReady()
	if !mem.allocs(p)[0].closed.Load() {
		t.Errorf("the allocator of %v is still open after its last ServiceCIDR was deleted", p)
	}
}

func TestSharedPrefixReadyIfAnyServiceCIDRIs(t *testing.T) {
	f := newFixture(t, fixtureConfig{mem: newMemFactory(), objects: []runtime.Object{
		notReady(serviceCIDR("off", "10.1.0.0/28")), serviceCIDR("on", "10.1.0.0/28"),
	}})
	f.waitReady("10.1.0.0/28")
	f.delete("on")
	f.waitReady()
}

func TestDeleteTombstone(t *testing.T) {
	mem := newMemFactory()
	f := newFixture(t, fixtureConfig{mem: mem, objects: []runtime.Object{serviceCIDR("a", "10.1.0.0/28"), serviceCIDR("b", "10.2.0.0/28")}})
	f.waitReady("10.1.0.0/28", "10.2.0.0/28")
	// An informer that missed the delete event removes the object from its store and hands the
	// handlers a tombstone.
	store := f.factory.Networking().V1().ServiceCIDRs().Informer().GetStore()
	obj, ok, err := store.GetByKey("b")
	if err != nil || !ok {
		t.Fatalf("GetByKey(b) = %v, %v", ok, err)
	}
	if err := store.Delete(obj); err != nil {
		t.Fatal(err)
	}
	logger, _ := ktesting.NewTestContext(t)
	f.alloc.handlers(logger).OnDelete(cache.DeletedFinalStateUnknown{Key: "b", Obj: obj})
	if got, want := f.alloc.ReadyCIDRs(), []netip.Prefix{mustPrefix("10.1.0.0/28")}; !slices.Equal(got, want) {
		t.Errorf("ReadyCIDRs() right after a tombstone = %v, want %v", got, want)
	}
	if !mem.allocs(mustPrefix("10.2.0.0/28"))[0].closed.Load() {
		t.Errorf("the allocator of a tombstoned ServiceCIDR is still open")
	}
	f.alloc.handlers(logger).OnDelete("not a ServiceCIDR") // logged and ignored
}

func TestOnlyItsOwnFamily(t *testing.T) {
	for _, tt := range []struct {
		family corev1.IPFamily
		want   string
		other  netip.Addr
	}{
		{corev1.IPv4Protocol, "10.1.0.0/28", mustAddr("fd00:1::5")},
		{corev1.IPv6Protocol, "fd00:1::/120", mustAddr("10.1.0.5")},
	} {
		t.Run(string(tt.family), func(t *testing.T) {
			f := newFixture(t, fixtureConfig{family: tt.family, mem: newMemFactory(), objects: []runtime.Object{
				serviceCIDR("dual", "10.1.0.0/28", "fd00:1::/120"),
			}})
			f.waitReady(tt.want)
			if f.alloc.Family() != tt.family {
				t.Errorf("Family() = %v, want %v", f.alloc.Family(), tt.family)
			}
			if err := f.alloc.Allocate(f.ctx, tt.other, testOwner); !errors.Is(err, allocator.ErrMismatchedNetwork) {
				t.Errorf("Allocate(%v) = %v, want a range-less *NotInRangeError", tt.other, err)
			}
			ip, err := f.alloc.AllocateNext(f.ctx, testOwner)
			if err != nil || !mustPrefix(tt.want).Contains(ip) {
				t.Errorf("AllocateNext() = %v, %v; want an address of %s", ip, err, tt.want)
			}
		})
	}
}

func TestBadInput(t *testing.T) {
	f := newFixture(t, fixtureConfig{mem: newMemFactory(), objects: []runtime.Object{serviceCIDR("a", "10.1.0.0/28")}})
	f.waitReady("10.1.0.0/28")
	for _, ip := range []netip.Addr{{}, mustAddr("::ffff:10.1.0.1"), mustAddr("fe80::1%eth0")} {
		if err := f.alloc.Allocate(f.ctx, ip, testOwner); !errors.Is(err, allocator.ErrInvalid) {
			t.Errorf("Allocate(%#v) = %v, want ErrInvalid", ip, err)
		}
		if err := f.alloc.Release(f.ctx, ip); !errors.Is(err, allocator.ErrInvalid) {
			t.Errorf("Release(%#v) = %v, want ErrInvalid", ip, err)
		}
		if f.alloc.Has(ip) {
			t.Errorf("Has(%#v) = true", ip)
		}
	}
	if err := f.alloc.Release(f.ctx, mustAddr("203.0.113.1")); err != nil {
		t.Errorf("Release() outside every ServiceCIDR = %v, want nil", err)
	}
}

// TestAllocateNextIsNotSerialised holds every caller inside the per-CIDR allocator until all of
// them are there at once; a lock held across the call would make this time out.
func TestAllocateNextIsNotSerialised(t *testing.T) {
	const callers = 4
	mem := newMemFactory()
	var (
		inside  atomic.Int32
		all     = make(chan struct{})
		closeMu sync.Once
	)
	mem.hook = func(*memAlloc) {
		if inside.Add(1) == callers {
			closeMu.Do(func() { close(all) })
		}
		select {
		case <-all:
		case <-time.After(waitTimeout):
		}
	}
	f := newFixture(t, fixtureConfig{mem: mem, objects: []runtime.Object{serviceCIDR("a", "10.1.0.0/24"), serviceCIDR("b", "10.2.0.0/24")}})
	f.waitReady("10.1.0.0/24", "10.2.0.0/24")
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := f.alloc.AllocateNext(f.ctx, testOwner); err != nil {
				t.Errorf("AllocateNext() = %v", err)
			}
		}()
	}
	wg.Wait()
	select {
	case <-all:
	default:
		t.Fatalf("only %d of %d concurrent AllocateNext calls were in the per-CIDR allocators at once", inside.Load(), callers)
	}
}

// TestAllocationUndoneWhenServiceCIDRStopsBeingReady makes the ServiceCIDR stop being ready while
// its allocator is handing out an address: the address must be released and another ServiceCIDR
// used.
func TestAllocationUndoneWhenServiceCIDRStopsBeingReady(t *testing.T) {
	mem := newMemFactory()
	doomed := mustPrefix("10.2.0.0/24")
	var f *fixture
	var hits atomic.Int32
	mem.hook = func(m *memAlloc) {
		if m.prefix != doomed {
			return
		}
		hits.Add(1)
		// What the informer would do a moment later: the ServiceCIDR is being deleted.
		f.alloc.mu.Lock()
		f.alloc.entries[doomed].ready = false
		f.alloc.mu.Unlock()
	}
	f = newFixture(t, fixtureConfig{mem: mem, objects: []runtime.Object{serviceCIDR("keep", "10.1.0.0/24"), serviceCIDR("doomed", doomed.String())}})
	f.waitReady("10.1.0.0/24", doomed.String())
	// Picks are random: allocate until one went to the doomed ServiceCIDR.
	for i := 0; hits.Load() == 0; i++ {
		if i == 200 {
			t.Fatalf("200 AllocateNext() calls never tried %v", doomed)
		}
		ip, err := f.alloc.AllocateNext(f.ctx, testOwner)
		if err != nil {
			t.Fatal(err)
		}
		if doomed.Contains(ip) {
			t.Errorf("AllocateNext() = %v, from a ServiceCIDR that stopped being ready during the call", ip)
		}
	}
	for i := range 254 {
		if a, _ := ipmath.AddrAt(doomed, uint64(i)); mem.store.has(a) {
			t.Errorf("%v is still allocated: the allocation from the not-ready ServiceCIDR was not undone", a)
		}
	}
	// Allocate of an address only in the doomed ServiceCIDR: its entry is now not ready.
	if err := f.alloc.Allocate(f.ctx, mustAddr("10.2.0.7"), testOwner); !errors.Is(err, allocator.ErrNotReady) {
		t.Errorf("Allocate() in a not-ready ServiceCIDR = %v, want ErrNotReady", err)
	}
}

// TestAllocateUndoneWhenServiceCIDRStopsBeingReady is the Allocate flavour of the test above.
func TestAllocateUndoneWhenServiceCIDRStopsBeingReady(t *testing.T) {
	mem := newMemFactory()
	doomed := mustPrefix("10.2.0.0/24")
	var f *fixture
	mem.hook = func(m *memAlloc) {
		f.alloc.mu.Lock()
		f.alloc.entries[doomed].ready = false
		f.alloc.mu.Unlock()
	}
	f = newFixture(t, fixtureConfig{mem: mem, objects: []runtime.Object{serviceCIDR("doomed", doomed.String())}})
	f.waitReady(doomed.String())
	ip := mustAddr("10.2.0.7")
	if err := f.alloc.Allocate(f.ctx, ip, testOwner); !errors.Is(err, allocator.ErrNotReady) {
		t.Errorf("Allocate() while the ServiceCIDR stops being ready = %v, want ErrNotReady", err)
	}
	if mem.store.has(ip) {
		t.Errorf("%v is still allocated", ip)
	}
}

// TestDeleteRacingAllocationsStaysInReadyCIDRs deletes a ServiceCIDR while workers allocate and
// release. An address from it may only come from a call that began before the Allocator saw it go.
func TestDeleteRacingAllocationsStaysInReadyCIDRs(t *testing.T) {
	mem := newMemFactory()
	mem.hook = func(*memAlloc) { time.Sleep(50 * time.Microsecond) }
	keep, doomed := mustPrefix("10.1.0.0/24"), mustPrefix("10.2.0.0/24")
	f := newFixture(t, fixtureConfig{mem: mem, objects: []runtime.Object{serviceCIDR("keep", keep.String()), serviceCIDR("doomed", doomed.String())}})
	f.waitReady(keep.String(), doomed.String())
	raceDelete(t, f.alloc, keep, doomed, func() { f.delete("doomed") })
}

// raceDelete runs workers that AllocateNext and Release in a loop, calls del after a while, and
// checks every address returned: inside keep or doomed, and never in doomed when the call began
// after the Allocator stopped serving doomed.
func raceDelete(t *testing.T, a *Allocator, keep, doomed netip.Prefix, del func()) {
	t.Helper()
	const workers = 8
	ctx := context.Background()
	var (
		stop      atomic.Bool
		calls     atomic.Int64
		late      atomic.Int64 // calls that began after doomed stopped being served
		fromDoom  atomic.Int64
		wg        sync.WaitGroup
		errsMu    sync.Mutex
		errs      []string
		recordErr = func(s string) {
			errsMu.Lock()
			errs = append(errs, s)
			errsMu.Unlock()
		}
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				gone := !slices.Contains(a.ReadyCIDRs(), doomed)
				ip, err := a.AllocateNext(ctx, testOwner)
				calls.Add(1)
				if err != nil {
					recordErr("AllocateNext(): " + err.Error())
					return
				}
				switch {
				case doomed.Contains(ip) && gone:
					recordErr("AllocateNext() = " + ip.String() + " from a ServiceCIDR that was no longer ready when the call began")
				case doomed.Contains(ip):
					fromDoom.Add(1)
				case !keep.Contains(ip):
					recordErr("AllocateNext() = " + ip.String() + ", in no ServiceCIDR")
				}
				if gone {
					late.Add(1)
				}
				if err := a.Release(ctx, ip); err != nil {
					recordErr("Release(): " + err.Error())
					return
				}
			}
		}()
	}
	waitFor(t, "some allocations from the doomed ServiceCIDR", func() bool { return fromDoom.Load() >= 20 })
	del()
	waitFor(t, "the Allocator to stop serving "+doomed.String(), func() bool { return !slices.Contains(a.ReadyCIDRs(), doomed) })
	start := late.Load()
	waitFor(t, "allocations after the deletion", func() bool { return late.Load() >= start+50 })
	stop.Store(true)
	wg.Wait()
	for _, e := range errs {
		t.Error(e)
	}
	t.Logf("%d calls, %d from the doomed ServiceCIDR, %d after it went", calls.Load(), fromDoom.Load(), late.Load())
}

func TestCloseStopsServing(t *testing.T) {
	mem := newMemFactory()
	f := newFixture(t, fixtureConfig{mem: mem, objects: []runtime.Object{serviceCIDR("a", "10.1.0.0/28")}})
	f.waitReady("10.1.0.0/28")
	if err := f.alloc.Close(); err != nil {
		t.Fatal(err)
	}
	if !mem.allocs(mustPrefix("10.1.0.0/28"))[0].closed.Load() {
		t.Errorf("per-CIDR allocator not closed")
	}
	if _, err := f.alloc.AllocateNext(f.ctx, testOwner); !errors.Is(err, allocator.ErrNotReady) {
		t.Errorf("AllocateNext() after Close = %v, want ErrNotReady", err)
	}
	// A later event adds nothing.
	f.create(serviceCIDR("b", "10.2.0.0/28"))
	time.Sleep(50 * time.Millisecond)
	if got := f.alloc.ReadyCIDRs(); len(got) != 0 {
		t.Errorf("ReadyCIDRs() after Close = %v", got)
	}
}

func TestDryRunChangesNothing(t *testing.T) {
	f := newFixture(t, fixtureConfig{mem: newMemFactory(), objects: []runtime.Object{
		serviceCIDR("a", "10.1.0.0/28"), notReady(serviceCIDR("off", "10.9.0.0/28")),
	}})
	f.waitReady("10.1.0.0/28")
	d := f.alloc.DryRun()
	if d.DryRun() != d || d.CIDR().IsValid() || d.Family() != corev1.IPv4Protocol {
		t.Errorf("DryRun() metadata: DryRun()=%v CIDR()=%v Family()=%v", d.DryRun(), d.CIDR(), d.Family())
	}
	held := mustAddr("10.1.0.2")
	if err := f.alloc.Allocate(f.ctx, held, testOwner); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		ip   netip.Addr
		want error
	}{
		{mustAddr("10.1.0.3"), nil},
		{held, allocator.ErrAllocated},
		{mustAddr("10.9.0.3"), allocator.ErrNotReady},
		{mustAddr("10.5.0.3"), allocator.ErrMismatchedNetwork},
		{netip.Addr{}, allocator.ErrInvalid},
	} {
		if err := d.Allocate(f.ctx, tt.ip, testOwner); !errors.Is(err, tt.want) {
			t.Errorf("DryRun().Allocate(%v) = %v, want %v", tt.ip, err, tt.want)
		}
	}
	ip, err := d.AllocateNext(f.ctx, testOwner)
	if err != nil || ip == held || !mustPrefix("10.1.0.0/28").Contains(ip) {
		t.Errorf("DryRun().AllocateNext() = %v, %v", ip, err)
	}
	if err := d.Release(f.ctx, held); err != nil {
		t.Errorf("DryRun().Release() = %v", err)
	}
	if !d.Has(held) || d.Has(ip) || d.Used() != 1 || d.Free() != 13 || len(slices.Collect(d.All())) != 1 {
		t.Errorf("after dry runs: Has(held)=%v Has(next)=%v Used=%d Free=%d", d.Has(held), d.Has(ip), d.Used(), d.Free())
	}
	if err := d.Close(); err != nil {
		t.Errorf("DryRun().Close() = %v", err)
	}
}

// TestConformanceInMemory runs the conformance suite over the in-memory per-CIDR allocator, which
// checks the multi-CIDR layer itself: each factory call makes a fresh fake clientset holding one
// ServiceCIDR.
func TestConformanceInMemory(t *testing.T) {
	allocatortest.Run(t, func(t *testing.T, cidr netip.Prefix) allocator.Interface {
		family := allocator.FamilyOf(cidr.Addr())
		f := newFixture(t, fixtureConfig{family: family, mem: newMemFactory(), objects: []runtime.Object{serviceCIDR("conformance", cidr.String())}})
		f.waitReady(cidr.String())
		return f.alloc
	}, allocatortest.MultiCIDR())
}
