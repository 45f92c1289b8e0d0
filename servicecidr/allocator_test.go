package servicecidr

import (
	"context"
	"errors"
	"io"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/internal/ipmath"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

func TestNewRejectsBadArguments(t *testing.T) {
	f := newFixture(t, fixtureConfig{mem: newMemFactory(), noRun: true})
	cidrs, ips := f.cidrInf.Networking().V1().ServiceCIDRs(), f.ipInf.Networking().V1().IPAddresses()
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

// TestConstructorsRejectNilArguments calls every exported constructor with nil or zero
// arguments: each returns an error or a working value, and none panics.
func TestConstructorsRejectNilArguments(t *testing.T) {
	f := newFixture(t, fixtureConfig{mem: newMemFactory(), noRun: true})
	client := f.client
	cidrs, ips := f.cidrInf.Networking().V1().ServiceCIDRs(), f.ipInf.Networking().V1().IPAddresses()
	for _, tt := range []struct {
		name    string
		call    func() (io.Closer, error)
		wantErr bool
	}{
		{"New with nothing", func() (io.Closer, error) { return New("", nil, nil, nil) }, true},
		{"New with nil informers", func() (io.Closer, error) { return New(corev1.IPv4Protocol, client, nil, nil) }, true},
		{"New with a nil client", func() (io.Closer, error) { return New(corev1.IPv4Protocol, nil, cidrs, ips) }, true},
		{"New with a nil Option", func() (io.Closer, error) {
			return New(corev1.IPv4Protocol, client, cidrs, ips, nil, WithIPAddressOptions(nil))
		}, false},
		{"NewLifecycleController with nothing", func() (io.Closer, error) {
			c, err := NewLifecycleController(nil, nil, nil, LifecycleOptions{})
			return nopCloser(c), err
		}, true},
		{"NewLifecycleController with a nil client", func() (io.Closer, error) {
			c, err := NewLifecycleController(nil, cidrs, ips, LifecycleOptions{})
			return nopCloser(c), err
		}, true},
		{"NewLifecycleController with a nil ServiceCIDR informer", func() (io.Closer, error) {
			c, err := NewLifecycleController(client, nil, ips, LifecycleOptions{})
			return nopCloser(c), err
		}, true},
		{"NewLifecycleController with a nil IPAddress informer", func() (io.Closer, error) {
			c, err := NewLifecycleController(client, cidrs, nil, LifecycleOptions{})
			return nopCloser(c), err
		}, true},
		{"NewLifecycleController with zero options", func() (io.Closer, error) {
			c, err := NewLifecycleController(client, cidrs, ips, LifecycleOptions{})
			return nopCloser(c), err
		}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.call()
			if (err != nil) != tt.wantErr {
				t.Fatalf("error = %v, want error %v", err, tt.wantErr)
			}
			if err == nil {
				if err := got.Close(); err != nil {
					t.Errorf("Close() = %v", err)
				}
			}
		})
	}
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

// nopCloser lets a LifecycleController, which has nothing to close, stand in the table above.
func nopCloser(*LifecycleController) io.Closer { return closerFunc(func() error { return nil }) }

func TestNotReadyBeforeRun(t *testing.T) {
	f := newFixture(t, fixtureConfig{mem: newMemFactory(), noRun: true, objects: []runtime.Object{testenv.ServiceCIDR("a", "10.1.0.0/28")}})
	if _, err := f.alloc.AllocateNext(f.ctx, testOwner); !errors.Is(err, allocator.ErrNotReady) {
		t.Errorf("AllocateNext() before Run = %v, want ErrNotReady", err)
	}
	if err := f.alloc.Allocate(f.ctx, netip.MustParseAddr("10.1.0.1"), testOwner); !errors.Is(err, allocator.ErrNotReady) {
		t.Errorf("Allocate() before Run = %v, want ErrNotReady", err)
	}
	if err := f.alloc.DryRun().Allocate(f.ctx, netip.MustParseAddr("10.1.0.1"), testOwner); !errors.Is(err, allocator.ErrNotReady) {
		t.Errorf("DryRun().Allocate() before Run = %v, want ErrNotReady", err)
	}
	if f.alloc.Ready() {
		t.Errorf("Ready() before Run = true")
	}
	if got := f.alloc.CIDR(); got.IsValid() {
		t.Errorf("CIDR() = %v, want the zero Prefix", got)
	}
}

func TestRunTwiceFails(t *testing.T) {
	f := newFixture(t, fixtureConfig{mem: newMemFactory(), objects: []runtime.Object{testenv.ServiceCIDR("a", "10.1.0.0/28")}})
	f.waitReady("10.1.0.0/28")
	if err := f.alloc.Run(f.ctx); err == nil {
		t.Errorf("second Run() = nil, want an error")
	}
}

func TestAllocateNextPrefersFreeSpace(t *testing.T) {
	// A /22 has 1022 free addresses and a /28 14: about 1.4% of picks go to the /28.
	f := newFixture(t, fixtureConfig{mem: newMemFactory(), objects: []runtime.Object{
		testenv.ServiceCIDR("big", "10.1.0.0/22"), testenv.ServiceCIDR("small", "10.2.0.0/28"),
	}})
	f.waitReady("10.1.0.0/22", "10.2.0.0/28")
	small := 0
	for range 200 {
		ip, err := f.alloc.AllocateNext(f.ctx, testOwner)
		if err != nil {
			t.Fatal(err)
		}
		if netip.MustParsePrefix("10.2.0.0/28").Contains(ip) {
			small++
		}
	}
	// Expected about 3; 14 would be the whole /28, which uniform picks would exhaust.
	if small >= 14 {
		t.Errorf("%d of 200 addresses came from the /28, want far fewer: picks are not weighted by free space", small)
	}
}

func TestDeleteTombstone(t *testing.T) {
	mem := newMemFactory()
	f := newFixture(t, fixtureConfig{mem: mem, objects: []runtime.Object{testenv.ServiceCIDR("a", "10.1.0.0/28"), testenv.ServiceCIDR("b", "10.2.0.0/28")}})
	f.waitReady("10.1.0.0/28", "10.2.0.0/28")
	// An informer that missed the delete event removes the object from its store and hands the
	// handlers a tombstone.
	store := f.cidrInf.Networking().V1().ServiceCIDRs().Informer().GetStore()
	obj, ok, err := store.GetByKey("b")
	if err != nil || !ok {
		t.Fatalf("GetByKey(b) = %v, %v", ok, err)
	}
	if err := store.Delete(obj); err != nil {
		t.Fatal(err)
	}
	logger, _ := ktesting.NewTestContext(t)
	f.alloc.handlers(logger).OnDelete(cache.DeletedFinalStateUnknown{Key: "b", Obj: obj})
	if got, want := f.alloc.ReadyCIDRs(), []netip.Prefix{netip.MustParsePrefix("10.1.0.0/28")}; !slices.Equal(got, want) {
		t.Errorf("ReadyCIDRs() right after a tombstone = %v, want %v", got, want)
	}
	if !mem.allocs(netip.MustParsePrefix("10.2.0.0/28"))[0].closed.Load() {
		t.Errorf("the allocator of a tombstoned ServiceCIDR is still open")
	}
	f.alloc.handlers(logger).OnDelete("not a ServiceCIDR") // logged and ignored
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
	f := newFixture(t, fixtureConfig{mem: mem, objects: []runtime.Object{testenv.ServiceCIDR("a", "10.1.0.0/24"), testenv.ServiceCIDR("b", "10.2.0.0/24")}})
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
	doomed := netip.MustParsePrefix("10.2.0.0/24")
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
	f = newFixture(t, fixtureConfig{mem: mem, objects: []runtime.Object{testenv.ServiceCIDR("keep", "10.1.0.0/24"), testenv.ServiceCIDR("doomed", doomed.String())}})
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
	if err := f.alloc.Allocate(f.ctx, netip.MustParseAddr("10.2.0.7"), testOwner); !errors.Is(err, allocator.ErrNotReady) {
		t.Errorf("Allocate() in a not-ready ServiceCIDR = %v, want ErrNotReady", err)
	}
}

// TestAllocateUndoneWhenServiceCIDRStopsBeingReady is the Allocate flavour of the test above.
func TestAllocateUndoneWhenServiceCIDRStopsBeingReady(t *testing.T) {
	mem := newMemFactory()
	doomed := netip.MustParsePrefix("10.2.0.0/24")
	var f *fixture
	mem.hook = func(m *memAlloc) {
		f.alloc.mu.Lock()
		f.alloc.entries[doomed].ready = false
		f.alloc.mu.Unlock()
	}
	f = newFixture(t, fixtureConfig{mem: mem, objects: []runtime.Object{testenv.ServiceCIDR("doomed", doomed.String())}})
	f.waitReady(doomed.String())
	ip := netip.MustParseAddr("10.2.0.7")
	if err := f.alloc.Allocate(f.ctx, ip, testOwner); !errors.Is(err, allocator.ErrNotReady) {
		t.Errorf("Allocate() while the ServiceCIDR stops being ready = %v, want ErrNotReady", err)
	}
	if mem.store.has(ip) {
		t.Errorf("%v is still allocated", ip)
	}
}

func TestCloseStopsServing(t *testing.T) {
	mem := newMemFactory()
	f := newFixture(t, fixtureConfig{mem: mem, objects: []runtime.Object{testenv.ServiceCIDR("a", "10.1.0.0/28")}})
	f.waitReady("10.1.0.0/28")
	if err := f.alloc.Close(); err != nil {
		t.Fatal(err)
	}
	if !mem.allocs(netip.MustParsePrefix("10.1.0.0/28"))[0].closed.Load() {
		t.Errorf("per-CIDR allocator not closed")
	}
	if _, err := f.alloc.AllocateNext(f.ctx, testOwner); !errors.Is(err, allocator.ErrNotReady) {
		t.Errorf("AllocateNext() after Close = %v, want ErrNotReady", err)
	}
	// A later event adds nothing.
	f.create(testenv.ServiceCIDR("b", "10.2.0.0/28"))
	time.Sleep(50 * time.Millisecond)
	if got := f.alloc.ReadyCIDRs(); len(got) != 0 {
		t.Errorf("ReadyCIDRs() after Close = %v", got)
	}
}

func TestDryRunChangesNothing(t *testing.T) {
	f := newFixture(t, fixtureConfig{mem: newMemFactory(), objects: []runtime.Object{
		testenv.ServiceCIDR("a", "10.1.0.0/28"), notReady(testenv.ServiceCIDR("off", "10.9.0.0/28")),
	}})
	f.waitReady("10.1.0.0/28")
	d := f.alloc.DryRun()
	if d.DryRun() != d || d.CIDR().IsValid() || d.Family() != corev1.IPv4Protocol {
		t.Errorf("DryRun() metadata: DryRun()=%v CIDR()=%v Family()=%v", d.DryRun(), d.CIDR(), d.Family())
	}
	held := netip.MustParseAddr("10.1.0.2")
	if err := f.alloc.Allocate(f.ctx, held, testOwner); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		ip   netip.Addr
		want error
	}{
		{netip.MustParseAddr("10.1.0.3"), nil},
		{held, allocator.ErrAllocated},
		{netip.MustParseAddr("10.9.0.3"), allocator.ErrNotReady},
		{netip.MustParseAddr("10.5.0.3"), allocator.ErrMismatchedNetwork},
		{netip.Addr{}, allocator.ErrInvalid},
	} {
		if err := d.Allocate(f.ctx, tt.ip, testOwner); !errors.Is(err, tt.want) {
			t.Errorf("DryRun().Allocate(%v) = %v, want %v", tt.ip, err, tt.want)
		}
	}
	ip, err := d.AllocateNext(f.ctx, testOwner)
	if err != nil || ip == held || !netip.MustParsePrefix("10.1.0.0/28").Contains(ip) {
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

// TestServiceCIDROverlappingIPv4MappedBlockIsSkipped gives the Allocator a ServiceCIDR whose
// prefix contains ::ffff:0:0/96, from which AllocateNext could return an IPv4-mapped address that
// Release rejects: it is skipped, with a log line, and the other ServiceCIDR is served.
func TestServiceCIDROverlappingIPv4MappedBlockIsSkipped(t *testing.T) {
	for _, b := range []backend{memBackend, fakeBackend} {
		t.Run(b.name, func(t *testing.T) {
			f := b.fixture(t, fixtureConfig{family: corev1.IPv6Protocol})
			f.create(testenv.ServiceCIDR("mapped", "::fffe:0:0/95"))
			f.create(testenv.ServiceCIDR("ok", "fd00:5::/120"))
			testenv.WaitFor(t, "the logged skip", func() bool {
				return strings.Contains(logsOf(f), "Not allocating from a CIDR of a ServiceCIDR")
			})
			f.waitReady("fd00:5::/120")
			time.Sleep(50 * time.Millisecond) // more syncs: still skipped
			if got, want := f.alloc.ReadyCIDRs(), []netip.Prefix{netip.MustParsePrefix("fd00:5::/120")}; !slices.Equal(got, want) {
				t.Errorf("ReadyCIDRs() = %v, want %v", got, want)
			}
			if got := strings.Count(logsOf(f), "Not allocating from a CIDR of a ServiceCIDR"); got != 1 {
				t.Errorf("the skip was logged %d times, want once", got)
			}
			for range 20 {
				ip, err := f.alloc.AllocateNext(f.ctx, webOwner)
				if err != nil || ip.Is4In6() || !netip.MustParsePrefix("fd00:5::/120").Contains(ip) {
					t.Fatalf("AllocateNext() = %v, %v; want an address of fd00:5::/120", ip, err)
				}
			}
		})
	}
}

// logsOf returns what the fixture's logger has written so far.
func logsOf(f *fixture) string {
	return klog.FromContext(f.ctx).GetSink().(ktesting.Underlier).GetBuffer().String()
}

// TestRunAfterItsInformersStoppedWithCtxReturnsNil: Run returns nil once ctx is done, also when
// ctx was done, and the informers stopped with it, before Run could watch them.
func TestRunAfterItsInformersStoppedWithCtxReturnsNil(t *testing.T) {
	client := fake.NewClientset()
	inf := informers.NewSharedInformerFactory(client, 0)
	a, err := New(corev1.IPv4Protocol, client, inf.Networking().V1().ServiceCIDRs(), inf.Networking().V1().IPAddresses())
	if err != nil {
		t.Fatal(err)
	}
	lc, err := NewLifecycleController(client, inf.Networking().V1().ServiceCIDRs(), inf.Networking().V1().IPAddresses(), LifecycleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	inf.Start(ctx.Done())
	cancel()
	inf.Shutdown() // the informers have stopped: adding a handler now fails
	if err := a.Run(ctx); err != nil {
		t.Errorf("Allocator.Run() = %v, want nil once ctx is done", err)
	}
	if err := lc.Run(ctx, 1); err != nil {
		t.Errorf("LifecycleController.Run() = %v, want nil once ctx is done", err)
	}
}
