package ipaddress

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/allocator/allocatortest"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

// A range is full when the API server holds an object for each of its addresses, not when the
// informer says so: another writer's delete the informer has not delivered yet leaves a free
// address that AllocateNext must find. These run on the fake clientset and on a real
// kube-apiserver, with the allocator's informer held back by an eventGate.
func TestAllocateNextIsFullOnlyWhenTheServerIsFull(t *testing.T) {
	type env struct {
		a      *Allocator
		client kubernetes.Interface // another writer's client
		gate   *eventGate
	}
	envs := []struct {
		name string
		new  func(t *testing.T, cidr netip.Prefix) env
	}{
		{"fake clientset", func(t *testing.T, cidr netip.Prefix) env {
			g := newEventGate(cidr)
			f := newFixture(t, cidr, fixtureOptions{gate: g})
			return env{f.a, f.client, g}
		}},
		{"kube-apiserver", func(t *testing.T, cidr netip.Prefix) env {
			s := apiServer(t)
			g := newEventGate(cidr)
			return env{realGatedAllocator(t, s, cidr, g), newClient(t, s), g}
		}},
	}
	tests := []struct {
		name string
		// freed are the addresses another writer deletes while the informer is held.
		freed    []string
		wantFull bool
	}{
		{name: "full on the server too", wantFull: true},
		{name: "one address freed behind the informer", freed: []string{"10.250.7.20"}},
		{name: "a static-band address freed behind the informer", freed: []string{"10.250.7.3"}},
		{name: "two freed, both found in turn", freed: []string{"10.250.7.5", "10.250.7.25"}},
	}
	for _, e := range envs {
		for _, tt := range tests {
			t.Run(e.name+"/"+tt.name, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				cidr := netip.MustParsePrefix("10.250.7.0/27")
				env := e.new(t, cidr)
				allocatortest.Fill(t, ctx, env.a, testOwner)
				env.gate.Hold()
				for _, ip := range tt.freed {
					if err := env.client.NetworkingV1().IPAddresses().Delete(ctx, ip, metav1.DeleteOptions{}); err != nil {
						t.Fatalf("another writer's delete of %s: %v", ip, err)
					}
				}
				want := map[netip.Addr]bool{}
				for _, ip := range tt.freed {
					want[netip.MustParseAddr(ip)] = true
				}
				for range tt.freed {
					ip, err := env.a.AllocateNext(ctx, testOwner)
					if err != nil {
						t.Fatalf("AllocateNext() with %v free on the server = %v", tt.freed, err)
					}
					if !want[ip] {
						t.Fatalf("AllocateNext() = %v, want one of the freed %v", ip, tt.freed)
					}
					delete(want, ip)
				}
				ip, err := env.a.AllocateNext(ctx, testOwner)
				if !errors.Is(err, allocator.ErrFull) {
					t.Fatalf("AllocateNext() with no address free on the server = %v, %v; want ErrFull", ip, err)
				}
				list, err := env.client.NetworkingV1().IPAddresses().List(ctx, metav1.ListOptions{})
				if err != nil {
					t.Fatal(err)
				}
				n := 0
				for _, o := range list.Items {
					if ip, err := netip.ParseAddr(o.Name); err == nil && cidr.Contains(ip) {
						n++
					}
				}
				if n != 30 {
					t.Errorf("the server holds %d IPAddresses of %v, want 30", n, cidr)
				}
				env.gate.Open()
			})
		}
	}
}

// The addresses tried once the index is full are those the List does not show, dynamic band
// first, found by walking the gaps between held offsets.
func TestUnseen(t *testing.T) {
	tests := []struct {
		name       string
		held       []uint64
		size, band uint64
		n          int
		want       []uint64
	}{
		{"all held", []uint64{0, 1, 2, 3}, 4, 1, 16, nil},
		{"a gap in each band, dynamic first", []uint64{0, 2, 3, 5}, 6, 2, 16, []uint64{4, 1}},
		{"nothing held", nil, 4, 2, 16, []uint64{2, 3, 0, 1}},
		{"at most n", nil, 1 << 40, 16, 3, []uint64{16, 17, 18}},
		{"no static band", []uint64{1}, 3, 0, 16, []uint64{0, 2}},
		{"held past the range ignored", []uint64{0, 1, 9}, 3, 0, 16, []uint64{2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := unseen(tt.held, tt.size, tt.band, tt.n)
			if len(got) != len(tt.want) {
				t.Fatalf("unseen(%v, %d, %d, %d) = %v, want %v", tt.held, tt.size, tt.band, tt.n, got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Fatalf("unseen(%v, %d, %d, %d) = %v, want %v", tt.held, tt.size, tt.band, tt.n, got, tt.want)
				}
			}
		})
	}
}

// listGate intercepts the fake clientset's IPAddress Lists once armed: each reads the tracker
// when it is called, then waits for a value on release (or release closed) before it answers what
// it read, as a List the API server has served but not yet delivered. It counts the Lists it saw.
type listGate struct {
	armed   atomic.Bool
	calls   atomic.Int32
	release chan struct{}
}

func newListGate(f *fixture) *listGate {
	g := &listGate{release: make(chan struct{})}
	tracker := f.client.Tracker()
	f.client.PrependReactor("list", "ipaddresses", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if !g.armed.Load() {
			return false, nil, nil
		}
		g.calls.Add(1)
		obj, err := tracker.List(action.GetResource(), action.(k8stesting.ListActionImpl).GetKind(), "")
		<-g.release
		return true, obj, err
	})
	return g
}

