package ipaddress

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	networkingv1informers "k8s.io/client-go/informers/networking/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	networkingv1listers "k8s.io/client-go/listers/networking/v1"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/allocator/allocatortest"
	"github.com/kube-ipam/clusterip/internal/fakeclient"
	"github.com/kube-ipam/clusterip/internal/ipmath"
	"github.com/kube-ipam/clusterip/internal/localcluster"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

var testOwner = allocator.Owner{Resource: "services", Namespace: "default", Name: "web"}

func TestConformanceWithFakeClientset(t *testing.T) {
	allocatortest.Run(t, func(t *testing.T, cidr netip.Prefix) allocator.Interface {
		return newFixture(t, cidr, fixtureOptions{}).a
	}, allocatortest.RecordsOwners())
}

func TestNewValidatesRange(t *testing.T) {
	tests := []struct {
		cidr    string
		wantErr bool
	}{
		{"10.0.0.0/24", false},
		{"0.0.0.0/0", false},
		{"10.0.0.0/30", false},
		{"10.0.0.0/31", true},
		{"10.0.0.1/24", true},
		{"fd00::/64", false},
		{"fd00::/120", false},
		{"fd00::/63", true},
		{"::/0", true},
		{"fd00::/128", true},
		{"::ffff:10.0.0.0/120", true},
		{"::/80", true},         // contains ::ffff:0:0/96
		{"::fffe:0:0/95", true}, // contains ::ffff:0:0/96
		{"::fffe:0:0/96", false},
	}
	client := fakeclient.New(fakeclient.Options{FieldManaged: true})
	for _, tt := range tests {
		t.Run(tt.cidr, func(t *testing.T) {
			factoryInformer := newInformer(client)
			a, err := New(netip.MustParsePrefix(tt.cidr), client, factoryInformer)
			if tt.wantErr {
				var pe *allocator.PrefixError
				if !errors.As(err, &pe) || !errors.Is(err, allocator.ErrInvalid) {
					t.Fatalf("New(%s) = %v, want a *PrefixError", tt.cidr, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("New(%s) = %v", tt.cidr, err)
			}
			a.Close()
		})
	}
}

func TestSizesOfTheWidestRanges(t *testing.T) {
	tests := []struct {
		cidr     string
		wantSize uint64
		wantBand uint64
	}{
		{"0.0.0.0/0", 1<<32 - 2, 0}, // no static band past 31 host bits, as in kube-apiserver
		{"fd00::/64", 1<<64 - 1, 256},
		{"10.0.0.0/28", 14, 0},
	}
	for _, tt := range tests {
		t.Run(tt.cidr, func(t *testing.T) {
			f := newFixture(t, netip.MustParsePrefix(tt.cidr), fixtureOptions{}, WithSeed(1))
			if f.a.Size() != tt.wantSize || f.a.StaticBand() != tt.wantBand {
				t.Fatalf("Size(), StaticBand() = %d, %d, want %d, %d", f.a.Size(), f.a.StaticBand(), tt.wantSize, tt.wantBand)
			}
			ip, err := f.a.AllocateNext(context.Background(), testOwner)
			if err != nil {
				t.Fatalf("AllocateNext() = %v", err)
			}
			if off, ok := ipmath.Offset(f.a.CIDR(), ip); !ok || off < tt.wantBand {
				t.Errorf("AllocateNext() = %v (offset %d), want one of the dynamic band", ip, off)
			}
			if got, want := f.a.Free(), tt.wantSize-1; got != want {
				t.Errorf("Free() = %d, want %d", got, want)
			}
		})
	}
}

func TestAllocateNextRetriesOnceOnAlreadyExists(t *testing.T) {
	f := newFixture(t, netip.MustParsePrefix("10.1.0.0/24"), fixtureOptions{}, WithSeed(7))
	calls := 0
	f.client.PrependReactor("create", "ipaddresses", func(action k8stesting.Action) (bool, runtime.Object, error) {
		calls++
		if calls == 1 {
			// Another writer holds the address; our informer has not seen it yet.
			name := action.(k8stesting.CreateAction).GetObject().(*networkingv1.IPAddress).Name
			return true, nil, alreadyExists(name)
		}
		return false, nil, nil
	})
	f.client.ClearActions()

	ip, err := f.a.AllocateNext(context.Background(), testOwner)
	if err != nil {
		t.Fatalf("AllocateNext() = %v", err)
	}
	creates := createActions(f.client)
	if len(creates) != 2 {
		t.Fatalf("AllocateNext() sent %d creates, want 2", len(creates))
	}
	first := netip.MustParseAddr(creates[0].GetObject().(*networkingv1.IPAddress).Name)
	second := netip.MustParseAddr(creates[1].GetObject().(*networkingv1.IPAddress).Name)
	if first == second {
		t.Errorf("retry asked for %v again", first)
	}
	if second != ip {
		t.Errorf("AllocateNext() = %v, want the second create's %v", ip, second)
	}
	if !f.a.Has(first) {
		t.Errorf("Has(%v) = false, want the colliding address marked allocated", first)
	}
	if got := f.a.Used(); got != 2 {
		t.Errorf("Used() = %d, want 2 (ours and the collision)", got)
	}
}

func TestAllocateNextReturnsServerErrorsAtOnce(t *testing.T) {
	f := newFixture(t, netip.MustParsePrefix("10.1.0.0/24"), fixtureOptions{})
	f.client.PrependReactor("create", "ipaddresses", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewInternalError(errors.New("etcd is down"))
	})
	f.client.ClearActions()

	ip, err := f.a.AllocateNext(context.Background(), testOwner)
	if err == nil {
		t.Fatalf("AllocateNext() = %v, nil; want an error", ip)
	}
	if !apierrors.IsInternalError(err) {
		t.Errorf("AllocateNext() = %v, want apierrors.IsInternalError", err)
	}
	if errors.Is(err, allocator.ErrFull) {
		t.Errorf("AllocateNext() = %v, must not be ErrFull", err)
	}
	if n := len(createActions(f.client)); n != 1 {
		t.Errorf("AllocateNext() sent %d creates, want 1", n)
	}
	if got := f.a.Used(); got != 0 {
		t.Errorf("Used() = %d after a failed create, want 0", got)
	}

	err = f.a.Allocate(context.Background(), netip.MustParseAddr("10.1.0.9"), testOwner)
	if !apierrors.IsInternalError(err) || errors.Is(err, allocator.ErrAllocated) {
		t.Errorf("Allocate() = %v, want apierrors.IsInternalError", err)
	}
	if f.a.Has(netip.MustParseAddr("10.1.0.9")) {
		t.Error("Has() = true after a failed Allocate")
	}
}

func TestAllocateOfATakenAddressIsErrAllocatedAndAlreadyExists(t *testing.T) {
	f := newFixture(t, netip.MustParsePrefix("10.1.0.0/24"), fixtureOptions{})
	ip := netip.MustParseAddr("10.1.0.20")
	// Another writer's object, not yet seen by the informer of a second allocator.
	if _, err := f.client.NetworkingV1().IPAddresses().Create(context.Background(), ipAddressObject(ip.String(), "", 0), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	err := f.a.Allocate(context.Background(), ip, testOwner)
	if !errors.Is(err, allocator.ErrAllocated) || !apierrors.IsAlreadyExists(err) {
		t.Fatalf("Allocate(%v) = %v, want ErrAllocated and AlreadyExists", ip, err)
	}
	if !f.a.Has(ip) {
		t.Errorf("Has(%v) = false", ip)
	}
}

func TestNotReadyUntilSyncedAndWhileSwitchedOff(t *testing.T) {
	f := newFixture(t, netip.MustParsePrefix("10.2.0.0/28"), fixtureOptions{noStart: true})
	ctx := context.Background()
	ip := netip.MustParseAddr("10.2.0.3")
	if f.a.Ready() {
		t.Error("Ready() = true before the informer synced")
	}
	if f.a.HasSynced() {
		t.Error("HasSynced() = true before the informer started")
	}
	if _, err := f.a.AllocateNext(ctx, testOwner); !errors.Is(err, allocator.ErrNotReady) {
		t.Errorf("AllocateNext() before sync = %v, want ErrNotReady", err)
	}
	if err := f.a.Allocate(ctx, ip, testOwner); !errors.Is(err, allocator.ErrNotReady) {
		t.Errorf("Allocate() before sync = %v, want ErrNotReady", err)
	}
	if _, err := f.a.DryRun().AllocateNext(ctx, testOwner); !errors.Is(err, allocator.ErrNotReady) {
		t.Errorf("DryRun().AllocateNext() before sync = %v, want ErrNotReady", err)
	}
	if err := f.a.Release(ctx, ip); err != nil {
		t.Errorf("Release() before sync = %v, want nil", err)
	}
	if n := len(createActions(f.client)); n != 0 {
		t.Errorf("%d creates sent while not ready", n)
	}

	g := newFixture(t, netip.MustParsePrefix("10.2.0.0/28"), fixtureOptions{}, WithReady(false))
	if g.a.Ready() {
		t.Error("Ready() = true with WithReady(false)")
	}
	if !g.a.HasSynced() {
		t.Error("HasSynced() = false with WithReady(false) once the informer synced, want true: the switch is not the informer")
	}
	if err := g.a.Allocate(ctx, ip, testOwner); !errors.Is(err, allocator.ErrNotReady) {
		t.Errorf("Allocate() switched off = %v, want ErrNotReady", err)
	}
	g.a.SetReady(true)
	if err := g.a.Allocate(ctx, ip, testOwner); err != nil {
		t.Fatalf("Allocate() switched on = %v", err)
	}
	g.a.SetReady(false)
	if _, err := g.a.AllocateNext(ctx, testOwner); !errors.Is(err, allocator.ErrNotReady) {
		t.Errorf("AllocateNext() switched off = %v, want ErrNotReady", err)
	}
	if err := g.a.Release(ctx, ip); err != nil || g.a.Has(ip) {
		t.Errorf("Release() switched off = %v, Has = %v; want nil, false", err, g.a.Has(ip))
	}
	g.a.SetReady(true)
	g.a.Close()
	if _, err := g.a.AllocateNext(ctx, testOwner); !errors.Is(err, allocator.ErrNotReady) {
		t.Errorf("AllocateNext() after Close = %v, want ErrNotReady", err)
	}
}

func TestIPAddressObjectCarriesLabelsAndParentRef(t *testing.T) {
	owner := allocator.Owner{Group: "", Resource: "services", Namespace: "prod", Name: "db", UID: "u-1"}
	tests := []struct {
		name      string
		cidr      string
		opts      []Option
		family    string
		managedBy string
	}{
		{"IPv4 default", "10.3.0.0/24", nil, "IPv4", "ipallocator.k8s.io"},
		{"IPv6 custom manager", "fd00:3::/112", []Option{WithManagedBy("example.com/allocator")}, "IPv6", "example.com/allocator"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, netip.MustParsePrefix(tt.cidr), fixtureOptions{}, tt.opts...)
			ip, err := f.a.AllocateNext(context.Background(), owner)
			if err != nil {
				t.Fatal(err)
			}
			got, err := f.client.NetworkingV1().IPAddresses().Get(context.Background(), ip.String(), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			wantLabels := map[string]string{
				"ipaddress.kubernetes.io/ip-family":  tt.family,
				"ipaddress.kubernetes.io/managed-by": tt.managedBy,
			}
			if diff := cmp.Diff(wantLabels, got.Labels); diff != "" {
				t.Errorf("labels (-want +got):\n%s", diff)
			}
			wantRef := &networkingv1.ParentReference{Resource: "services", Namespace: "prod", Name: "db"}
			if diff := cmp.Diff(wantRef, got.Spec.ParentRef); diff != "" {
				t.Errorf("parentRef (-want +got):\n%s", diff)
			}
		})
	}
}

func TestInformerEventsFeedTheIndex(t *testing.T) {
	f := newFixture(t, netip.MustParsePrefix("10.4.0.0/24"), fixtureOptions{})
	ctx := context.Background()
	ips := f.client.NetworkingV1().IPAddresses()
	for _, name := range []string{"10.4.0.7", "10.4.0.0", "10.4.0.255", "10.5.0.1", "fd00::1", "not-an-ip"} {
		if _, err := ips.Create(ctx, ipAddressObject(name, "", 0), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	seven := netip.MustParseAddr("10.4.0.7")
	testenv.WaitFor(t, "the informer to show 10.4.0.7", func() bool { return f.a.Has(seven) })
	// Only the usable address of the range counts: not its network or broadcast address, nor
	// addresses of other ranges or families.
	testenv.WaitFor(t, "the informer to show the rest", func() bool {
		_, ok, _ := f.a.informer.GetIndexer().GetByKey("not-an-ip")
		return ok
	})
	if got := f.a.Used(); got != 1 {
		t.Errorf("Used() = %d, want 1", got)
	}
	if err := ips.Delete(ctx, "10.4.0.7", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the informer to show the deletion", func() bool { return !f.a.Has(seven) })
	if got, want := f.a.Free(), uint64(254); got != want {
		t.Errorf("Free() = %d, want %d", got, want)
	}
}

func TestDryRunAsksTheServerWhenEnabled(t *testing.T) {
	f := newFixture(t, netip.MustParsePrefix("10.6.0.0/24"), fixtureOptions{}, WithServerDryRun(true))
	ctx := context.Background()
	ip := netip.MustParseAddr("10.6.0.9")
	f.client.ClearActions()
	if err := f.a.DryRun().Allocate(ctx, ip, testOwner); err != nil {
		t.Fatalf("DryRun().Allocate() = %v", err)
	}
	var dry int
	for _, act := range f.client.Actions() {
		if fakeclient.IsDryRun(act) {
			dry++
		}
	}
	if dry != 1 {
		t.Errorf("%d dry-run creates sent, want 1", dry)
	}
	if f.a.Has(ip) || f.a.Used() != 0 {
		t.Error("dry run changed the allocator")
	}
	if _, err := f.client.NetworkingV1().IPAddresses().Get(ctx, ip.String(), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("Get after a dry run = %v, want NotFound", err)
	}
}

// TestReleaseNotFoundSeesTheNextOwner releases an address whose object another writer deletes just
// before our Delete reaches the server, and then creates again, both events reaching the informer
// while our Delete is in flight. The NotFound must not hide the new object: it is newer than the
// one the informer showed, and the address is allocated.
func TestReleaseNotFoundSeesTheNextOwner(t *testing.T) {
	f := newFixture(t, netip.MustParsePrefix("10.7.0.0/24"), fixtureOptions{})
	ctx := context.Background()
	ip := netip.MustParseAddr("10.7.0.9")
	off, _ := ipmath.Offset(f.a.cidr, ip)
	ips := f.client.NetworkingV1().IPAddresses()
	if _, err := ips.Create(ctx, ipAddressObject(ip.String(), "", 0), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the informer to show "+ip.String(), func() bool {
		_, ok := f.a.cached(off)
		return ok && f.a.Has(ip)
	})
	gvr := networkingv1.SchemeGroupVersion.WithResource("ipaddresses")
	var next types.UID
	f.client.PrependReactor("delete", "ipaddresses", func(k8stesting.Action) (bool, runtime.Object, error) {
		// Another writer deletes the object and creates a new one before our Delete lands.
		if err := f.client.Tracker().Delete(gvr, "", ip.String()); err != nil {
			t.Error(err)
		}
		// The tracker directly: the fake clientset holds its lock while a reactor runs. The
		// resourceVersion is above any the fake has handed out.
		next = "next-owner"
		if err := f.client.Tracker().Create(gvr, ipAddressObject(ip.String(), next, 1000), ""); err != nil {
			t.Error(err)
		}
		testenv.WaitFor(t, "the informer to show the new object", func() bool {
			f.a.mu.Lock()
			defer f.a.mu.Unlock()
			p := f.a.pending[off]
			return p != nil && p.seen && p.last.uid == next
		})
		return true, nil, apierrors.NewNotFound(gvr.GroupResource(), ip.String())
	})
	if err := f.a.Release(ctx, ip); err != nil {
		t.Fatalf("Release(%v) = %v", ip, err)
	}
	if !f.a.Has(ip) {
		t.Errorf("Has(%v) = false after Release found nothing, want true: object %s holds it", ip, next)
	}
	if got := f.a.Used(); got != 1 {
		t.Errorf("Used() = %d, want 1", got)
	}
}

// TestOwnerWithoutResourceOrNameIsRejectedBeforeAnyAPICall checks that an Owner the API server
// would refuse as a parentRef (no resource, or no name) is an allocator.ErrInvalid error before
// any request is sent, for Allocate, AllocateNext and their dry runs, and changes nothing.
func TestOwnerWithoutResourceOrNameIsRejectedBeforeAnyAPICall(t *testing.T) {
	f := newFixture(t, netip.MustParsePrefix("10.8.0.0/28"), fixtureOptions{}, WithServerDryRun(true))
	ctx := context.Background()
	ip := netip.MustParseAddr("10.8.0.3")
	owners := []struct {
		name  string
		owner allocator.Owner
	}{
		{"zero", allocator.Owner{}},
		{"no resource", allocator.Owner{Namespace: "default", Name: "web"}},
		{"no name", allocator.Owner{Resource: "services", Namespace: "default"}},
		{"namespace and UID only", allocator.Owner{Namespace: "default", UID: "u-1"}},
	}
	for _, o := range owners {
		calls := []struct {
			name string
			call func() error
		}{
			{"Allocate", func() error { return f.a.Allocate(ctx, ip, o.owner) }},
			{"AllocateNext", func() error { _, err := f.a.AllocateNext(ctx, o.owner); return err }},
			{"DryRun().Allocate", func() error { return f.a.DryRun().Allocate(ctx, ip, o.owner) }},
			{"DryRun().AllocateNext", func() error { _, err := f.a.DryRun().AllocateNext(ctx, o.owner); return err }},
		}
		for _, c := range calls {
			t.Run(o.name+"/"+c.name, func(t *testing.T) {
				f.client.ClearActions()
				err := c.call()
				if !errors.Is(err, allocator.ErrInvalid) {
					t.Errorf("%s(owner %#v) = %v, want an error matching allocator.ErrInvalid", c.name, o.owner, err)
				}
				var oe *allocator.OwnerError
				if !errors.As(err, &oe) || oe.Owner != o.owner {
					t.Errorf("%s(owner %#v) = %v, want an *allocator.OwnerError keeping the owner", c.name, o.owner, err)
				}
				if n := len(f.client.Actions()); n != 0 {
					t.Errorf("%s(owner %#v) sent %d requests, want 0", c.name, o.owner, n)
				}
				if f.a.Used() != 0 || f.a.Has(ip) {
					t.Errorf("after %s Used() = %d, Has(%v) = %v; want 0, false", c.name, f.a.Used(), ip, f.a.Has(ip))
				}
			})
		}
	}
	// An address error still comes first, and a valid owner still allocates.
	var ae *allocator.AddrError
	if err := f.a.Allocate(ctx, netip.Addr{}, allocator.Owner{}); !errors.As(err, &ae) {
		t.Errorf("Allocate(zero Addr, zero Owner) = %v, want an *allocator.AddrError", err)
	}
	if err := f.a.Allocate(ctx, ip, allocator.Owner{Resource: "services", Name: "web"}); err != nil {
		t.Errorf("Allocate() with resource and name only = %v, want nil", err)
	}
}

// TestReleaseNotFoundOfAnUnknownAddressHidesNoLaterObject releases an address nobody holds (the
// Delete gets NotFound), then another writer creates its IPAddress. Has and Used must show the
// object as soon as the informer does, not after the assume timeout.
func TestReleaseNotFoundOfAnUnknownAddressHidesNoLaterObject(t *testing.T) {
	f := newFixture(t, netip.MustParsePrefix("10.10.0.0/24"), fixtureOptions{}, WithAssumeTimeout(time.Hour))
	ctx := context.Background()
	ip := netip.MustParseAddr("10.10.0.9")
	if err := f.a.Release(ctx, ip); err != nil {
		t.Fatalf("Release(%v) = %v", ip, err)
	}
	stale := staleEvents(f.a)
	// Another writer; the fixture's reactor gives the object a UID and a resourceVersion.
	if _, err := f.client.NetworkingV1().IPAddresses().Create(ctx, ipAddressObject(ip.String(), "", 0), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitHandled(t, f.a, ip, stale)
	if !f.a.Has(ip) || f.a.Used() != 1 {
		t.Errorf("Has(%v) = %v, Used() = %d once the informer shows the object; want true, 1", ip, f.a.Has(ip), f.a.Used())
	}
}

// staleEvents returns the number of informer events a has ignored as stale so far.
func staleEvents(a *Allocator) uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.staleEvents
}

// waitHandled waits until the informer cache holds ip's object and the Allocator's handler has
// either shown it or ignored an event for it as stale (more than stale events ignored in all).
func waitHandled(t *testing.T, a *Allocator, ip netip.Addr, stale uint64) {
	t.Helper()
	off, _ := ipmath.Offset(a.cidr, ip)
	testenv.WaitFor(t, "the informer to hand "+ip.String()+" to the handler", func() bool {
		if _, ok := a.cached(off); !ok {
			return false
		}
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.index.Has(off) || a.staleEvents > stale
	})
}

// TestNewRejectsNilAndZeroArguments calls New with each argument nil or zero and expects an
// error, never a panic.
func TestNewRejectsNilAndZeroArguments(t *testing.T) {
	client := fakeclient.New(fakeclient.Options{FieldManaged: true})
	cidr := netip.MustParsePrefix("10.11.0.0/24")
	tests := []struct {
		name     string
		cidr     netip.Prefix
		client   kubernetes.Interface
		informer networkingv1informers.IPAddressInformer
		opts     []Option
		wantErr  bool
	}{
		{name: "valid", cidr: cidr, client: client, informer: newInformer(client)},
		{name: "nil Option", cidr: cidr, client: client, informer: newInformer(client), opts: []Option{nil, WithSeed(1), nil}},
		{name: "zero prefix", client: client, informer: newInformer(client), wantErr: true},
		{name: "nil client", cidr: cidr, informer: newInformer(client), wantErr: true},
		{name: "nil *fake.Clientset", cidr: cidr, client: (*fake.Clientset)(nil), informer: newInformer(client), wantErr: true},
		{name: "nil *kubernetes.Clientset", cidr: cidr, client: (*kubernetes.Clientset)(nil), informer: newInformer(client), wantErr: true},
		{name: "zero kubernetes.Clientset", cidr: cidr, client: &kubernetes.Clientset{}, informer: newInformer(client), wantErr: true},
		{name: "nil informer", cidr: cidr, client: client, wantErr: true},
		{name: "nil *nilInformer", cidr: cidr, client: client, informer: (*nilInformer)(nil), wantErr: true},
		{name: "informer whose Informer() is nil", cidr: cidr, client: client, informer: &nilInformer{}, wantErr: true},
		{name: "everything zero", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var (
				a   *Allocator
				err error
			)
			func() {
				defer func() {
					if r := recover(); r != nil {
						err = fmt.Errorf("panic: %v", r)
						t.Errorf("New() panicked: %v", r)
					}
				}()
				a, err = New(tt.cidr, tt.client, tt.informer, tt.opts...)
			}()
			if tt.wantErr {
				if !errors.Is(err, allocator.ErrInvalid) || a != nil {
					t.Errorf("New() = %v, %v; want nil and an error matching allocator.ErrInvalid", a, err)
				}
				return
			}
			if err != nil || a == nil {
				t.Fatalf("New() = %v, %v; want an Allocator", a, err)
			}
			a.Close()
		})
	}
}

// nilInformer is an IPAddressInformer whose Informer method returns nil.
type nilInformer struct{}

func (*nilInformer) Informer() cache.SharedIndexInformer         { return nil }
func (*nilInformer) Lister() networkingv1listers.IPAddressLister { return nil }

// TestReleaseTwiceFasterThanTheInformerLeavesTheAddressFree runs releaseTwiceBehindTheInformer
// on the fake clientset.
func TestReleaseTwiceFasterThanTheInformerLeavesTheAddressFree(t *testing.T) {
	p := netip.MustParsePrefix("fd00:7::/126")
	g := newEventGate(p)
	f := newFixture(t, p, fixtureOptions{gate: g})
	releaseTwiceBehindTheInformer(t, f.a, g)
}

// releaseTwiceBehindTheInformer plays an informer that runs behind our writes: on a /126 with two
// addresses held, the third is allocated, released and released again (the second Delete gets
// NotFound) before the informer shows any of it. The informer then shows the object we created,
// and later its deletion: neither may make the address look allocated, so that AllocateNext still
// finds it instead of answering ErrFull. a serves a /126 and reads from an informer behind g.
func releaseTwiceBehindTheInformer(t *testing.T, a *Allocator, g *eventGate) {
	t.Helper()
	ctx := context.Background()
	first := a.CIDR().Addr().Next()
	held := []netip.Addr{first, first.Next()}
	ip := first.Next().Next()
	for _, h := range held {
		if err := a.Allocate(ctx, h, testOwner); err != nil {
			t.Fatal(err)
		}
	}
	waitSettled(t, a)
	g.Hold()
	if err := a.Allocate(ctx, ip, testOwner); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := a.Release(ctx, ip); err != nil {
			t.Fatalf("Release(%v) = %v", ip, err)
		}
	}
	check := func(when string) {
		t.Helper()
		if a.Has(ip) || a.Used() != 2 {
			t.Fatalf("%s: Has(%v) = %v, Used() = %d; want false, 2", when, ip, a.Has(ip), a.Used())
		}
	}
	check("after the two Releases")
	letOne(t, g, a) // the Add of the object we created and deleted
	check("after the informer shows the Add of the object we deleted")
	got, err := a.AllocateNext(ctx, testOwner)
	if err != nil || got != ip {
		t.Fatalf("AllocateNext() = %v, %v; want %v, nil", got, err, ip)
	}
	letOne(t, g, a) // its Delete
	if !a.Has(ip) || a.Used() != 3 {
		t.Fatalf("after the informer shows the stale Delete: Has(%v) = %v, Used() = %d; want true, 3", ip, a.Has(ip), a.Used())
	}
	g.Open()
	waitSettled(t, a)
	if !a.Has(ip) || a.Used() != 3 {
		t.Errorf("once the informer caught up: Has(%v) = %v, Used() = %d; want true, 3", ip, a.Has(ip), a.Used())
	}
}

// waitSettled waits until a holds no assumption: the informer has shown all of its writes.
func waitSettled(t testing.TB, a *Allocator) {
	t.Helper()
	testenv.WaitFor(t, "the informer to catch up with our writes", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return len(a.pending) == 0
	})
}

