package ipaddress

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	networkingv1informers "k8s.io/client-go/informers/networking/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/allocator/allocatortest"
	"github.com/kube-ipam/clusterip/internal/ipmath"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

// The tests in this file run against one real kube-apiserver v1.33 (and its etcd) shared by the
// package; each test uses its own ranges, none overlapping the server's 10.96.0.0/24 Service range
// except where contention with it is the point. A v1.33 kube-apiserver accepts an IPAddress outside
// every ServiceCIDR (checked by hand), so the tests create no ServiceCIDR.

var shared testenv.Shared

// TestMain builds kube-apiserver, if this clone has none yet, before -timeout starts, and closes
// shared after the tests; see testenv.Main.
func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &shared)) }

// apiServer returns the package's kube-apiserver, starting it on first use. It skips t in -short
// mode.
func apiServer(t testing.TB) *testenv.KubeAPIServer { return shared.KubeAPIServer(t) }

// newClient returns a clientset of its own, as a separate process would have.
func newClient(t testing.TB, s *testenv.KubeAPIServer) kubernetes.Interface {
	t.Helper()
	c, err := kubernetes.NewForConfig(rest.CopyConfig(s.Config))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// realAllocator returns a ready Allocator for cidr with its own client and informer factory. When t
// ends it closes the Allocator and deletes every IPAddress in cidr with its managed-by label, so
// that the next test starts from an empty range.
func realAllocator(t testing.TB, s *testenv.KubeAPIServer, cidr netip.Prefix, opts ...Option) *Allocator {
	t.Helper()
	return realGatedAllocator(t, s, cidr, nil, opts...)
}

// realGatedAllocator is realAllocator with an informer whose watch events pass through g (see
// eventGate); a nil g gives realAllocator's.
func realGatedAllocator(t testing.TB, s *testenv.KubeAPIServer, cidr netip.Prefix, g *eventGate, opts ...Option) *Allocator {
	t.Helper()
	client := newClient(t, s)
	factory := informers.NewSharedInformerFactory(client, 0)
	var inf networkingv1informers.IPAddressInformer = factory.Networking().V1().IPAddresses()
	if g != nil {
		inf = newGatedInformer(client, g)
	}
	a, err := New(cidr, client, inf, opts...)
	if err != nil {
		t.Fatalf("New(%v) = %v", cidr, err)
	}
	stop := make(chan struct{})
	t.Cleanup(func() {
		a.Close()
		close(stop)
		factory.Shutdown()
		purge(t, s, cidr, a.managedBy)
	})
	factory.Start(stop)
	if g != nil {
		go inf.Informer().Run(stop)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if !cache.WaitForCacheSync(ctx.Done(), a.Ready) {
		t.Fatalf("allocator for %v not ready", cidr)
	}
	return a
}

// purge deletes every IPAddress in cidr labelled as managed by managedBy.
func purge(t testing.TB, s *testenv.KubeAPIServer, cidr netip.Prefix, managedBy string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ips := s.Client.NetworkingV1().IPAddresses()
	list, err := ips.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Errorf("list IPAddresses: %v", err)
		return
	}
	for _, o := range list.Items {
		ip, err := netip.ParseAddr(o.Name)
		if err != nil || !cidr.Contains(ip) || o.Labels[networkingv1.LabelManagedBy] != managedBy {
			continue
		}
		if err := ips.Delete(ctx, o.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete IPAddress %s: %v", o.Name, err)
		}
	}
}

func TestAPIServerConformance(t *testing.T) {
	s := apiServer(t)
	allocatortest.Run(t, func(t *testing.T, cidr netip.Prefix) allocator.Interface {
		return realAllocator(t, s, cidr)
	}, allocatortest.Workers(4), allocatortest.RecordsOwners())
}

func TestAPIServerAllocateUntilFullThenReuse(t *testing.T) {
	s := apiServer(t)
	for _, cidr := range []string{"192.168.100.0/28", "fd00:100::/120"} {
		t.Run(cidr, func(t *testing.T) {
			p := netip.MustParsePrefix(cidr)
			a := realAllocator(t, s, p)
			ctx := context.Background()
			size := ipmath.Size(p)
			var got []netip.Addr
			for {
				ip, err := a.AllocateNext(ctx, testOwner)
				if errors.Is(err, allocator.ErrFull) {
					break
				}
				if err != nil {
					t.Fatalf("AllocateNext() after %d = %v", len(got), err)
				}
				got = append(got, ip)
				if uint64(len(got)) > size {
					t.Fatalf("AllocateNext() gave more than %d addresses", size)
				}
			}
			if uint64(len(got)) != size {
				t.Fatalf("AllocateNext() gave %d addresses before ErrFull, want %d", len(got), size)
			}
			slices.SortFunc(got, netip.Addr.Compare)
			if n := len(slices.Compact(slices.Clone(got))); n != len(got) {
				t.Fatalf("duplicates among %d addresses", len(got))
			}
			list, err := s.Client.NetworkingV1().IPAddresses().List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var stored []netip.Addr
			for _, o := range list.Items {
				if ip := netip.MustParseAddr(o.Name); p.Contains(ip) {
					stored = append(stored, ip)
				}
			}
			slices.SortFunc(stored, netip.Addr.Compare)
			if diff := cmp.Diff(got, stored, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
				t.Errorf("IPAddress objects differ from the allocations (-want +got):\n%s", diff)
			}
			if a.Used() != size || a.Free() != 0 {
				t.Errorf("Used(), Free() = %d, %d, want %d, 0", a.Used(), a.Free(), size)
			}

			victim := got[len(got)/2]
			if err := a.Release(ctx, victim); err != nil {
				t.Fatalf("Release(%v) = %v", victim, err)
			}
			if ip, err := a.AllocateNext(ctx, testOwner); err != nil || ip != victim {
				t.Fatalf("AllocateNext() after Release = %v, %v; want %v", ip, err, victim)
			}
			// The informer catches up with our own writes and the assumptions go away.
			testenv.WaitFor(t, "the informer to catch up", func() bool {
				a.mu.Lock()
				defer a.mu.Unlock()
				return len(a.pending) == 0
			})
			if a.Used() != size || !a.Has(victim) {
				t.Errorf("after catching up Used() = %d, Has(%v) = %v; want %d, true", a.Used(), victim, a.Has(victim), size)
			}
		})
	}
}

func TestAPIServerTwoAllocatorsNeverBothWin(t *testing.T) {
	s := apiServer(t)
	ctx := context.Background()

	t.Run("AllocateNext", func(t *testing.T) {
		p := netip.MustParsePrefix("192.168.101.0/27")
		allocs := []*Allocator{realAllocator(t, s, p), realAllocator(t, s, p)}
		owners := []allocator.Owner{
			{Resource: "services", Namespace: "default", Name: "a"},
			{Resource: "services", Namespace: "default", Name: "b"},
		}
		var mu sync.Mutex
		won := map[netip.Addr]string{}
		var wg sync.WaitGroup
		for i, a := range allocs {
			for range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						ip, err := a.AllocateNext(ctx, owners[i])
						if errors.Is(err, allocator.ErrFull) {
							return
						}
						if err != nil {
							t.Errorf("AllocateNext() = %v", err)
							return
						}
						mu.Lock()
						if prev, dup := won[ip]; dup {
							t.Errorf("%v won by %s and %s", ip, prev, owners[i].Name)
						}
						won[ip] = owners[i].Name
						mu.Unlock()
					}
				}()
			}
		}
		wg.Wait()
		if uint64(len(won)) != ipmath.Size(p) {
			t.Errorf("%d addresses won, want %d", len(won), ipmath.Size(p))
		}
		for ip, name := range won {
			o, err := s.Client.NetworkingV1().IPAddresses().Get(ctx, ip.String(), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if o.Spec.ParentRef.Name != name {
				t.Errorf("IPAddress %v belongs to %q, but %q was told it won", ip, o.Spec.ParentRef.Name, name)
			}
		}
	})

	t.Run("Allocate", func(t *testing.T) {
		p := netip.MustParsePrefix("192.168.102.0/28")
		a, b := realAllocator(t, s, p), realAllocator(t, s, p)
		for off := range ipmath.Size(p) {
			ip, _ := ipmath.AddrAt(p, off)
			allocatortest.ExactlyOneWinner(t, ctx, ip, testOwner, a, b)
		}
		testenv.WaitFor(t, "both informers to show every address", func() bool {
			return a.Used() == ipmath.Size(p) && b.Used() == ipmath.Size(p)
		})
	})
}