// Callers that find the index full share the List that confirms it: one that started before a
// caller was called is not used by that caller, which waits for the next one, so a caller never
// answers ErrFull from what the server held before it was called.
func TestFullIndexListsAreShared(t *testing.T) {
	cidr := netip.MustParsePrefix("10.250.7.0/27")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	type result struct {
		ip  netip.Addr
		err error
	}
	call := func(a *Allocator) <-chan result {
		ch := make(chan result, 1)
		go func() {
			ip, err := a.AllocateNext(ctx, testOwner)
			ch <- result{ip, err}
		}()
		return ch
	}
	waiting := func(t *testing.T, a *Allocator, n int) {
		t.Helper()
		testenv.WaitFor(t, fmt.Sprintf("%d callers waiting for the List in flight", n), func() bool {
			return a.full.Waiting() == n
		})
	}

	t.Run("callers that come while a List is in flight share the next one", func(t *testing.T) {
		g := newEventGate(cidr)
		f := newFixture(t, cidr, fixtureOptions{gate: g})
		allocatortest.Fill(t, ctx, f.a, testOwner)
		lists := newListGate(f)
		lists.armed.Store(true)
		first := call(f.a)
		testenv.WaitFor(t, "the first List", func() bool { return lists.calls.Load() == 1 })
		const later = 7
		var results []<-chan result
		for range later {
			results = append(results, call(f.a))
		}
		waiting(t, f.a, later)
		lists.release <- struct{}{} // the first List answers; one later caller starts the next
		testenv.WaitFor(t, "the second List, and the other later callers waiting for it", func() bool {
			return lists.calls.Load() == 2 && f.a.full.Waiting() == later-1
		})
		close(lists.release) // every List answers at once from now on
		for i, ch := range append(results, first) {
			if r := <-ch; !errors.Is(r.err, allocator.ErrFull) {
				t.Errorf("caller %d: AllocateNext() = %v, %v; want ErrFull", i, r.ip, r.err)
			}
		}
		if got := lists.calls.Load(); got != 2 {
			t.Errorf("%d Lists for %d callers of a full index, want 2: the first caller's, and one the %d later callers share", got, later+1, later)
		}
	})

	t.Run("a List that started before the call is not used", func(t *testing.T) {
		g := newEventGate(cidr)
		f := newFixture(t, cidr, fixtureOptions{gate: g})
		allocatortest.Fill(t, ctx, f.a, testOwner)
		g.Hold()
		lists := newListGate(f)
		lists.armed.Store(true)
		early := call(f.a) // its List reads a full range
		testenv.WaitFor(t, "the first List", func() bool { return lists.calls.Load() == 1 })
		freed := netip.MustParseAddr("10.250.7.20")
		// Straight to the tracker: the fake runs one action at a time, and the List holds it.
		gvr := networkingv1.SchemeGroupVersion.WithResource("ipaddresses")
		if err := f.client.Tracker().Delete(gvr, "", freed.String()); err != nil {
			t.Fatalf("another writer's delete of %s: %v", freed, err)
		}
		late := call(f.a) // called after the delete, behind the held informer
		waiting(t, f.a, 1)
		close(lists.release)
		if r := <-early; !errors.Is(r.err, allocator.ErrFull) {
			t.Errorf("the caller whose List read the range full: AllocateNext() = %v, %v; want ErrFull", r.ip, r.err)
		}
		if r := <-late; r.err != nil || r.ip != freed {
			t.Errorf("the caller that came after the delete: AllocateNext() = %v, %v; want %v", r.ip, r.err, freed)
		}
		if got := lists.calls.Load(); got != 2 {
			t.Errorf("%d Lists, want 2", got)
		}
		g.Open()
	})
}

// listCounter is an http.RoundTripper that counts the IPAddress Lists (not watches) going
// through it once armed, and the most that were in flight at once.
type listCounter struct {
	next                  http.RoundTripper
	armed                 atomic.Bool
	lists, inFlight, most atomic.Int32
}

func (c *listCounter) RoundTrip(req *http.Request) (*http.Response, error) {
	isList := req.Method == http.MethodGet && strings.HasSuffix(req.URL.Path, "/ipaddresses") && req.URL.Query().Get("watch") == ""
	if !isList || !c.armed.Load() {
		return c.next.RoundTrip(req)
	}
	c.lists.Add(1)
	n := c.inFlight.Add(1)
	for m := c.most.Load(); n > m && !c.most.CompareAndSwap(m, n); m = c.most.Load() {
	}
	defer c.inFlight.Add(-1)
	return c.next.RoundTrip(req) // in flight until its response headers arrive
}

// On a real kube-apiserver, callers that find a full index at the same time never have two Lists
// in flight: they share the one that confirms the range full, and each answers ErrFull.
func TestFullIndexListsAreSharedOnKubeAPIServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := *apiServer(t)
	counter := &listCounter{}
	s.Config = rest.CopyConfig(s.Config)
	s.Config.Wrap(func(rt http.RoundTripper) http.RoundTripper { counter.next = rt; return counter })
	cidr := netip.MustParsePrefix("10.250.9.0/27")
	a := realAllocator(t, &s, cidr)
	allocatortest.Fill(t, ctx, a, testOwner)
	counter.armed.Store(true)
	const callers = 8
	errs := make(chan error, callers)
	for range callers {
		go func() {
			_, err := a.AllocateNext(ctx, testOwner)
			errs <- err
		}()
	}
	for range callers {
		if err := <-errs; !errors.Is(err, allocator.ErrFull) {
			t.Errorf("AllocateNext() on a full range = %v, want ErrFull", err)
		}
	}
	if most := counter.most.Load(); most != 1 {
		t.Errorf("%d IPAddress Lists in flight at once, want 1", most)
	}
	t.Logf("%d callers of a full %v: %d Lists", callers, cidr, counter.lists.Load())
}