// releaseAndReuse is the release/reuse loop of TestReleaseAndReuseOutrunTheInformer and its
// kube-apiserver twin: on a /126 (three addresses) holding two, it releases one of two fixed
// addresses in turn (twice: the second Delete gets NotFound), which it may not hold if
// AllocateNext picked the third, and allocates again at once, checking after every call that
// Has, Used and AllocateNext follow its own writes.
func releaseAndReuse(t *testing.T, a *Allocator, rounds int) {
	t.Helper()
	ctx := context.Background()
	p := a.CIDR()
	ips := []netip.Addr{p.Addr().Next(), p.Addr().Next().Next()}
	held := map[netip.Addr]bool{}
	for _, ip := range ips {
		if err := a.Allocate(ctx, ip, testOwner); err != nil {
			t.Fatal(err)
		}
		held[ip] = true
	}
	check := func(when string) {
		t.Helper()
		for ip := range ipsOf(p) {
			if a.Has(ip) != held[ip] {
				t.Fatalf("%s: Has(%v) = %v, want %v", when, ip, a.Has(ip), held[ip])
			}
		}
		if got := a.Used(); got != uint64(len(held)) {
			t.Fatalf("%s: Used() = %d, want %d", when, got, len(held))
		}
	}
	for i := range rounds {
		ip := ips[i%2]
		for range 2 {
			if err := a.Release(ctx, ip); err != nil {
				t.Fatalf("round %d: Release(%v) = %v", i, ip, err)
			}
			delete(held, ip)
			check(fmt.Sprintf("round %d: after Release(%v)", i, ip))
		}
		got, err := a.AllocateNext(ctx, testOwner)
		if err != nil {
			t.Fatalf("round %d: AllocateNext() = %v, %v with %d of 3 addresses held", i, got, err, len(held))
		}
		if held[got] {
			t.Fatalf("round %d: AllocateNext() = %v, which is held", i, got)
		}
		held[got] = true
		check(fmt.Sprintf("round %d: after AllocateNext() = %v", i, got))
	}
	waitSettled(t, a)
	check("once the informer caught up")
}

