package repair

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/util/workqueue"

	clusterip "github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

// failFirst makes the first n calls of verb on resource fail with err. It returns how many of
// those failures are still to come.
func failFirst(client *fake.Clientset, verb, resource string, n int, err error) (left func() int) {
	var calls atomic.Int32
	client.PrependReactor(verb, resource, func(k8stesting.Action) (bool, runtime.Object, error) {
		if int(calls.Add(1)) <= n {
			return true, nil, err
		}
		return false, nil, nil
	})
	return func() int { return max(0, n-int(calls.Load())) }
}

// hourlyController returns an IPAddressOnly Controller of 10.0.0.0/24 on client whose passes are an
// hour apart and whose retries start at 10 ms, so that whatever a test sees within seconds is a
// retry, not a pass.
func hourlyController(t *testing.T, client kubernetes.Interface) *Controller {
	t.Helper()
	c, err := NewController(clusterip.Config{Mode: featuregate.IPAddressOnly, Ranges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}, Client: client},
		Options{Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	c.retryBase = 10 * time.Millisecond
	return c
}

// runUntilCancelled starts c.Run and returns a function that cancels it and fails t unless Run
// then returns nil.
func runUntilCancelled(t *testing.T, c *Controller) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	return func() {
		t.Helper()
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run() = %v, want nil once ctx is done", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not return after ctx was cancelled")
		}
	}
}

// countServiceLists counts the Service lists of client: one per pass.
func countServiceLists(client *fake.Clientset) *atomic.Int32 {
	var n atomic.Int32
	client.PrependReactor("list", "services", func(k8stesting.Action) (bool, runtime.Object, error) {
		n.Add(1)
		return false, nil, nil
	})
	return &n
}

// TestRunRetriesAFailedRepairOnItsOwn fails the first two creates of a missing IPAddress: Run
// retries that one address with its own backoff, without another pass (the Interval is an hour).
func TestRunRetriesAFailedRepairOnItsOwn(t *testing.T) {
	client := fake.NewClientset(testenv.ServiceCIDR("kubernetes", "10.0.0.0/24"), svc("a/ok", "10.0.0.10"), aged(ipAddr("10.0.0.10", "a/ok"), time.Hour),
		svc("a/missing", "10.0.0.11"))
	passes := countServiceLists(client)
	failuresLeft := failFirst(client, "create", "ipaddresses", 2, errors.New("etcd leader lost"))
	stop := runUntilCancelled(t, hourlyController(t, client))
	testenv.WaitFor(t, "the missing IPAddress", func() bool {
		_, err := client.NetworkingV1().IPAddresses().Get(t.Context(), "10.0.0.11", metav1.GetOptions{})
		return err == nil
	})
	stop()
	if got := passes.Load(); got != 1 {
		t.Errorf("Run made %d passes, want 1: the failed create is retried on its own", got)
	}
	if left := failuresLeft(); left != 0 {
		t.Errorf("%d injected failures left, want 0", left)
	}
}

// TestRunFreesAHeldOffLeakWhenItsHoldOffEnds: the first pass holds a new leak off; Run
// reconsiders that address when its hold-off ends, without waiting for the next pass.
func TestRunFreesAHeldOffLeakWhenItsHoldOffEnds(t *testing.T) {
	client := fake.NewClientset(testenv.ServiceCIDR("kubernetes", "10.0.0.0/24"), aged(ipAddr("10.0.0.30", "a/gone"), 0))
	passes := countServiceLists(client)
	c, err := NewController(clusterip.Config{Mode: featuregate.IPAddressOnly, Ranges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}, Client: client},
		Options{Interval: time.Hour, LeakGrace: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	stop := runUntilCancelled(t, c)
	testenv.WaitFor(t, "the leaked IPAddress deleted", func() bool {
		_, err := client.NetworkingV1().IPAddresses().Get(t.Context(), "10.0.0.30", metav1.GetOptions{})
		return err != nil
	})
	stop()
	if got := passes.Load(); got != 1 {
		t.Errorf("Run made %d passes, want 1: the held-off leak is retried on its own", got)
	}
}

// TestRunNeverBlocksOnADownAPIServer points Run at an API server that hangs on every request, or
// answers each with 503: Run keeps retrying in the background and returns as soon as its ctx is
// done, whatever is in flight.
func TestRunNeverBlocksOnADownAPIServer(t *testing.T) {
	tests := []struct {
		name     string
		requests int // how many to wait for before cancelling
		handle   func(w http.ResponseWriter, r *http.Request, release <-chan struct{})
	}{
		{name: "hangs", requests: 1, handle: func(w http.ResponseWriter, r *http.Request, release <-chan struct{}) {
			select {
			case <-r.Context().Done():
			case <-release:
			}
		}},
		{name: "answers 503", requests: 3, handle: func(w http.ResponseWriter, r *http.Request, _ <-chan struct{}) {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			release := make(chan struct{})
			var requests atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				requests.Add(1)
				tt.handle(w, r, release)
			}))
			t.Cleanup(srv.Close)
			t.Cleanup(func() { close(release) })
			client, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
			if err != nil {
				t.Fatal(err)
			}
			stop := runUntilCancelled(t, hourlyController(t, client))
			testenv.WaitFor(t, fmt.Sprintf("%d requests", tt.requests), func() bool { return int(requests.Load()) >= tt.requests })
			stop()
		})
	}
}

