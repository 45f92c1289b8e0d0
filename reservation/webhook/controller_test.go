package webhook_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/klog/v2/ktesting"

	"github.com/kube-ipam/clusterip/internal/fakeclient"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/reservation"
	"github.com/kube-ipam/clusterip/reservation/webhook"
)

// counterValue returns the value of the counter name in reg.
func counterValue(t *testing.T, reg *prometheus.Registry, name string) int {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return int(mf.GetMetric()[0].GetCounter().GetValue())
		}
	}
	t.Fatalf("no counter %s", name)
	return 0
}

// runController starts the informers of factory and c's workers, and stops both when t ends
// (after the cleanups registered before it). The context it returns logs to t: a lost window in
// another test's log says nothing.
func runController(t *testing.T, factory informers.SharedInformerFactory, c *webhook.Controller) context.Context {
	t.Helper()
	_, tctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(tctx)
	factory.Start(ctx.Done())
	done := make(chan error)
	go func() { done <- c.Run(ctx, 1) }()
	t.Cleanup(func() { cancel(); <-done; factory.Shutdown() })
	return ctx
}

// waitForReservation waits until the fake holds a reservation at ip and returns it.
func waitForReservation(t *testing.T, ctx context.Context, fake *fakeclient.Clientset, ip string) reservation.Reservation {
	t.Helper()
	var r reservation.Reservation
	testenv.WaitFor(t, "the reservation at "+ip, func() bool {
		obj, err := fake.NetworkingV1().IPAddresses().Get(ctx, ip, metav1.GetOptions{})
		if err != nil {
			return false
		}
		var ok bool
		r, ok = reservation.FromObject(obj)
		return ok
	})
	return r
}

func TestControllerRetainsTheAddressesOfADeletedService(t *testing.T) {
	tests := []struct {
		name     string
		policy   string // "" for no annotation
		holder   runtime.Object
		wantFor  string // the Service the reservation at 10.96.0.20 is kept for; "" for none
		wantLost int
	}{
		{name: "Retain/1h keeps the address for the Service's name", policy: "Retain/1h", wantFor: "default/web"},
		{name: "Retain keeps the address for the Service's name", policy: "Retain", wantFor: "default/web"},
		{name: "no annotation releases the address", policy: ""},
		{name: "Release releases the address", policy: "Release"},
		{name: "another Service holding the address is a lost window", policy: "Retain", holder: testenv.IPAddress("10.96.0.20", "default", "other"), wantLost: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := testenv.ClusterIPService("web", "10.96.0.20")
			svc.Spec.ClusterIPs = []string{"10.96.0.20"}
			if tt.policy != "" {
				svc.Annotations = map[string]string{reservation.AnnotationReleasePolicy: tt.policy}
			}
			objs := []runtime.Object{svc, optedIn("default", "10")}
			if tt.holder != nil {
				objs = append(objs, tt.holder)
			}
			fake := fakeclient.New(fakeclient.Options{Objects: objs})
			reg := prometheus.NewRegistry()
			m, err := webhook.NewMetrics(reg)
			if err != nil {
				t.Fatal(err)
			}
			factory := informers.NewSharedInformerFactory(fake, 0)
			c, err := webhook.NewController(fake, factory.Core().V1().Services(), webhook.ControllerOptions{Metrics: m, ReleaseTimeout: 2 * time.Second, PollInterval: time.Millisecond,
				Limits: limitsOf(t, factory, false)})
			if err != nil {
				t.Fatal(err)
			}
			ctx := runController(t, factory, c)
			fake.WaitWatching(t, "services")
			if err := fake.CoreV1().Services("default").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			if tt.wantFor != "" {
				if r := waitForReservation(t, ctx, fake, "10.96.0.20"); r.For.String() != tt.wantFor {
					t.Errorf("the reservation is kept for %s, want %s", r.For, tt.wantFor)
				}
				return
			}
			if tt.wantLost > 0 {
				testenv.WaitFor(t, "the lost window to be counted", func() bool {
					return counterValue(t, reg, "clusterip_reservation_controller_window_lost_total") == tt.wantLost
				})
			}
			time.Sleep(50 * time.Millisecond) // time enough to do the wrong thing
			obj, err := fake.NetworkingV1().IPAddresses().Get(ctx, "10.96.0.20", metav1.GetOptions{})
			if err == nil && reservation.IsReservation(obj) {
				t.Errorf("a reservation was made: %+v", obj)
			}
		})
	}
}

