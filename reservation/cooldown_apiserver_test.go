package reservation_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/reservation"
)

// setCooldown sets the release-cooldown annotation of the ServiceCIDR name to value through the
// API server ("" removes it), and waits until inf's ServiceCIDR informer shows it.
func setCooldown(t *testing.T, ctx context.Context, c kubernetes.Interface, inf informers.SharedInformerFactory, name, value string) {
	t.Helper()
	cidrs := c.NetworkingV1().ServiceCIDRs()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		sc, err := cidrs.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if sc.Annotations == nil {
			sc.Annotations = map[string]string{}
		}
		if value == "" {
			delete(sc.Annotations, reservation.AnnotationReleaseCooldown)
		} else {
			sc.Annotations[reservation.AnnotationReleaseCooldown] = value
		}
		_, err = cidrs.Update(ctx, sc, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("annotate ServiceCIDR %s: %v", name, err)
	}
	testenv.WaitFor(t, "the informer to show the cooldown "+value, func() bool {
		sc, err := inf.Networking().V1().ServiceCIDRs().Lister().Get(name)
		return err == nil && sc.Annotations[reservation.AnnotationReleaseCooldown] == value
	})
}

// static returns a ClusterIP Service default/name asking for ip.
func static(name, ip string) *corev1.Service {
	s := testenv.ClusterIPService(name, ip)
	s.Spec.ClusterIPs = []string{ip}
	return s
}

// isAlreadyAllocated reports whether err is kube-apiserver's 422 refusal of an address something
// holds.
func isAlreadyAllocated(err error) bool {
	var se *apierrors.StatusError
	return errors.As(err, &se) && se.Status().Code == 422 && strings.Contains(err.Error(), "already allocated")
}