func TestAPIServerContentionWithItsOwnServices(t *testing.T) {
	s := apiServer(t)
	ctx := context.Background()
	// The server's own Service range: it allocates ClusterIPs there as IPAddress objects too. In
	// dual-write mode (the v1.33 default) its legacy bitmap picks the address and does not know
	// ours, so a Service create may fail with "provided IP is already allocated": kube-apiserver's
	// own behaviour next to a foreign writer, which the client retries. What must hold is that no
	// address is handed out twice and that our allocator retries past the server's addresses.
	p := netip.MustParsePrefix("10.96.0.0/24")
	a := realAllocator(t, s, p, WithManagedBy("clusterip-test"))
	const n = 40
	var wg sync.WaitGroup
	ours := make(chan netip.Addr, n)
	svcs := make(chan string, n)
	var refused atomic.Int32
	t.Cleanup(func() {
		for i := range n {
			s.Client.CoreV1().Services("default").Delete(context.Background(), fmt.Sprintf("contend-%d", i), metav1.DeleteOptions{})
		}
	})
	for i := range n {
		wg.Add(2)
		go func() {
			defer wg.Done()
			ip, err := a.AllocateNext(ctx, allocator.Owner{Resource: "services", Namespace: "default", Name: fmt.Sprintf("ours-%d", i)})
			if err != nil {
				t.Errorf("AllocateNext() = %v", err)
				return
			}
			ours <- ip
		}()
		go func() {
			defer wg.Done()
			svc, err := s.Client.CoreV1().Services("default").Create(ctx, testenv.ClusterIPService(fmt.Sprintf("contend-%d", i), ""), metav1.CreateOptions{})
			if apierrors.IsInternalError(err) && strings.Contains(err.Error(), "already allocated") {
				refused.Add(1)
				return
			}
			if err != nil {
				t.Errorf("create Service: %v", err)
				return
			}
			svcs <- svc.Spec.ClusterIP
		}()
	}
	wg.Wait()
	close(ours)
	close(svcs)
	taken := map[string]bool{}
	for ip := range ours {
		if taken[ip.String()] {
			t.Errorf("%v handed out twice", ip)
		}
		taken[ip.String()] = true
	}
	for ip := range svcs {
		if taken[ip] {
			t.Errorf("Service ClusterIP %v is also one of ours", ip)
		}
		taken[ip] = true
	}
	t.Logf("%d of our allocations, %d Services, %d Service creates refused by the server", n, len(taken)-n, refused.Load())
	// Our allocator sees the server's IPAddress objects too.
	testenv.WaitFor(t, "the informer to show every address", func() bool { return a.Used() >= uint64(len(taken)) })
}