// ipsOf yields the usable addresses of a small IPv6 prefix.
func ipsOf(p netip.Prefix) iter.Seq[netip.Addr] {
	return func(yield func(netip.Addr) bool) {
		for ip := p.Addr().Next(); p.Contains(ip); ip = ip.Next() {
			if !yield(ip) {
				return
			}
		}
	}
}

// TestReleaseAndReuseOutrunTheInformer runs the release/reuse loop on the fake clientset with an
// informer whose events each arrive up to 0.2 ms late.
func TestReleaseAndReuseOutrunTheInformer(t *testing.T) {
	p := netip.MustParsePrefix("fd00:8::/126")
	g := newEventGate(p)
	g.lag = func() time.Duration { return time.Duration(rand.Int64N(int64(200 * time.Microsecond))) }
	f := newFixture(t, p, fixtureOptions{gate: g, simple: true})
	releaseAndReuse(t, f.a, 25)
}

// allocateReleaseWithOneFree is issue 25 part 5's loop: with every address of a's range held but
// free, AllocateNext and then Release, round after round, as fast as they return. AllocateNext
// must take free (the only free address) every time and never answer ErrFull; after each call
// Has and Used must follow the call, whatever the informer has shown of the earlier rounds.
func allocateReleaseWithOneFree(t *testing.T, a *Allocator, free netip.Addr, rounds int) {
	t.Helper()
	ctx := context.Background()
	held := a.Size() - 1
	check := func(when string, has bool, used uint64) {
		t.Helper()
		if a.Has(free) != has || a.Used() != used || a.Free() != a.Size()-used {
			t.Fatalf("%s: Has(%v) = %v, Used() = %d, Free() = %d; want %v, %d, %d", when, free, a.Has(free), a.Used(), a.Free(), has, used, a.Size()-used)
		}
	}
	for i := range rounds {
		got, err := a.AllocateNext(ctx, testOwner)
		if err != nil || got != free {
			t.Fatalf("round %d: AllocateNext() = %v, %v (Used %d, Free %d); want %v, nil", i, got, err, a.Used(), a.Free(), free)
		}
		check(fmt.Sprintf("round %d: after AllocateNext", i), true, held+1)
		if err := a.Release(ctx, free); err != nil {
			t.Fatalf("round %d: Release(%v) = %v", i, free, err)
		}
		check(fmt.Sprintf("round %d: after Release", i), false, held)
	}
	waitSettled(t, a)
	check("once the informer caught up", false, held)
}