// TestRunFreesAHeldOffDualWriteLeakWithItsBit: in DualWrite mode the retry that deletes a leaked
// IPAddress once its hold-off ends clears its bit too, against a real etcd, in the same single
// pass.
func TestRunFreesAHeldOffDualWriteLeakWithItsBit(t *testing.T) {
	e := testenv.NewEtcd(t)
	cli := e.TestClient(t)
	store := etcdstore.New(cli, etcdstore.ServiceIPsKey(""))
	storeBitmap(t, cli, store.Key(), bits(t, "10.0.0.0/24", "10.0.0.10", "10.0.0.30"))
	client := fake.NewClientset(testenv.ServiceCIDR("kubernetes", "10.0.0.0/24"),
		svc("a/ok", "10.0.0.10"), aged(ipAddr("10.0.0.10", "a/ok"), time.Hour),
		aged(ipAddr("10.0.0.30", "a/gone"), 0))
	passes := countServiceLists(client)
	cfg := clusterip.Config{Mode: featuregate.DualWrite, Ranges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}, Client: client, Bitmaps: etcdstore.Stores{Client: cli}}
	c, err := NewController(cfg, Options{Interval: time.Hour, LeakGrace: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	stop := runUntilCancelled(t, c)
	testenv.WaitFor(t, "the leak's bit cleared", func() bool {
		b, _, err := bitmap.Load(t.Context(), store, netip.MustParsePrefix("10.0.0.0/24"))
		return err == nil && !b.Has(netip.MustParseAddr("10.0.0.30"))
	})
	stop()
	if got := passes.Load(); got != 1 {
		t.Errorf("Run made %d passes, want 1", got)
	}
	rep, err := Audit(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Consistent {
		t.Errorf("audit after the retry: %+v, want consistent", rep.Findings)
	}
}

// TestRunRetryRechecksLiveStateFirst judges each address from a pass's audit, changes the cluster,
// and then lets Run's retry of that address run: it must see the change and write nothing.
func TestRunRetryRechecksLiveStateFirst(t *testing.T) {
	tests := []struct {
		name    string
		objects []runtime.Object
		class   Class
		change  func(t *testing.T, client *fake.Clientset)
	}{
		{name: "missing, its Service deleted since", class: Missing,
			objects: []runtime.Object{svc("a/x", "10.0.0.11")},
			change: func(t *testing.T, client *fake.Clientset) {
				if err := client.CoreV1().Services("a").Delete(t.Context(), "x", metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "wrong labels, its Service holding another IP since", class: WrongParent,
			objects: []runtime.Object{svc("a/x", "10.0.0.11"), aged(withLabel(ipAddr("10.0.0.11", "a/x"), "ipaddress.kubernetes.io/ip-family", ""), time.Hour)},
			change: func(t *testing.T, client *fake.Clientset) {
				if _, err := client.CoreV1().Services("a").Update(t.Context(), svc("a/x", "10.0.0.12"), metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "wrong parent, its Service deleted since", class: WrongParent,
			objects: []runtime.Object{svc("a/x", "10.0.0.11"), aged(ipAddr("10.0.0.11", "a/y"), time.Hour)},
			change: func(t *testing.T, client *fake.Clientset) {
				if err := client.CoreV1().Services("a").Delete(t.Context(), "x", metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "leaked, written by someone since", class: Leaked,
			objects: []runtime.Object{aged(ipAddr("10.0.0.11", "a/gone"), time.Hour)},
			change: func(t *testing.T, client *fake.Clientset) {
				live := aged(ipAddr("10.0.0.11", "a/new"), time.Hour)
				live.ResourceVersion = "2"
				if _, err := client.NetworkingV1().IPAddresses().Update(t.Context(), live, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "leaked, held by its parent since", class: Leaked,
			objects: []runtime.Object{aged(ipAddr("10.0.0.11", "a/x"), time.Hour)},
			change: func(t *testing.T, client *fake.Clientset) {
				if _, err := client.CoreV1().Services("a").Create(t.Context(), svc("a/x", "10.0.0.11"), metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client := fake.NewClientset(append([]runtime.Object{testenv.ServiceCIDR("kubernetes", "10.0.0.0/24")}, tt.objects...)...)
			cfg := clusterip.Config{Mode: featuregate.IPAddressOnly, Ranges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}, Client: client}
			c, err := NewController(cfg, Options{LeakGrace: -1})
			if err != nil {
				t.Fatal(err)
			}
			w, err := read(t.Context(), &cfg)
			if err != nil {
				t.Fatal(err)
			}
			pending := map[itemKey]finding{}
			for _, f := range classify(w).findings {
				pending[itemKey{addr: f.addr, class: f.Class}] = f
			}
			key := itemKey{addr: netip.MustParseAddr("10.0.0.11"), class: tt.class}
			if _, ok := pending[key]; !ok {
				t.Fatalf("the audit has no %s finding for 10.0.0.11: %v", tt.class, pending)
			}
			tt.change(t, client)
			client.ClearActions()

			q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[itemKey]())
			defer q.ShutDown()
			c.runItem(t.Context(), q, pending, key)
			for _, a := range client.Actions() {
				if a.GetVerb() != "get" {
					t.Errorf("the retry wrote %s %s; want only live Gets", a.GetVerb(), a.GetResource().Resource)
				}
			}
			if _, ok := pending[key]; ok {
				t.Errorf("the retry is still pending; want it dropped once live state shows nothing to do")
			}
		})
	}
}