func TestAPIServerObjectsCarryLabelsAndParentRef(t *testing.T) {
	s := apiServer(t)
	ctx := context.Background()
	owner := allocator.Owner{Group: "example.com", Resource: "widgets", Namespace: "prod", Name: "w1"}
	for _, tt := range []struct{ cidr, family string }{{"192.168.103.0/24", "IPv4"}, {"fd00:103::/64", "IPv6"}} {
		t.Run(tt.family, func(t *testing.T) {
			a := realAllocator(t, s, netip.MustParsePrefix(tt.cidr), WithManagedBy("clusterip-test"))
			ip, err := a.AllocateNext(ctx, owner)
			if err != nil {
				t.Fatal(err)
			}
			o, err := s.Client.NetworkingV1().IPAddresses().Get(ctx, ip.String(), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]string{
				networkingv1.LabelIPAddressFamily: tt.family,
				networkingv1.LabelManagedBy:       "clusterip-test",
			}
			if diff := cmp.Diff(want, o.Labels); diff != "" {
				t.Errorf("labels (-want +got):\n%s", diff)
			}
			wantRef := &networkingv1.ParentReference{Group: "example.com", Resource: "widgets", Namespace: "prod", Name: "w1"}
			if diff := cmp.Diff(wantRef, o.Spec.ParentRef); diff != "" {
				t.Errorf("parentRef (-want +got):\n%s", diff)
			}
		})
	}
}

