package servicecidr

import (
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/util/retry"

	"github.com/kube-ipam/clusterip/internal/fakeclient"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/reservation"
)

// testGrace is the LifecycleController grace period in these tests.
const testGrace = 200 * time.Millisecond

func withFinalizer(sc *networkingv1.ServiceCIDR) *networkingv1.ServiceCIDR {
	sc.Finalizers = append(sc.Finalizers, Finalizer)
	return sc
}

func newLifecycleFixture(t *testing.T, objects ...runtime.Object) *fixture {
	return newFixture(t, fixtureConfig{
		mem:       newMemFactory(),
		objects:   objects,
		lifecycle: &LifecycleOptions{GracePeriod: testGrace, RecheckInterval: 50 * time.Millisecond},
	})
}

func readyCondition(sc *networkingv1.ServiceCIDR) *metav1.Condition {
	return meta.FindStatusCondition(sc.Status.Conditions, networkingv1.ServiceCIDRConditionReady)
}

// holdFinalizer keeps a ServiceCIDR of a test on a real server from going away on delete.
const holdFinalizer = "servicecidr.test/hold"

// markDeleting starts the deletion of the ServiceCIDR name and leaves it with a deletionTimestamp.
// A real apiserver does that on delete while finalizers remain (the test adds one if there is
// none); the fake clientset would remove the object at once, so there it is set by an update.
func (f *fixture) markDeleting(name string) {
	f.t.Helper()
	sc := f.get(name)
	if f.real {
		if len(sc.Finalizers) == 0 {
			sc.Finalizers = []string{holdFinalizer}
			if _, err := f.client.NetworkingV1().ServiceCIDRs().Update(f.ctx, sc, metav1.UpdateOptions{}); err != nil {
				f.t.Fatal(err)
			}
		}
		f.delete(name)
		return
	}
	// The controller may be writing the same object (its finalizer, its Ready condition): the
	// fake answers a stale update with a Conflict, as the API server does, so read and try again.
	now := metav1.Now()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		sc := f.get(name)
		sc.DeletionTimestamp = &now
		_, err := f.client.NetworkingV1().ServiceCIDRs().Update(f.ctx, sc, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		f.t.Fatal(err)
	}
}

// waitGone waits until the ServiceCIDR name would be gone: removed on a real apiserver, without
// finalizers on the fake clientset, which does not remove objects whose finalizers are done.
func (f *fixture) waitGone(name string) {
	f.t.Helper()
	testenv.WaitFor(f.t, name+" to be gone", func() bool {
		sc, err := f.client.NetworkingV1().ServiceCIDRs().Get(f.ctx, f.name(name), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true
		}
		if err != nil {
			f.t.Fatal(err)
		}
		return !f.real && len(sc.Finalizers) == 0
	})
}