// TestRegistryHoldsAReleasedAddressForItsServiceCIDRsCooldown runs the library's IPAddressOnly
// allocators with Config.Reservations beside a real stock kube-apiserver v1.37.2 whose default
// ServiceCIDR, a /28, has the release-cooldown annotation "3s":
//   - kube-apiserver refuses to change an IPAddress object's parentRef (why the cooldown's
//     reservation is kept for the deleted Service rather than anonymous);
//   - a cooldown that does not parse is a typed error and changes nothing: the address of a
//     deleted Service is free at once;
//   - with "3s", a deleted Service's address (its policy Release by default) becomes a
//     reservation kept for it, ending 3 s after the delete, in the one update that ends the
//     allocation; one of a Service with Retain/1s ends with the cooldown too;
//   - during the cooldown stock and the library refuse the address with 422 to a Service that
//     asks for it, and dynamic creates fill the range without ever getting it;
//   - it is still refused just before the end its annotation names, and free (Run's expiry
//     controller deleted the reservation) within a bounded time after, never before.
func TestRegistryHoldsAReleasedAddressForItsServiceCIDRsCooldown(t *testing.T) {
	api := testenv.NewKubeAPIServer(t, testenv.NewEtcd(t), testenv.KubeAPIServerOptions{Release: "v1.37.2", ServiceClusterIPRange: "10.96.0.0/28"})
	testenv.WaitForKubernetesService(t, api.Client)
	ctx := t.Context()
	a, inf := startRegistryWithInformers(t, api, clusterip.Config{Mode: featuregate.IPAddressOnly, Reservations: true,
		Ranges: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/28")}})
	ipas := api.Client.NetworkingV1().IPAddresses()
	svcs := api.Client.CoreV1().Services("default")

	t.Run("kube-apiserver refuses to change an IPAddress's parentRef", func(t *testing.T) {
		obj := testenv.IPAddress("10.96.0.14", "default", "gone")
		obj.Labels = map[string]string{networkingv1.LabelManagedBy: "clusterip-test", networkingv1.LabelIPAddressFamily: "IPv4"}
		obj, err := ipas.Create(ctx, obj, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = ipas.Delete(context.Background(), obj.Name, metav1.DeleteOptions{}) }()
		obj.Spec.ParentRef = &networkingv1.ParentReference{Group: reservation.Group, Resource: reservation.Resource, Name: "cooldown"}
		_, err = ipas.Update(ctx, obj, metav1.UpdateOptions{})
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.parentRef") {
			t.Errorf("update of the parentRef = %v, want 422 Invalid at spec.parentRef", err)
		}
	})

	t.Run("a cooldown that does not parse changes nothing", func(t *testing.T) {
		setCooldown(t, ctx, api.Client, inf, "kubernetes", "soon")
		sc, err := api.Client.NetworkingV1().ServiceCIDRs().Get(ctx, "kubernetes", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		_, err = reservation.ReleaseCooldownOf(sc.Annotations)
		var ie *reservation.InvalidError
		if !errors.As(err, &ie) || !errors.Is(err, allocator.ErrInvalid) {
			t.Errorf("ReleaseCooldownOf(the ServiceCIDR's annotations) = %v, want an *InvalidError", err)
		}
		svc := fresh("plain")
		if _, err := a.Services().Allocate(ctx, svc, false); err != nil {
			t.Fatal(err)
		}
		ip := svc.Spec.ClusterIPs[0]
		if err := a.Services().Release(ctx, svc); err != nil {
			t.Fatalf("Release(default/plain) = %v", err)
		}
		if obj, err := ipas.Get(ctx, ip, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("after the delete, %s = %+v, %v; want it freed", ip, obj, err)
		}
		again, err := svcs.Create(ctx, static("again", ip), metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("stock create asking for %s at once: %v; want it free", ip, err)
		}
		if err := svcs.Delete(ctx, again.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, "stock to free "+ip, func() bool {
			_, err := ipas.Get(ctx, ip, metav1.GetOptions{})
			return apierrors.IsNotFound(err)
		})
	})

	t.Run("a cooldown of 3s holds a released address for 3 s", func(t *testing.T) {
		setCooldown(t, ctx, api.Client, inf, "kubernetes", "3s")
		web, short := fresh("web"), fresh("short")
		short.Annotations = map[string]string{reservation.AnnotationReleasePolicy: "Retain/1s"}
		for _, s := range []*corev1.Service{web, short} {
			if _, err := a.Services().Allocate(ctx, s, false); err != nil {
				t.Fatal(err)
			}
		}
		ip, shortIP := web.Spec.ClusterIPs[0], short.Spec.ClusterIPs[0]
		deleted := time.Now()
		for _, s := range []*corev1.Service{web, short} {
			if err := a.Services().Release(ctx, s); err != nil {
				t.Fatalf("Release(default/%s) = %v", s.Name, err)
			}
		}
		var end time.Time
		for _, k := range []struct{ name, ip string }{{"web", ip}, {"short", shortIP}} {
			obj, err := ipas.Get(ctx, k.ip, metav1.GetOptions{})
			r, ok := reservation.FromObject(obj)
			if err != nil || !ok || r.For != (types.NamespacedName{Namespace: "default", Name: k.name}) ||
				!strings.Contains(r.Reason, "default/"+k.name) {
				t.Fatalf("after the delete, %s = %+v (%v); want a reservation kept for default/%s naming it", k.ip, obj, err, k.name)
			}
			if d := r.Expires.Sub(deleted); d < 3*time.Second || d > 3*time.Second+time.Second {
				t.Errorf("the reservation of %s ends %v after the delete, want 3s", k.ip, d)
			}
			if k.name == "web" {
				end = r.Expires
			}
		}
		t.Logf("reserved %s until %s, %v after the delete", ip, end.Format(time.RFC3339Nano), end.Sub(deleted).Round(time.Millisecond))

		// Asking for it: 422 from stock and from the library.
		_, stockErr := svcs.Create(ctx, static("asks", ip), metav1.CreateOptions{})
		_, libErr := a.Services().Allocate(ctx, static("asks", ip), false)
		for side, err := range map[string]error{"stock": stockErr, "library": libErr} {
			if !isAlreadyAllocated(err) {
				t.Errorf("%s: a Service asking for %s in its cooldown got %v, want 422 already allocated", side, ip, err)
			}
		}

		// Dynamic creates fill the /28 (14 addresses: kubernetes, the two held, 11 free) and
		// never get it.
		created := 0
		for i := 0; ; i++ {
			s, err := svcs.Create(ctx, fresh(fmt.Sprintf("dyn-%d", i)), metav1.CreateOptions{})
			returned := time.Now()
			if err != nil {
				t.Logf("dynamic create %d: %v", i, err)
				break
			}
			created++
			if got := s.Spec.ClusterIP; got == ip && returned.Before(end) {
				t.Errorf("dynamic create %d got %s %v before its cooldown ends", i, ip, end.Sub(returned))
			}
			if i > 20 {
				t.Fatal("the /28 never filled")
			}
		}
		if _, err := a.Services().Allocate(ctx, fresh("lib-dyn"), false); err == nil {
			t.Error("the library allocated dynamically in a full range")
		}
		t.Logf("%d dynamic creates filled the range, %v before the end", created, time.Until(end).Round(time.Millisecond))
		if time.Now().After(end) {
			t.Fatalf("filling the range outlasted the cooldown: the checks before its end did not run")
		}

		// Still held just before its end, then free within a bounded time, never before.
		time.Sleep(time.Until(end.Add(-300 * time.Millisecond)))
		if _, err := svcs.Create(ctx, static("early", ip), metav1.CreateOptions{}); !isAlreadyAllocated(err) {
			t.Errorf("%v before the end, a Service asking for %s got %v; want 422", time.Until(end).Round(time.Millisecond), ip, err)
		}
		deadline := end.Add(10 * time.Second)
		for {
			_, err := svcs.Create(ctx, static("late", ip), metav1.CreateOptions{})
			returned := time.Now()
			if err == nil {
				if returned.Before(end) {
					t.Errorf("a Service got %s %v before the end of its cooldown", ip, end.Sub(returned))
				}
				t.Logf("a Service got %s %v after the end its annotation names", ip, returned.Sub(end).Round(time.Millisecond))
				break
			}
			if !isAlreadyAllocated(err) {
				t.Fatalf("create asking for %s: %v", ip, err)
			}
			if returned.After(deadline) {
				t.Fatalf("%s still held %v after the end of its cooldown", ip, returned.Sub(end).Round(time.Millisecond))
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
}