func TestAPIServerValidationErrorsAreTyped(t *testing.T) {
	s := apiServer(t)
	ctx := context.Background()
	p := netip.MustParsePrefix("192.168.104.0/28")
	a := realAllocator(t, s, p)
	bad := allocator.Owner{Resource: "services", Namespace: "default", Name: "a/b"} // names may not contain '/'
	ip := netip.MustParseAddr("192.168.104.5")

	err := a.Allocate(ctx, ip, bad)
	if !apierrors.IsInvalid(err) || errors.Is(err, allocator.ErrAllocated) {
		t.Errorf("Allocate() with an invalid parentRef = %v, want apierrors.IsInvalid", err)
	}
	got, err := a.AllocateNext(ctx, bad)
	if !apierrors.IsInvalid(err) {
		t.Errorf("AllocateNext() with an invalid parentRef = %v, %v; want apierrors.IsInvalid", got, err)
	}
	if a.Used() != 0 || a.Has(ip) {
		t.Errorf("after invalid requests Used() = %d, Has(%v) = %v; want 0, false", a.Used(), ip, a.Has(ip))
	}
	if err := a.Allocate(ctx, ip, testOwner); err != nil {
		t.Errorf("Allocate() with a valid parentRef = %v", err)
	}

	// A server-side dry run sees the same validation and persists nothing.
	d := realAllocator(t, s, p, WithServerDryRun(true)).DryRun()
	other := netip.MustParseAddr("192.168.104.6")
	if err := d.Allocate(ctx, other, bad); !apierrors.IsInvalid(err) {
		t.Errorf("DryRun().Allocate() with an invalid parentRef = %v, want apierrors.IsInvalid", err)
	}
	if err := d.Allocate(ctx, other, testOwner); err != nil {
		t.Errorf("DryRun().Allocate() = %v", err)
	}
	if _, err := s.Client.NetworkingV1().IPAddresses().Get(ctx, other.String(), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("Get(%v) after dry runs = %v, want NotFound", other, err)
	}
}

// TestAPIServerReleaseAndRecreateOutrunTheInformer releases and re-creates the same addresses
// faster than the informer reports it, so that Delete events of the released objects arrive after
// the address was created again; once the informer has caught up the index must match the server.
func TestAPIServerReleaseAndRecreateOutrunTheInformer(t *testing.T) {
	s := apiServer(t)
	ctx := context.Background()
	p := netip.MustParsePrefix("192.168.106.0/30") // two addresses
	a := realAllocator(t, s, p)
	ips := []netip.Addr{netip.MustParseAddr("192.168.106.1"), netip.MustParseAddr("192.168.106.2")}
	for _, ip := range ips {
		if err := a.Allocate(ctx, ip, testOwner); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 50 {
		ip := ips[i%2]
		if err := a.Release(ctx, ip); err != nil {
			t.Fatalf("Release(%v) = %v", ip, err)
		}
		if a.Has(ip) || a.Used() != 1 {
			t.Fatalf("after Release(%v): Has = %v, Used() = %d; want false, 1", ip, a.Has(ip), a.Used())
		}
		got, err := a.AllocateNext(ctx, testOwner)
		if err != nil || got != ip {
			t.Fatalf("AllocateNext() = %v, %v; want %v", got, err, ip)
		}
		if !a.Has(ip) || a.Used() != 2 {
			t.Fatalf("after AllocateNext(): Has(%v) = %v, Used() = %d; want true, 2", ip, a.Has(ip), a.Used())
		}
	}
	testenv.WaitFor(t, "the informer to catch up", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return len(a.pending) == 0
	})
	a.mu.Lock()
	t.Logf("%d stale informer events ignored", a.staleEvents)
	a.mu.Unlock()
	if a.Used() != 2 || !a.Has(ips[0]) || !a.Has(ips[1]) {
		t.Errorf("after catching up Used() = %d, Has = %v, %v; want 2, true, true", a.Used(), a.Has(ips[0]), a.Has(ips[1]))
	}
	if _, err := a.AllocateNext(ctx, testOwner); !errors.Is(err, allocator.ErrFull) {
		t.Errorf("AllocateNext() on the full range = %v, want ErrFull", err)
	}
}

