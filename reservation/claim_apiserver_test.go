package reservation_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/reservation"
)

// TestRegistryGivesAServiceTheAddressReservedForIt runs the library's IPAddressOnly allocators
// with Config.Reservations beside a real stock kube-apiserver v1.37.2, as a registry on the
// library (or the fork) does: a Service created without a ClusterIP gets the address reserved for
// its namespace and name, in one update of the reservation's object, which then is the Service's
// allocation (kube-apiserver's managed-by label, the parentRef unchanged); a dry run shows it and
// changes nothing; a create that fails after the claim makes the reservation again; a Service
// with no reservation gets another address; while a reservation stands, stock and the library
// refuse the address to anyone who asks for it; the ServiceCIDR's gauges count reserved
// addresses as reserved and not available; and a reservation no live ServiceCIDR serves (its
// ServiceCIDR being deleted, or an address outside every one) is not claimed.
func TestRegistryGivesAServiceTheAddressReservedForIt(t *testing.T) {
	api := testenv.NewKubeAPIServer(t, testenv.NewEtcd(t), testenv.KubeAPIServerOptions{Release: "v1.37.2", ServiceClusterIPRange: "10.96.0.0/24"})
	ctx := t.Context()
	v, err := featuregate.KubeVersion("1.37.2", "")
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	a := startRegistry(t, api, clusterip.Config{Mode: featuregate.IPAddressOnly, Version: v, Reservations: true, Registerer: reg,
		Ranges: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/24")}})

	rc, err := reservation.New(api.Client)
	if err != nil {
		t.Fatal(err)
	}
	web := types.NamespacedName{Namespace: "default", Name: "web"}
	kept, held := netip.MustParseAddr("10.96.0.20"), netip.MustParseAddr("10.96.0.21")
	if err := rc.Reserve(ctx, reservation.Reservation{Addr: kept, For: web, Reason: "clients pin it"}); err != nil {
		t.Fatal(err)
	}
	if err := rc.Reserve(ctx, reservation.Reservation{Addr: held, Name: "held"}); err != nil {
		t.Fatal(err)
	}
	ipas := api.Client.NetworkingV1().IPAddresses()
	testenv.WaitFor(t, "the informer to show the reservations", func() bool {
		_, ok := claimerView(ctx, t, a, "web")
		return ok
	})

	// The gauges of the ServiceCIDR count the two reservations as reserved, and not available
	// (254 addresses, 1 the kubernetes Service's).
	testenv.WaitFor(t, "the gauges to count the reservations", func() bool {
		return gauge(t, reg, "clusterip_allocator_reserved_ips", "10.96.0.0/24") == 2 &&
			gauge(t, reg, "kube_apiserver_clusterip_allocator_available_ips", "10.96.0.0/24") == 251
	})

	// A dry run shows the reserved address and claims nothing.
	dry := fresh("web")
	if _, err := a.Services().Allocate(ctx, dry, true); err != nil {
		t.Fatal(err)
	}
	if got := dry.Spec.ClusterIPs; len(got) != 1 || got[0] != kept.String() {
		t.Errorf("dry run of default/web: clusterIPs %v, want [%s]", got, kept)
	}
	if obj, err := ipas.Get(ctx, kept.String(), metav1.GetOptions{}); err != nil || !reservation.IsReservation(obj) {
		t.Fatalf("after the dry run, %s = %v, %v; want the reservation still", kept, obj, err)
	}

	// The create claims it; a create that fails afterwards makes it the reservation again.
	svc := fresh("web")
	txn, err := a.Services().Allocate(ctx, svc, false)
	if err != nil {
		t.Fatalf("Allocate(default/web) = %v", err)
	}
	if got := svc.Spec.ClusterIPs; len(got) != 1 || got[0] != kept.String() {
		t.Fatalf("default/web got %v, want [%s], the address reserved for it", got, kept)
	}
	obj, err := ipas.Get(ctx, kept.String(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if reservation.IsReservation(obj) || obj.Labels[networkingv1.LabelManagedBy] != "ipallocator.k8s.io" ||
		obj.Spec.ParentRef.Namespace != "default" || obj.Spec.ParentRef.Name != "web" || obj.Annotations[reservation.AnnotationReason] != "" {
		t.Errorf("claimed object %s: labels %v, annotations %v, parentRef %+v; want the Service's allocation", kept, obj.Labels, obj.Annotations, obj.Spec.ParentRef)
	}
	if err := txn.Revert(ctx); err != nil {
		t.Fatalf("Revert() = %v", err)
	}
	obj, err = ipas.Get(ctx, kept.String(), metav1.GetOptions{})
	if r, ok := reservation.FromObject(obj); err != nil || !ok || r.For != web || r.Reason != "clients pin it" {
		t.Fatalf("after Revert, %s = %+v (%v); want the reservation for default/web again", kept, obj, err)
	}

	// Claimed for good this time (the registry would now store the Service): one reservation
	// left, and still 251 available, the claimed address being the Service's.
	svc = fresh("web")
	if _, err := a.Services().Allocate(ctx, svc, false); err != nil || svc.Spec.ClusterIPs[0] != kept.String() {
		t.Fatalf("Allocate(default/web) again = %v, %v; want %s", svc.Spec.ClusterIPs, err, kept)
	}
	testenv.WaitFor(t, "the gauges to count the claim", func() bool {
		return gauge(t, reg, "clusterip_allocator_reserved_ips", "10.96.0.0/24") == 1 &&
			gauge(t, reg, "kube_apiserver_clusterip_allocator_available_ips", "10.96.0.0/24") == 251
	})

	// Anyone else asking for a reserved address is refused, by stock and by the library.
	other := fresh("other")
	other.Spec.ClusterIP, other.Spec.ClusterIPs = held.String(), []string{held.String()}
	_, stockErr := api.Client.CoreV1().Services("default").Create(ctx, other, metav1.CreateOptions{})
	_, libErr := a.Services().Allocate(ctx, other.DeepCopy(), false)
	for side, err := range map[string]error{"stock": stockErr, "library": libErr} {
		var se *apierrors.StatusError
		if !errors.As(err, &se) || se.Status().Code != 422 {
			t.Errorf("%s: a Service asking for reserved %s got %v, want 422", side, held, err)
		}
	}

	// Neither reservation is given to another Service.
	for _, name := range []string{"late", "nobody"} {
		s := fresh(name)
		if _, err := a.Services().Allocate(ctx, s, false); err != nil {
			t.Fatal(err)
		}
		if got := s.Spec.ClusterIPs[0]; got == kept.String() || got == held.String() {
			t.Errorf("default/%s got reserved %s", name, got)
		}
	}

	// A reservation no live ServiceCIDR serves is not claimed: one in a ServiceCIDR that is then
	// deleted (held terminating by a finalizer of the test's, as kube-controller-manager's holds
	// one that still has addresses), and one of an address outside every ServiceCIDR, created by
	// hand as anyone who may create IPAddress objects can. Each Service gets a dynamic address
	// and each reservation stays.
	const hold = "test.clusterip.kube-ipam.io/hold"
	cidrs := api.Client.NetworkingV1().ServiceCIDRs()
	if _, err := cidrs.Create(ctx, &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "closing", Finalizers: []string{hold}},
		Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.97.0.0/24"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = cidrs.Patch(context.Background(), "closing", types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
	})
	closing, outside := netip.MustParseAddr("10.97.0.5"), netip.MustParseAddr("10.98.0.5")
	if err := rc.Reserve(ctx, reservation.Reservation{Addr: closing, For: types.NamespacedName{Namespace: "default", Name: "closing"}}); err != nil {
		t.Fatal(err)
	}
	dryRun := func(name string) string {
		s := fresh(name)
		if _, err := a.Services().Allocate(ctx, s, true); err != nil {
			t.Fatal(err)
		}
		return s.Spec.ClusterIPs[0]
	}
	testenv.WaitFor(t, "the claimer to show the reservation of default/closing while its ServiceCIDR is live", func() bool {
		return dryRun("closing") == closing.String()
	})
	obj, err = reservation.ObjectFor(reservation.Reservation{Addr: outside, For: types.NamespacedName{Namespace: "default", Name: "gone"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ipas.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cidrs.Delete(ctx, "closing", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	serving := netip.MustParsePrefix("10.96.0.0/24")
	testenv.WaitFor(t, "the claimer to stop showing the reservation in the ServiceCIDR being deleted", func() bool {
		return dryRun("closing") != closing.String()
	})
	for name, ip := range map[string]netip.Addr{"closing": closing, "gone": outside} {
		s := fresh(name)
		if _, err := a.Services().Allocate(ctx, s, false); err != nil {
			t.Fatalf("Allocate(default/%s) = %v", name, err)
		}
		if got, err := netip.ParseAddr(s.Spec.ClusterIPs[0]); err != nil || !serving.Contains(got) {
			t.Errorf("default/%s got %v, want a dynamic address of %s, not its reserved %s", name, s.Spec.ClusterIPs, serving, ip)
		}
		obj, err := ipas.Get(ctx, ip.String(), metav1.GetOptions{})
		if r, ok := reservation.FromObject(obj); err != nil || !ok || r.For.Name != name {
			t.Errorf("the reservation of %s after default/%s's create = %v, %v; want it still there", ip, name, obj, err)
		}
	}
}

// fresh returns a ClusterIP Service default/name asking for any address.
func fresh(name string) *corev1.Service {
	return testenv.ClusterIPService(name, "")
}

// claimerView reports the address the allocators' claimer shows reserved for default/name, by a
// dry run.
func claimerView(ctx context.Context, t *testing.T, a *clusterip.Allocators, name string) (string, bool) {
	t.Helper()
	s := fresh(name)
	if _, err := a.Services().Allocate(ctx, s, true); err != nil {
		t.Fatal(err)
	}
	ip := s.Spec.ClusterIPs[0]
	return ip, ip == "10.96.0.20"
}

// TestRegistryKeepsADeletedServicesAddressesForItsReturn runs the library's IPAddressOnly
// allocators with Config.Reservations beside a real stock kube-apiserver v1.37.2 serving both
// families, as a registry on the library does, through a Velero-style delete and recreate: a
// dual-stack Service whose release policy is "Retain" is deleted, its two addresses become
// reservations kept for its namespace and name in the same update that ends the allocation (no
// instant in which they are free), nobody else gets them, and the Service created again under
// that name gets both back. A malformed policy is refused with 422 at its annotation, and nothing
// is allocated.
func TestRegistryKeepsADeletedServicesAddressesForItsReturn(t *testing.T) {
	api := testenv.NewKubeAPIServer(t, testenv.NewEtcd(t), testenv.KubeAPIServerOptions{Release: "v1.37.2", ServiceClusterIPRange: "10.96.0.0/24,fd00:10:96::/112"})
	ctx := t.Context()
	a := startRegistry(t, api, clusterip.Config{Mode: featuregate.IPAddressOnly, Reservations: true,
		Ranges: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/24"), netip.MustParsePrefix("fd00:10:96::/112")}})
	dualStack := func(name, policy string) *corev1.Service {
		s := fresh(name)
		pol := corev1.IPFamilyPolicyRequireDualStack
		s.Spec.IPFamilyPolicy = &pol
		if policy != "" {
			s.Annotations = map[string]string{reservation.AnnotationReleasePolicy: policy}
		}
		return s
	}

	bad := dualStack("web", "Keep")
	_, err := a.Services().Allocate(ctx, bad, false)
	var se *apierrors.StatusError
	if !errors.As(err, &se) || se.Status().Code != 422 || se.Status().Details == nil || len(se.Status().Details.Causes) != 1 ||
		se.Status().Details.Causes[0].Field != "metadata.annotations["+reservation.AnnotationReleasePolicy+"]" {
		t.Errorf("a malformed release policy: %v, want 422 at its annotation", err)
	}
	if len(bad.Spec.ClusterIPs) != 0 {
		t.Errorf("a malformed release policy allocated %v", bad.Spec.ClusterIPs)
	}

	web := dualStack("web", "Retain")
	if _, err := a.Services().Allocate(ctx, web, false); err != nil {
		t.Fatal(err)
	}
	first := web.Spec.ClusterIPs
	if len(first) != 2 {
		t.Fatalf("default/web got %v, want an address of each family", first)
	}
	if err := a.Services().Release(ctx, web); err != nil { // the registry deleted it
		t.Fatalf("Release(default/web) = %v", err)
	}
	ipas := api.Client.NetworkingV1().IPAddresses()
	for _, ip := range first {
		obj, err := ipas.Get(ctx, ip, metav1.GetOptions{})
		if r, ok := reservation.FromObject(obj); err != nil || !ok || r.For != (types.NamespacedName{Namespace: "default", Name: "web"}) || !r.Expires.IsZero() {
			t.Fatalf("after the delete, %s = %+v (%v); want a reservation kept for default/web, with no end", ip, obj, err)
		}
	}
	testenv.WaitFor(t, "the informer to show the reservations", func() bool {
		s := dualStack("web", "")
		if _, err := a.Services().Allocate(ctx, s, true); err != nil {
			t.Fatal(err)
		}
		return s.Spec.ClusterIPs[0] == first[0] && s.Spec.ClusterIPs[1] == first[1]
	})
	for i := range 5 { // others meanwhile get other addresses
		s := dualStack(fmt.Sprintf("other-%d", i), "")
		if _, err := a.Services().Allocate(ctx, s, false); err != nil {
			t.Fatal(err)
		}
		for f, ip := range s.Spec.ClusterIPs {
			if ip == first[f] {
				t.Errorf("default/other-%d got %s, kept for default/web", i, ip)
			}
		}
	}
	again := dualStack("web", "Retain")
	if _, err := a.Services().Allocate(ctx, again, false); err != nil {
		t.Fatal(err)
	}
	if again.Spec.ClusterIPs[0] != first[0] || again.Spec.ClusterIPs[1] != first[1] {
		t.Errorf("default/web created again got %v, want %v", again.Spec.ClusterIPs, first)
	}
}

// TestRegistryFreesARetainedAddressWhenItsCooldownEnds runs the library's allocators with
// Config.Reservations beside a real stock kube-apiserver v1.37.2: a Service whose release policy
// is "Retain/3s" is deleted, its address is held as a reservation for three seconds, and freed
// (its object deleted by Run's expiry controller) no sooner than the end its annotation names and
// within a second of it.
func TestRegistryFreesARetainedAddressWhenItsCooldownEnds(t *testing.T) {
	api := testenv.NewKubeAPIServer(t, testenv.NewEtcd(t), testenv.KubeAPIServerOptions{Release: "v1.37.2", ServiceClusterIPRange: "10.96.0.0/24"})
	ctx := t.Context()
	a := startRegistry(t, api, clusterip.Config{Mode: featuregate.IPAddressOnly, Reservations: true,
		Ranges: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/24")}})
	svc := fresh("web")
	svc.Annotations = map[string]string{reservation.AnnotationReleasePolicy: "Retain/3s"}
	if _, err := a.Services().Allocate(ctx, svc, false); err != nil {
		t.Fatal(err)
	}
	ip := svc.Spec.ClusterIPs[0]
	if err := a.Services().Release(ctx, svc); err != nil {
		t.Fatal(err)
	}
	ipas := api.Client.NetworkingV1().IPAddresses()
	obj, err := ipas.Get(ctx, ip, metav1.GetOptions{})
	r, ok := reservation.FromObject(obj)
	if err != nil || !ok || r.Expires.IsZero() {
		t.Fatalf("after the delete, %s = %+v (%v); want a reservation with an end", ip, obj, err)
	}
	if left := time.Until(r.Expires); left < 2*time.Second || left > 3*time.Second {
		t.Errorf("the reservation ends in %v, want 3 s after the delete", left)
	}
	time.Sleep(time.Until(r.Expires.Add(-time.Second)))
	if _, err := ipas.Get(ctx, ip, metav1.GetOptions{}); err != nil {
		t.Errorf("a second before its end, the reservation of %s: %v; want it held", ip, err)
	}
	deadline := r.Expires.Add(time.Second)
	for {
		_, err := ipas.Get(ctx, ip, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			if early := time.Until(r.Expires); early > 0 {
				t.Errorf("the reservation of %s went %v before its end", ip, early)
			}
			t.Logf("freed %v after the end it names", time.Since(r.Expires).Round(time.Millisecond))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the reservation of %s still stands a second after its end (%v)", ip, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// gauge returns the value of the gauge name with cidr label cidr that reg gathers, or -1.
func gauge(t *testing.T, reg prometheus.Gatherer, name, cidr string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "cidr" && l.GetValue() == cidr {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return -1
}

// startRegistry runs the library's allocators for cfg (its Client and Informers set to api's) as a
// registry on the library does, until t ends, and returns them once ready.
func startRegistry(t *testing.T, api *testenv.KubeAPIServer, cfg clusterip.Config) *clusterip.Allocators {
	t.Helper()
	a, _ := startRegistryWithInformers(t, api, cfg)
	return a
}

// startRegistryWithInformers is startRegistry, returning the informer factory the allocators
// read too.
func startRegistryWithInformers(t *testing.T, api *testenv.KubeAPIServer, cfg clusterip.Config) (*clusterip.Allocators, informers.SharedInformerFactory) {
	t.Helper()
	a, inf, stop := startStoppableRegistry(t, api, cfg)
	t.Cleanup(stop)
	return a, inf
}

// startStoppableRegistry is startRegistryWithInformers, returning the function that stops the
// registry (once) instead of leaving it to the end of t.
func startStoppableRegistry(t *testing.T, api *testenv.KubeAPIServer, cfg clusterip.Config) (*clusterip.Allocators, informers.SharedInformerFactory, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	optIn(t, api.Client, metav1.NamespaceDefault, "100") // the tests' Retain Services live in default
	inf := informers.NewSharedInformerFactory(api.Client, 0)
	cfg.Client, cfg.Informers = api.Client, inf
	a, err := clusterip.New(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	inf.Start(ctx.Done())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	stop := sync.OnceFunc(func() { cancel(); <-done; inf.Shutdown(); a.Close() })
	if err := a.WaitReady(ctx); err != nil {
		stop()
		t.Fatal(err)
	}
	return a, inf, stop
}

// TestReservationsSurviveRestartsOfEveryProcess makes reservations (one anonymous, one kept for
// a future Service, one kept by a Retain Service's delete) beside a stock kube-apiserver v1.37.2
// through the library's registry, then stops the registry, kube-apiserver and etcd, and starts
// them again: stock still refuses the anonymous one to a create asking for it and never picks
// it, and the new registry gives each named Service its address.
func TestReservationsSurviveRestartsOfEveryProcess(t *testing.T) {
	etcd := testenv.NewEtcd(t)
	opts := testenv.KubeAPIServerOptions{Release: "v1.37.2", ServiceClusterIPRange: "10.96.0.0/24"}
	api := testenv.NewKubeAPIServer(t, etcd, opts)
	ctx := t.Context()
	v, err := featuregate.KubeVersion("1.37.2", "")
	if err != nil {
		t.Fatal(err)
	}
	cfg := clusterip.Config{Mode: featuregate.IPAddressOnly, Version: v, Reservations: true, Ranges: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/24")}}
	rc, err := reservation.New(api.Client)
	if err != nil {
		t.Fatal(err)
	}
	held, kept := netip.MustParseAddr("10.96.0.30"), netip.MustParseAddr("10.96.0.31")
	if err := rc.Reserve(ctx, reservation.Reservation{Addr: held, Name: "held"}); err != nil {
		t.Fatal(err)
	}
	if err := rc.Reserve(ctx, reservation.Reservation{Addr: kept, For: types.NamespacedName{Namespace: "default", Name: "web"}}); err != nil {
		t.Fatal(err)
	}
	a, _, stop := startStoppableRegistry(t, api, cfg)
	keep := fresh("keep")
	keep.Annotations = map[string]string{reservation.AnnotationReleasePolicy: "Retain"}
	if _, err := a.Services().Allocate(ctx, keep, false); err != nil {
		t.Fatal(err)
	}
	if err := a.Services().Release(ctx, keep); err != nil { // the registry deleted it
		t.Fatal(err)
	}
	retained := keep.Spec.ClusterIPs[0]

	stop()
	api.Stop()
	etcd.Stop()
	if err := etcd.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	api = testenv.NewKubeAPIServer(t, etcd, opts)
	a = startRegistry(t, api, cfg)

	svcs := api.Client.CoreV1().Services("default")
	if _, err := svcs.Create(ctx, testenv.ClusterIPService("asks", held.String()), metav1.CreateOptions{}); !apierrors.IsInvalid(err) {
		t.Errorf("stock, restarted: a create asking for %s, reserved: %v, want 422", held, err)
	}
	for i := range 20 {
		got, err := svcs.Create(ctx, testenv.ClusterIPService(fmt.Sprintf("stock-%d", i), ""), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if ip := got.Spec.ClusterIPs[0]; ip == held.String() || ip == kept.String() || ip == retained {
			t.Errorf("stock, restarted, gave default/stock-%d %s, which is reserved", i, ip)
		}
	}
	testenv.WaitFor(t, "the new registry's informer to show the reservations", func() bool {
		ip, _ := claimerView(ctx, t, a, "web")
		return ip == kept.String()
	})
	for name, want := range map[string]string{"web": kept.String(), "keep": retained} {
		s := fresh(name)
		if _, err := a.Services().Allocate(ctx, s, false); err != nil {
			t.Fatal(err)
		}
		if got := s.Spec.ClusterIPs[0]; got != want {
			t.Errorf("default/%s after the restarts got %s, want %s, reserved for it", name, got, want)
		}
	}
}

// optIn annotates Namespace ns (creating it if kube-apiserver has not yet) with
// reservation.AnnotationMaxRetained: value, so that its Services may retain up to value addresses.
func optIn(t *testing.T, client kubernetes.Interface, ns, value string) {
	t.Helper()
	nss := client.CoreV1().Namespaces()
	testenv.WaitFor(t, "Namespace "+ns+" to be annotated max-retained="+value, func() bool {
		obj, err := nss.Get(context.Background(), ns, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			obj = &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Annotations: map[string]string{reservation.AnnotationMaxRetained: value}}}
			_, err = nss.Create(context.Background(), obj, metav1.CreateOptions{})
			return err == nil
		}
		if err != nil {
			return false
		}
		if obj.Annotations[reservation.AnnotationMaxRetained] == value {
			return true
		}
		obj = obj.DeepCopy()
		if obj.Annotations == nil {
			obj.Annotations = map[string]string{}
		}
		obj.Annotations[reservation.AnnotationMaxRetained] = value
		_, err = nss.Update(context.Background(), obj, metav1.UpdateOptions{})
		return err == nil
	})
}