// takeAllBut creates, through client, the IPAddress objects of every usable address of cidr but
// free, as another writer would.
func takeAllBut(t testing.TB, client kubernetes.Interface, cidr netip.Prefix, free netip.Addr) {
	t.Helper()
	ctx := context.Background()
	for ip := cidr.Addr().Next(); cidr.Contains(ip); ip = ip.Next() {
		if ip == free || !ipmath.Usable(cidr, ip) {
			continue
		}
		if _, err := client.NetworkingV1().IPAddresses().Create(ctx, ObjectFor(ip, testOwner, ""), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAllocateNextAfterReleaseWithOneAddressFree runs the loop of issue 25 part 5 on 10.0.0.0/24
// with 253 addresses taken, through the public API over client-go's fake clientset (which gives
// objects neither a UID nor a resourceVersion, as the bench's is) and over the module's
// fakeclient (which gives both, as kube-apiserver does), each with a shared informer as it
// comes.
func TestAllocateNextAfterReleaseWithOneAddressFree(t *testing.T) {
	tests := []struct {
		name string
		// client returns the clientset and a func that waits until an informer on it watches.
		client func(t *testing.T) (c kubernetes.Interface, watching func(cache.SharedIndexInformer))
	}{
		{"client-go fake", func(t *testing.T) (kubernetes.Interface, func(cache.SharedIndexInformer)) {
			c := localcluster.NewFakeClient()
			return c, func(inf cache.SharedIndexInformer) { fakeclient.WaitShowsNewIPAddresses(t, c, inf) }
		}},
		{"fake with UIDs and resourceVersions", func(t *testing.T) (kubernetes.Interface, func(cache.SharedIndexInformer)) {
			c := fakeclient.New(fakeclient.Options{})
			return c, func(cache.SharedIndexInformer) { c.WaitWatching(t, "ipaddresses") }
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cidr := netip.MustParsePrefix("10.0.0.0/24")
			free := netip.MustParseAddr("10.0.0.200")
			client, watching := tt.client(t)
			takeAllBut(t, client, cidr, free)
			factory := informers.NewSharedInformerFactory(client, 0)
			inf := factory.Networking().V1().IPAddresses()
			a, err := New(cidr, client, inf)
			if err != nil {
				t.Fatal(err)
			}
			stop := make(chan struct{})
			t.Cleanup(func() {
				a.Close()
				close(stop)
				factory.Shutdown()
			})
			factory.Start(stop)
			if !cache.WaitForCacheSync(stop, a.Ready) {
				t.Fatal("allocator not ready")
			}
			watching(inf.Informer())
			allocateReleaseWithOneFree(t, a, free, 2000)
		})
	}
}
