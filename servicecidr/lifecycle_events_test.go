package servicecidr

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/scheme"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/events"

	"github.com/kube-ipam/clusterip/internal/fakeclient"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/reservation"
)

// nextEvent returns the next Event rec got, waiting for it as long as the other waits of these
// tests; it fails t if none comes.
func nextEvent(t *testing.T, rec *events.FakeRecorder) string {
	t.Helper()
	select {
	case e := <-rec.Events:
		return e
	case <-time.After(waitTimeout):
		t.Fatal("no Event")
		return ""
	}
}

func TestLifecycleEventWhenDeletionIsBlocked(t *testing.T) {
	rec := events.NewFakeRecorder(100)
	f := newFixture(t, fixtureConfig{
		mem:       newMemFactory(),
		objects:   []runtime.Object{withFinalizer(testenv.ServiceCIDR("a", "10.1.0.0/24")), testenv.IPAddress("10.1.0.5", "default", "test")},
		lifecycle: &LifecycleOptions{GracePeriod: testGrace, RecheckInterval: 50 * time.Millisecond, Recorder: rec},
	})
	f.markDeleting("a")
	f.waitTerminating("a")
	want := "Warning Terminating Deletion blocked: 1 IPAddresses, such as 10.1.0.5, are in no other ready ServiceCIDR"
	if got := nextEvent(t, rec); got != want {
		t.Errorf("Event = %q, want %q", got, want)
	}
	// Rechecks while it stays blocked (every 50 ms) and the deletion once unblocked add none.
	time.Sleep(2 * testGrace)
	f.deleteIP("10.1.0.5")
	f.waitFinalizerGone("a")
	if n := len(rec.Events); n != 0 {
		t.Errorf("%d more Events, such as %q; want one per blocked deletion", n, <-rec.Events)
	}
}

func TestLifecycleEventWhenReadyCannotBeSet(t *testing.T) {
	gr := schema.GroupResource{Group: "networking.k8s.io", Resource: "servicecidrs"}
	tests := []struct {
		name string
		err  error // of the first UpdateStatus
		want []string
	}{{
		name: "a server error is reported",
		err:  apierrors.NewInternalError(errors.New("injected")),
		want: []string{"Warning KubernetesServiceCIDRError The ServiceCIDR Status can not be set to Ready=True"},
	}, {
		name: "a conflict is only retried",
		err:  apierrors.NewConflict(gr, "a", errors.New("injected")),
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client := fakeclient.New(fakeclient.Options{Objects: []runtime.Object{testenv.ServiceCIDR("a", "10.1.0.0/24")}})
			var failures atomic.Int32
			client.PrependReactor("update", "servicecidrs", func(action k8stesting.Action) (bool, runtime.Object, error) {
				if action.GetSubresource() == "status" && failures.Add(1) == 1 {
					return true, nil, tt.err
				}
				return false, nil, nil
			})
			rec := events.NewFakeRecorder(100)
			f := newFixture(t, fixtureConfig{client: client, mem: newMemFactory(), lifecycle: &LifecycleOptions{GracePeriod: testGrace, Recorder: rec}})
			f.waitFinalized("a") // the retry sets it
			var got []string
			for len(rec.Events) > 0 {
				got = append(got, <-rec.Events)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("Events = %q, want %q", got, tt.want)
			}
		})
	}
}

// With a real kube-apiserver and client-go's events broadcaster, the Event of a blocked deletion
// arrives as an events.k8s.io/v1 Event regarding the ServiceCIDR.
func TestLifecycleEventReachesKubeAPIServer(t *testing.T) {
	client := sharedKubeAPIServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	broadcaster := events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
	broadcaster.StartRecordingToSink(ctx.Done())
	defer broadcaster.Shutdown()
	rec := broadcaster.NewRecorder(scheme.Scheme, "servicecidr-lifecycle-test")

	f := newFixture(t, fixtureConfig{
		client: client, label: nextLabel(),
		lifecycle: &LifecycleOptions{GracePeriod: testGrace, RecheckInterval: 100 * time.Millisecond, Recorder: rec},
	})
	f.create(testenv.ServiceCIDR("doomed", "10.14.0.0/24"))
	f.waitFinalized("doomed")
	f.createIP("10.14.0.5")
	f.markDeleting("doomed")
	f.waitTerminating("doomed")
	name := f.name("doomed")
	var got *eventsOf
	testenv.WaitFor(t, "the Terminating Event of "+name, func() bool {
		got = findEvent(t, f, name, EventReasonTerminating)
		return got != nil
	})
	if got.Type != corev1.EventTypeWarning || got.Kind != "ServiceCIDR" || !strings.Contains(got.Note, "10.14.0.5") {
		t.Errorf("Event = %+v, want a Warning %s regarding ServiceCIDR %s that names 10.14.0.5", *got, EventReasonTerminating, name)
	}
	f.deleteIP("10.14.0.5")
	f.waitGone("doomed")
}

// eventsOf is what TestLifecycleEventReachesKubeAPIServer checks of an Event.
type eventsOf struct{ Type, Reason, Kind, Note string }

// findEvent returns the first Event on f's server regarding the ServiceCIDR name with reason, or
// nil.
func findEvent(t *testing.T, f *fixture, name, reason string) *eventsOf {
	t.Helper()
	list, err := f.client.EventsV1().Events(metav1.NamespaceAll).List(f.ctx, metav1.ListOptions{FieldSelector: "regarding.name=" + name})
	if err != nil {
		t.Fatalf("list Events: %v", err)
	}
	for _, e := range list.Items {
		if e.Regarding.Name == name && e.Reason == reason {
			return &eventsOf{Type: e.Type, Reason: e.Reason, Kind: e.Regarding.Kind, Note: e.Note}
		}
	}
	return nil
}

// On a real kube-apiserver, a reservation made through package reservation's Client holds a
// ServiceCIDR's deletion as a Service's allocation does: the ServiceCIDR stays Terminating with
// its finalizer for several grace periods, and goes once the reservation is released.
func TestLifecycleKeepsAServiceCIDRWithAReservationOnKubeAPIServer(t *testing.T) {
	client := sharedKubeAPIServer(t)
	f := newFixture(t, fixtureConfig{
		client: client, label: nextLabel(),
		lifecycle: &LifecycleOptions{GracePeriod: testGrace, RecheckInterval: 100 * time.Millisecond},
	})
	f.create(testenv.ServiceCIDR("reserved", "10.15.0.0/24"))
	f.waitFinalized("reserved")
	rc, err := reservation.New(client)
	if err != nil {
		t.Fatal(err)
	}
	kept := netip.MustParseAddr("10.15.0.7")
	if err := rc.Reserve(f.ctx, reservation.Reservation{Addr: kept, Name: f.name("kept"), Reason: "a lifecycle test"}); err != nil {
		t.Fatal(err)
	}
	f.markDeleting("reserved")
	f.waitTerminating("reserved")
	time.Sleep(3 * testGrace)
	if !f.hasFinalizer("reserved") {
		t.Fatalf("the finalizer of %s was removed while reservation %s holds an address of it", f.name("reserved"), kept)
	}
	if err := rc.Release(f.ctx, kept); err != nil {
		t.Fatal(err)
	}
	f.waitGone("reserved")
}