func TestAPIServerSeesOtherWriters(t *testing.T) {
	s := apiServer(t)
	ctx := context.Background()
	p := netip.MustParsePrefix("192.168.105.0/28")
	a := realAllocator(t, s, p)
	held := netip.MustParseAddr("192.168.105.9")
	o := ipAddressObject(held.String(), "", 0)
	o.ResourceVersion = ""
	if _, err := s.Client.NetworkingV1().IPAddresses().Create(ctx, o, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the informer to show the other writer's address", func() bool { return a.Has(held) })
	var n int
	for {
		ip, err := a.AllocateNext(ctx, testOwner)
		if errors.Is(err, allocator.ErrFull) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if ip == held {
			t.Fatalf("AllocateNext() = %v, which another writer holds", ip)
		}
		n++
	}
	if n != 13 {
		t.Errorf("AllocateNext() gave %d addresses, want 13", n)
	}
	if err := a.Release(ctx, held); err != nil || a.Has(held) {
		t.Errorf("Release(%v) = %v, Has = %v; want nil, false", held, err, a.Has(held))
	}
}

// TestAPIServerRejectsOwnersWeRejectFirst shows that kube-apiserver refuses (422, IsInvalid) an
// IPAddress whose parentRef lacks a resource or a name, and that the Allocator refuses the same
// owners itself with an *allocator.OwnerError, so that no caller gets a server round trip for them.
func TestAPIServerRejectsOwnersWeRejectFirst(t *testing.T) {
	s := apiServer(t)
	ctx := context.Background()
	p := netip.MustParsePrefix("192.168.105.0/28")
	a := realAllocator(t, s, p)
	ip := netip.MustParseAddr("192.168.105.5")
	for _, tt := range []struct {
		name  string
		owner allocator.Owner
	}{
		{"zero", allocator.Owner{}},
		{"no resource", allocator.Owner{Namespace: "default", Name: "web"}},
		{"no name", allocator.Owner{Resource: "services", Namespace: "default"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// The server's verdict on the object the Allocator would have sent.
			_, err := s.Client.NetworkingV1().IPAddresses().Create(ctx, ObjectFor(ip, tt.owner, a.managedBy), metav1.CreateOptions{})
			if !apierrors.IsInvalid(err) {
				t.Fatalf("direct Create with parentRef %+v = %v, want apierrors.IsInvalid", tt.owner, err)
			}
			if err := a.Allocate(ctx, ip, tt.owner); !isOwnerError(err, tt.owner) {
				t.Errorf("Allocate() = %v, want an *allocator.OwnerError", err)
			}
			if got, err := a.AllocateNext(ctx, tt.owner); !isOwnerError(err, tt.owner) {
				t.Errorf("AllocateNext() = %v, %v; want an *allocator.OwnerError", got, err)
			}
			list, err := s.Client.NetworkingV1().IPAddresses().List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range list.Items {
				if addr, err := netip.ParseAddr(o.Name); err == nil && p.Contains(addr) {
					t.Errorf("IPAddress %s exists after rejected calls", o.Name)
				}
			}
		})
	}
	// The same with a server-side dry run enabled: rejected before the dry-run Create.
	d := realAllocator(t, s, p, WithServerDryRun(true)).DryRun()
	if err := d.Allocate(ctx, ip, allocator.Owner{}); !isOwnerError(err, allocator.Owner{}) {
		t.Errorf("DryRun().Allocate() with the zero Owner = %v, want an *allocator.OwnerError", err)
	}
	if err := a.Allocate(ctx, ip, allocator.Owner{Resource: "services", Name: "web"}); err != nil {
		t.Errorf("Allocate() with a cluster-scoped owner naming resource and name = %v, want nil", err)
	}
}

// isOwnerError reports whether err is an *allocator.OwnerError for owner, matching ErrInvalid, and
// not an API status error (it never reached the server).
func isOwnerError(err error, owner allocator.Owner) bool {
	var oe *allocator.OwnerError
	var se apierrors.APIStatus
	return errors.As(err, &oe) && oe.Owner == owner && errors.Is(err, allocator.ErrInvalid) && !errors.As(err, &se)
}

// TestAPIServerReleaseNotFoundHidesNoLaterObject: a Release of an address nobody holds gets
// NotFound from kube-apiserver; an IPAddress another client creates afterwards must show in Has and
// Used as soon as the informer holds it (the assume timeout is an hour here).
func TestAPIServerReleaseNotFoundHidesNoLaterObject(t *testing.T) {
	s := apiServer(t)
	ctx := context.Background()
	p := netip.MustParsePrefix("192.168.106.0/28")
	a := realAllocator(t, s, p, WithAssumeTimeout(time.Hour))
	ip := netip.MustParseAddr("192.168.106.7")
	if err := a.Release(ctx, ip); err != nil {
		t.Fatalf("Release(%v) = %v", ip, err)
	}
	other := newClient(t, s)
	stale := staleEvents(a)
	if _, err := other.NetworkingV1().IPAddresses().Create(ctx, ObjectFor(ip, testOwner, a.managedBy), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitHandled(t, a, ip, stale)
	if !a.Has(ip) || a.Used() != 1 {
		t.Errorf("Has(%v) = %v, Used() = %d once the informer shows the object; want true, 1", ip, a.Has(ip), a.Used())
	}
}

// TestAPIServerReleaseTwiceFasterThanTheInformerLeavesTheAddressFree runs
// releaseTwiceBehindTheInformer against kube-apiserver, whose Delete events carry a
// resourceVersion of their own.
func TestAPIServerReleaseTwiceFasterThanTheInformerLeavesTheAddressFree(t *testing.T) {
	s := apiServer(t)
	p := netip.MustParsePrefix("fd00:107::/126")
	g := newEventGate(p)
	releaseTwiceBehindTheInformer(t, realGatedAllocator(t, s, p, g), g)
}

// TestAPIServerReleaseAndReuseOutrunTheInformer runs the release/reuse loop against
// kube-apiserver with the informer as it comes.
func TestAPIServerReleaseAndReuseOutrunTheInformer(t *testing.T) {
	s := apiServer(t)
	releaseAndReuse(t, realAllocator(t, s, netip.MustParsePrefix("fd00:108::/126")), 25)
}

// TestAPIServerReleaseAndReuseOutrunALaggingInformer runs the release/reuse loop against
// kube-apiserver with an informer whose events each arrive up to 2 ms late.
func TestAPIServerReleaseAndReuseOutrunALaggingInformer(t *testing.T) {
	s := apiServer(t)
	p := netip.MustParsePrefix("fd00:109::/126")
	g := newEventGate(p)
	g.lag = func() time.Duration { return time.Duration(rand.Int64N(int64(2 * time.Millisecond))) }
	releaseAndReuse(t, realGatedAllocator(t, s, p, g), 25)
}

// TestAPIServerAllocateNextAfterReleaseWithOneAddressFree runs issue 25 part 5's loop against
// kube-apiserver: a /24 with 253 addresses taken by another writer, AllocateNext and Release in
// turn with the informer as it comes.
func TestAPIServerAllocateNextAfterReleaseWithOneAddressFree(t *testing.T) {
	s := apiServer(t)
	cidr := netip.MustParsePrefix("192.168.110.0/24")
	free := netip.MustParseAddr("192.168.110.200")
	a := realAllocator(t, s, cidr)
	takeAllBut(t, newClient(t, s), cidr, free)
	testenv.WaitFor(t, "the informer to show the 253 addresses taken", func() bool { return a.Used() == a.Size()-1 })
	allocateReleaseWithOneFree(t, a, free, 200)
}