// TestControllerKeepsAnAddressForItsServiceCIDRsCooldown runs the controller on the fake
// clientset with a ServiceCIDR informer: a deleted Service's address in a ServiceCIDR with a
// release cooldown becomes a reservation kept for it until the end reservation.KeptOnDelete
// gives, counted from the delete; a cooldown that does not parse, and a controller without the
// ServiceCIDR informer, change nothing.
func TestControllerKeepsAnAddressForItsServiceCIDRsCooldown(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name       string
		cooldown   string // the ServiceCIDR's annotation; "" for none
		policy     string // the Service's; "" for none
		noCIDRs    bool   // the controller has no ServiceCIDR informer
		wantEnd    time.Duration
		wantKept   bool
		wantReason bool
		holder     runtime.Object // another Service's allocation of 10.96.0.20, if any
		wantLost   int
	}{
		{name: "a cooldown keeps a Service without a policy", cooldown: "3s", wantKept: true, wantEnd: 3 * time.Second, wantReason: true},
		{name: "a cooldown keeps a Service with Release", cooldown: "3s", policy: "Release", wantKept: true, wantEnd: 3 * time.Second, wantReason: true},
		{name: "a longer cooldown outlasts Retain/1s", cooldown: "1m", policy: "Retain/1s", wantKept: true, wantEnd: time.Minute, wantReason: true},
		{name: "Retain/1h outlasts a cooldown", cooldown: "3s", policy: "Retain/1h", wantKept: true, wantEnd: time.Hour},
		{name: "a cooldown that does not parse frees", cooldown: "soon"},
		{name: "no ServiceCIDR informer, no cooldown", cooldown: "3s", noCIDRs: true},
		{name: "no annotation frees", cooldown: ""},
		{name: "another Service holding the address is a lost window", cooldown: "3s", holder: testenv.IPAddress("10.96.0.20", "default", "other"), wantLost: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := testenv.ClusterIPService("web", "10.96.0.20")
			svc.Spec.ClusterIPs = []string{"10.96.0.20"}
			if tt.policy != "" {
				svc.Annotations = map[string]string{reservation.AnnotationReleasePolicy: tt.policy}
			}
			sc := testenv.ServiceCIDR("kubernetes", "10.96.0.0/24")
			if tt.cooldown != "" {
				sc.Annotations = map[string]string{reservation.AnnotationReleaseCooldown: tt.cooldown}
			}
			objs := []runtime.Object{svc, sc, optedIn("default", "10")}
			if tt.holder != nil {
				objs = append(objs, tt.holder)
			}
			fake := fakeclient.New(fakeclient.Options{Objects: objs})
			reg := prometheus.NewRegistry()
			m, err := webhook.NewMetrics(reg)
			if err != nil {
				t.Fatal(err)
			}
			factory := informers.NewSharedInformerFactory(fake, 0)
			opts := webhook.ControllerOptions{Metrics: m, ReleaseTimeout: 2 * time.Second, PollInterval: time.Millisecond, Now: func() time.Time { return now },
				Limits: limitsOf(t, factory, !tt.noCIDRs)}
			if !tt.noCIDRs {
				opts.ServiceCIDRs = factory.Networking().V1().ServiceCIDRs()
			}
			c, err := webhook.NewController(fake, factory.Core().V1().Services(), opts)
			if err != nil {
				t.Fatal(err)
			}
			ctx := runController(t, factory, c)
			fake.WaitWatching(t, "services")
			if !tt.noCIDRs {
				fake.WaitWatching(t, "servicecidrs")
				// Watching is not synced: the ServiceCIDR reaches the lister only when the
				// informer has popped its list, which on a loaded machine can be after the
				// Service's delete is handled (no cooldown then, nothing queued, nothing counted).
				factory.WaitForCacheSync(ctx.Done())
			}
			if err := fake.CoreV1().Services("default").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			if tt.wantLost > 0 {
				testenv.WaitFor(t, "the lost window to be counted", func() bool {
					return counterValue(t, reg, "clusterip_reservation_controller_window_lost_total") == tt.wantLost
				})
			}
			if !tt.wantKept {
				time.Sleep(50 * time.Millisecond) // time enough to do the wrong thing
				if obj, err := fake.NetworkingV1().IPAddresses().Get(ctx, "10.96.0.20", metav1.GetOptions{}); err == nil && reservation.IsReservation(obj) {
					t.Errorf("a reservation was made: %+v", obj)
				}
				return
			}
			r := waitForReservation(t, ctx, fake, "10.96.0.20")
			if r.For.String() != "default/web" || !r.Expires.Equal(now.Add(tt.wantEnd)) {
				t.Errorf("reservation %+v; want one kept for default/web until %v", r, now.Add(tt.wantEnd))
			}
			if got := strings.Contains(r.Reason, "default/web"); got != tt.wantReason {
				t.Errorf("reason %q names the Service: %v, want %v", r.Reason, got, tt.wantReason)
			}
		})
	}
}

// TestControllerKeepsACooldownForADeleteSeenBeforeServiceCIDRsLoad is the restart of the
// webhook's controller: a Service's delete arrives before the ServiceCIDR informer has loaded
// (here, before it has started at all); the address is still kept for its ServiceCIDR's release
// cooldown, counted from the delete, once the ServiceCIDRs are known.
func TestControllerKeepsACooldownForADeleteSeenBeforeServiceCIDRsLoad(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	svc := testenv.ClusterIPService("web", "10.96.0.20")
	svc.Spec.ClusterIPs = []string{"10.96.0.20"}
	sc := testenv.ServiceCIDR("kubernetes", "10.96.0.0/24")
	sc.Annotations = map[string]string{reservation.AnnotationReleaseCooldown: "1m"}
	fake := fakeclient.New(fakeclient.Options{Objects: []runtime.Object{svc, sc}})
	services := informers.NewSharedInformerFactory(fake, 0)
	cidrs := informers.NewSharedInformerFactory(fake, 0)
	c, err := webhook.NewController(fake, services.Core().V1().Services(), webhook.ControllerOptions{
		ServiceCIDRs: cidrs.Networking().V1().ServiceCIDRs(), ReleaseTimeout: 2 * time.Second, PollInterval: time.Millisecond,
		Now: func() time.Time { return now },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cidrs.Shutdown) // after runController's cleanup has stopped ctx
	ctx := runController(t, services, c)
	services.WaitForCacheSync(ctx.Done())
	fake.WaitWatching(t, "services")
	if err := fake.CoreV1().Services("default").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the Service's delete to reach the informer", func() bool {
		_, err := services.Core().V1().Services().Lister().Services("default").Get("web")
		return err != nil
	})
	cidrs.Start(ctx.Done())
	if r := waitForReservation(t, ctx, fake, "10.96.0.20"); r.For.String() != "default/web" || !r.Expires.Equal(now.Add(time.Minute)) {
		t.Errorf("reservation %+v; want one kept for default/web until %v", r, now.Add(time.Minute))
	}
}
