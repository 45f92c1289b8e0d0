package clusterip

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/bitmaptest"
	"github.com/kube-ipam/clusterip/internal/fakeclient"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/servicecidr"
)

var testOwner = allocator.Owner{Resource: "services", Namespace: "default", Name: "test"}

// journal records the writes of both stores in the order they happen.
type journal struct {
	mu      sync.Mutex
	entries []string
}

func (j *journal) add(format string, args ...any) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.entries = append(j.entries, fmt.Sprintf(format, args...))
}

func (j *journal) get() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.entries)
}

// dualFixture is a DualWriteAllocator over a servicecidr allocator on a fake clientset and a
// bitmap on a MemStore, with hooks to fail writes of either.
type dualFixture struct {
	t      *testing.T
	ctx    context.Context
	flag   netip.Prefix
	client *fakeclient.Clientset
	store  *bitmaptest.MemStore
	sc     *servicecidr.Allocator
	bm     *bitmap.Persistent
	dw     *DualWriteAllocator
	log    journal

	mu         sync.Mutex
	failCreate func(ip string) error // nil: no failure
	failDelete func(ip string) error
	failBitmap func() error
}

// injectFailures journals every verb of an IPAddress, and fails it with the error of the hook
// that current returns (read under f.mu) when that hook is set and returns one for the name.
func (f *dualFixture) injectFailures(verb string, nameOf func(k8stesting.Action) string, current func() func(string) error) {
	f.client.PrependReactor(verb, "ipaddresses", func(action k8stesting.Action) (bool, runtime.Object, error) {
		name := nameOf(action)
		f.mu.Lock()
		fail := current()
		f.mu.Unlock()
		if fail != nil {
			if err := fail(name); err != nil {
				f.log.add("%s %s failed", verb, name)
				return true, nil, err
			}
		}
		f.log.add("%s %s", verb, name)
		return false, nil, nil
	})
}

// newDualFixture serves the flag range and the extra ServiceCIDR prefixes.
func newDualFixture(t *testing.T, flag string, extra ...string) *dualFixture {
	t.Helper()
	return newDualFixtureServing(t, flag, append([]string{flag}, extra...)...)
}

// newDualFixtureServing has a bitmap of the flag range and one ServiceCIDR for each of cidrs.
func newDualFixtureServing(t *testing.T, flag string, cidrs ...string) *dualFixture {
	t.Helper()
	f := &dualFixture{t: t, flag: netip.MustParsePrefix(flag), store: bitmaptest.NewMemStore()}
	var objs []runtime.Object
	for i, p := range cidrs {
		objs = append(objs, testenv.ServiceCIDR(fmt.Sprintf("cidr-%d", i), p))
	}
	f.client = fakeclient.New(fakeclient.Options{Objects: objs})
	f.injectFailures("create", func(a k8stesting.Action) string {
		return a.(k8stesting.CreateAction).GetObject().(*networkingv1.IPAddress).Name
	}, func() func(string) error { return f.failCreate })
	f.injectFailures("delete", func(a k8stesting.Action) string { return a.(k8stesting.DeleteAction).GetName() },
		func() func(string) error { return f.failDelete })
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	f.ctx = ctx
	family := corev1.IPv4Protocol
	if f.flag.Addr().Is6() {
		family = corev1.IPv6Protocol
	}
	inf := informers.NewSharedInformerFactory(f.client, 0)
	sc, err := servicecidr.New(family, f.client, inf.Networking().V1().ServiceCIDRs(), inf.Networking().V1().IPAddresses())
	if err != nil {
		t.Fatalf("servicecidr.New() = %v", err)
	}
	f.sc = sc
	inf.Start(ctx.Done())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := sc.Run(ctx); err != nil {
			t.Errorf("servicecidr Run() = %v", err)
		}
	}()
	f.store.OnUpdate(func(context.Context, int64, bitmap.Snapshot) error {
		f.mu.Lock()
		fail := f.failBitmap
		f.mu.Unlock()
		if fail != nil {
			if err := fail(); err != nil {
				f.log.add("bitmap write failed")
				return err
			}
		}
		return nil
	})
	f.store.OnUpdated(func(_ context.Context, rev int64) error {
		f.log.add("bitmap %s", f.describeBits())
		return nil
	})
	f.bm, err = bitmap.NewPersistent(ctx, f.flag, f.store)
	if err != nil {
		t.Fatalf("NewPersistent() = %v", err)
	}
	f.dw, err = NewDualWrite(sc, f.bm, WithClient(f.client))
	if err != nil {
		t.Fatalf("NewDualWrite() = %v", err)
	}
	t.Cleanup(func() {
		cancel()
		<-done
		inf.Shutdown()
		if err := f.dw.Close(); err != nil {
			t.Errorf("Close() = %v", err)
		}
	})
	want := len(cidrs)
	testenv.WaitFor(t, "the ServiceCIDRs to be ready", func() bool { return len(sc.ReadyCIDRs()) == want })
	return f
}