func (f *fixture) createIP(ip string) {
	f.t.Helper()
	if _, err := f.client.NetworkingV1().IPAddresses().Create(f.ctx, testenv.IPAddress(ip, "default", "test"), metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) deleteIP(ip string) {
	f.t.Helper()
	if err := f.client.NetworkingV1().IPAddresses().Delete(f.ctx, ip, metav1.DeleteOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) hasFinalizer(name string) bool {
	return slices.Contains(f.get(name).Finalizers, Finalizer)
}

func (f *fixture) waitFinalizerGone(name string) {
	f.t.Helper()
	testenv.WaitFor(f.t, "the finalizer of "+name+" to be removed", func() bool { return !f.hasFinalizer(name) })
}

func (f *fixture) waitTerminating(name string) {
	f.t.Helper()
	testenv.WaitFor(f.t, name+" to get Ready=False, reason Terminating", func() bool {
		c := readyCondition(f.get(name))
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == ReasonTerminating
	})
}

func TestLifecycleAddsFinalizerAndReadyCondition(t *testing.T) {
	f := newLifecycleFixture(t, notReady(testenv.ServiceCIDR("other", "10.9.0.0/24")))
	f.create(testenv.ServiceCIDR("a", "10.1.0.0/24"))
	testenv.WaitFor(t, "finalizer and Ready=True on a", func() bool {
		sc := f.get("a")
		c := readyCondition(sc)
		return slices.Contains(sc.Finalizers, Finalizer) && c != nil && c.Status == metav1.ConditionTrue
	})
	c := readyCondition(f.get("a"))
	if c.Reason != ReasonReady || c.Message == "" {
		t.Errorf("Ready condition = %+v, want reason %s and a message", c, ReasonReady)
	}
	// A Ready condition someone else set is left alone; the finalizer is still added.
	testenv.WaitFor(t, "finalizer on other", func() bool { return f.hasFinalizer("other") })
	if c := readyCondition(f.get("other")); c.Status != metav1.ConditionFalse {
		t.Errorf("Ready condition of other = %+v, want it left False", c)
	}
}

func TestLifecycleBlocksDeletionWhileIPAddressesWouldBeOrphaned(t *testing.T) {
	f := newLifecycleFixture(t, withFinalizer(testenv.ServiceCIDR("a", "10.1.0.0/24")), testenv.IPAddress("10.1.0.5", "default", "test"), testenv.IPAddress("10.2.0.5", "default", "test"))
	f.markDeleting("a")
	f.waitTerminating("a")
	time.Sleep(2 * testGrace)
	if !f.hasFinalizer("a") {
		t.Fatalf("finalizer removed while IPAddress 10.1.0.5 is in no other ServiceCIDR")
	}
	if c := readyCondition(f.get("a")); c.Message == "" {
		t.Errorf("Terminating condition has no message")
	}
	f.deleteIP("10.1.0.5")
	f.waitFinalizerGone("a")
}

// A reservation (package reservation) is an IPAddress object of another manager; it holds its
// address as a Service's allocation does, so a ServiceCIDR that still holds one is not deleted
// until it is released. Stock kube-apiserver's guard counts only its own objects.
func TestLifecycleBlocksDeletionWhileAReservationHoldsAnAddress(t *testing.T) {
	kept, err := reservation.ObjectFor(reservation.Reservation{Addr: netip.MustParseAddr("10.1.0.7"), Name: "block-a"})
	if err != nil {
		t.Fatal(err)
	}
	f := newLifecycleFixture(t, withFinalizer(testenv.ServiceCIDR("a", "10.1.0.0/24")), kept)
	f.markDeleting("a")
	f.waitTerminating("a")
	time.Sleep(2 * testGrace)
	if !f.hasFinalizer("a") {
		t.Fatalf("finalizer removed while reservation 10.1.0.7 is in no other ServiceCIDR")
	}
	f.deleteIP("10.1.0.7")
	f.waitFinalizerGone("a")
}

func TestLifecycleAllowsDeletionCoveredByAnotherServiceCIDR(t *testing.T) {
	f := newLifecycleFixture(t,
		withFinalizer(testenv.ServiceCIDR("a", "10.1.0.0/24")), testenv.ServiceCIDR("wide", "10.1.0.0/16"),
		withFinalizer(testenv.ServiceCIDR("b", "10.2.0.0/24")), notReady(testenv.ServiceCIDR("off", "10.2.0.0/16")),
		testenv.IPAddress("10.1.0.5", "default", "test"), testenv.IPAddress("10.2.0.5", "default", "test"), testenv.IPAddress("10.1.0.0", "default", "test"))
	f.markDeleting("a")
	f.markDeleting("b")
	f.waitFinalizerGone("a") // 10.1.0.5 and 10.1.0.0 (a's network address) are in wide
	f.waitTerminating("b")   // 10.2.0.5 is only in a ServiceCIDR that is not ready
	if !f.hasFinalizer("b") {
		t.Errorf("finalizer of b removed, though its IPAddress is in no other ready ServiceCIDR")
	}
}

func TestLifecycleRechecksAfterGracePeriod(t *testing.T) {
	f := newFixture(t, fixtureConfig{
		mem:       newMemFactory(),
		objects:   []runtime.Object{withFinalizer(testenv.ServiceCIDR("a", "10.1.0.0/24"))},
		lifecycle: &LifecycleOptions{GracePeriod: 2 * time.Second, RecheckInterval: 50 * time.Millisecond},
	})
	f.markDeleting("a")
	testenv.WaitFor(t, "the grace period to start", func() bool { return !f.lifecycle.clearSinceOf("a").IsZero() })
	// An allocator that had not seen the deletion yet creates an IPAddress during the grace period.
	f.createIP("10.1.0.7")
	f.waitTerminating("a")
	if !f.hasFinalizer("a") {
		t.Fatalf("finalizer removed although an IPAddress appeared during the grace period")
	}
	f.deleteIP("10.1.0.7")
	f.waitFinalizerGone("a")
}

func TestLifecycleRetriesOnConflict(t *testing.T) {
	client := fakeclient.New(fakeclient.Options{Objects: []runtime.Object{testenv.ServiceCIDR("a", "10.1.0.0/24")}})
	var conflicts atomic.Int32
	for _, verb := range []string{"update"} {
		client.PrependReactor(verb, "servicecidrs", func(action k8stesting.Action) (bool, runtime.Object, error) {
			if conflicts.Add(1) <= 2 {
				return true, nil, apierrors.NewConflict(schema.GroupResource{Group: "networking.k8s.io", Resource: "servicecidrs"}, "a", nil)
			}
			return false, nil, nil
		})
	}
	f := newFixture(t, fixtureConfig{client: client, mem: newMemFactory(), lifecycle: &LifecycleOptions{GracePeriod: testGrace}})
	testenv.WaitFor(t, "finalizer and Ready=True after conflicts", func() bool {
		sc := f.get("a")
		c := readyCondition(sc)
		return slices.Contains(sc.Finalizers, Finalizer) && c != nil && c.Status == metav1.ConditionTrue
	})
	if conflicts.Load() < 3 {
		t.Errorf("%d update calls, want the two conflicts and a retry", conflicts.Load())
	}
}

func TestLifecycleIgnoresServiceCIDRWithoutFinalizer(t *testing.T) {
	// Deleting with no finalizer of ours: nothing to do, nothing written.
	sc := testenv.ServiceCIDR("a", "10.1.0.0/24")
	now := metav1.Now()
	sc.DeletionTimestamp = &now
	sc.Finalizers = []string{"example.com/other"}
	f := newLifecycleFixture(t, sc, testenv.IPAddress("10.1.0.5", "default", "test"))
	time.Sleep(2 * testGrace)
	got := f.get("a")
	if readyCondition(got) != nil || !slices.Equal(got.Finalizers, []string{"example.com/other"}) {
		t.Errorf("ServiceCIDR without our finalizer changed: finalizers %v, conditions %v", got.Finalizers, got.Status.Conditions)
	}
}

// TestLifecycleGraceRestartsForARecreatedServiceCIDR deletes a ServiceCIDR during its grace
// period by other means, re-creates it under the same name, and deletes it again after the first
// grace period would have ended: the new ServiceCIDR gets a grace period of its own.
func TestLifecycleGraceRestartsForARecreatedServiceCIDR(t *testing.T) {
	const grace = 500 * time.Millisecond
	first := withFinalizer(testenv.ServiceCIDR("a", "10.1.0.0/24"))
	first.UID = "a-1"
	f := newFixture(t, fixtureConfig{
		mem:       newMemFactory(),
		objects:   []runtime.Object{first},
		lifecycle: &LifecycleOptions{GracePeriod: grace, RecheckInterval: 50 * time.Millisecond},
	})
	f.markDeleting("a")
	testenv.WaitFor(t, "the grace period to start", func() bool { return !f.lifecycle.clearSinceOf("a").IsZero() })
	// Someone else removes it at once (the fake clientset ignores finalizers), and it comes back.
	f.delete("a")
	second := testenv.ServiceCIDR("a", "10.1.0.0/24")
	second.UID = "a-2"
	f.create(second)
	testenv.WaitFor(t, "the finalizer on the new a", func() bool {
		sc := f.get("a")
		return sc.UID == second.UID && f.hasFinalizer("a") && readyCondition(sc) != nil
	})
	time.Sleep(grace)

	start := time.Now()
	f.markDeleting("a")
	f.waitFinalizerGone("a")
	if elapsed := time.Since(start); elapsed < grace {
		t.Errorf("finalizer of the new a removed %v after its deletion, want at least the grace period %v", elapsed, grace)
	}
}

// TestLifecycleConfirmsFinalizerRemovalAgainstLiveState allocates an address and deletes its
// ServiceCIDR at once, with no grace period: the finalizer stays, with Ready=False and reason
// Terminating, until the address is released, also when the controller's IPAddress informer has
// not seen the address (blind): the last check before the finalizer comes off reads the API
// server.
func TestLifecycleConfirmsFinalizerRemovalAgainstLiveState(t *testing.T) {
	for _, tt := range []struct {
		name  string
		b     backend
		blind bool
	}{
		{"FakeInformerBehind", fakeBackend, true},
		{"KubeAPIServerInformerBehind", apiserverBackend, true},
		{"KubeAPIServer", apiserverBackend, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := tt.b.fixture(t, fixtureConfig{
				blindLifecycleIPs: tt.blind,
				lifecycle:         &LifecycleOptions{GracePeriod: -1, RecheckInterval: 50 * time.Millisecond},
			})
			f.create(testenv.ServiceCIDR("a", "10.21.0.0/24"))
			f.waitFinalized("a")
			f.waitReady("10.21.0.0/24")
			ip, err := f.alloc.AllocateNext(f.ctx, webOwner)
			if err != nil {
				t.Fatalf("AllocateNext() = %v", err)
			}
			f.markDeleting("a")
			f.waitTerminating("a")
			time.Sleep(300 * time.Millisecond) // several rechecks
			if !f.hasFinalizer("a") {
				t.Fatalf("finalizer removed while %v is allocated in the ServiceCIDR", ip)
			}
			if err := f.alloc.Release(f.ctx, ip); err != nil {
				t.Fatalf("Release(%v) = %v", ip, err)
			}
			f.waitGone("a")
		})
	}
}