func (f *dualFixture) setFailCreate(fn func(ip string) error) {
	f.mu.Lock()
	f.failCreate = fn
	f.mu.Unlock()
}
func (f *dualFixture) setFailDelete(fn func(ip string) error) {
	f.mu.Lock()
	f.failDelete = fn
	f.mu.Unlock()
}
func (f *dualFixture) setFailBitmap(fn func() error) { f.mu.Lock(); f.failBitmap = fn; f.mu.Unlock() }

// bits returns the addresses set in the stored bitmap.
func (f *dualFixture) bits() []netip.Addr {
	f.t.Helper()
	s, rev, err := f.store.Get(context.Background())
	if err != nil || rev == 0 {
		f.t.Fatalf("store.Get() = rev %d, %v", rev, err)
	}
	return bitsOf(f.t, f.flag, s)
}

func bitsOf(t testing.TB, cidr netip.Prefix, s bitmap.Snapshot) []netip.Addr {
	t.Helper()
	a, err := bitmap.New(cidr)
	if err != nil {
		t.Fatalf("bitmap.New(%s) = %v", cidr, err)
	}
	if err := a.Restore(s); err != nil {
		t.Fatalf("restore() = %v", err)
	}
	return slices.Collect(a.All())
}

func (f *dualFixture) describeBits() string {
	a, _, err := bitmap.Load(context.Background(), f.store, f.flag)
	if err != nil {
		return fmt.Sprint([]netip.Addr(nil))
	}
	return fmt.Sprint(slices.Collect(a.All()))
}

// objects returns the addresses of the IPAddress objects, sorted.
func (f *dualFixture) objects() []netip.Addr {
	f.t.Helper()
	list, err := f.client.Tracker().List(networkingv1.SchemeGroupVersion.WithResource("ipaddresses"), networkingv1.SchemeGroupVersion.WithKind("IPAddress"), "")
	if err != nil {
		f.t.Fatalf("list IPAddresses: %v", err)
	}
	var ips []netip.Addr
	for _, o := range list.(*networkingv1.IPAddressList).Items {
		ips = append(ips, netip.MustParseAddr(o.Name))
	}
	slices.SortFunc(ips, netip.Addr.Compare)
	return ips
}

// setBits stores bits directly, as a Legacy peer would have.
func (f *dualFixture) setBits(ips ...netip.Addr) {
	f.t.Helper()
	a, _, err := bitmap.Load(context.Background(), f.store, f.flag)
	if err != nil {
		f.t.Fatal(err)
	}
	for _, ip := range ips {
		if err := a.Allocate(context.Background(), ip, allocator.Owner{}); err != nil {
			f.t.Fatalf("set bit %s: %v", ip, err)
		}
	}
	f.store.Put(a.Snapshot())
}

// clearBits clears stored bits directly, as a peer giving its bits back would. It may be called
// from any goroutine: it reports a failure with Error, not Fatal.
func (f *dualFixture) clearBits(ips ...netip.Addr) {
	a, _, err := bitmap.Load(context.Background(), f.store, f.flag)
	if err != nil {
		f.t.Error(err)
		return
	}
	for _, ip := range ips {
		_ = a.Release(context.Background(), ip)
	}
	f.store.Put(a.Snapshot())
}

// checkInvariant fails t unless every IPAddress object inside the window has its bit set, and
// every bit set, other than the legacy ones, has an IPAddress object.
func (f *dualFixture) checkInvariant(legacy ...netip.Addr) {
	f.t.Helper()
	bits := f.bits()
	objs := f.objects()
	for _, ip := range objs {
		if f.dw.InWindow(ip) && !slices.Contains(bits, ip) {
			f.t.Errorf("invariant: IPAddress %s has no bit (bits %v)", ip, bits)
		}
	}
	for _, ip := range bits {
		if !slices.Contains(objs, ip) && !slices.Contains(legacy, ip) {
			f.t.Errorf("invariant: bit %s has no IPAddress object (objects %v)", ip, objs)
		}
	}
}

var errInjected = errors.New("injected failure")

var createOpts = metav1.CreateOptions{}
