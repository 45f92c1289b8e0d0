package webhook_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/reservation"
)

// setCooldown sets the release-cooldown annotation of the default ServiceCIDR "kubernetes" to
// value through the API server, and waits until the controller's ServiceCIDR informer shows it.
func (s *stockWithWebhook) setCooldown(t *testing.T, ctx context.Context, value string) {
	t.Helper()
	cidrs := s.api.NetworkingV1().ServiceCIDRs()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		sc, err := cidrs.Get(ctx, "kubernetes", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if sc.Annotations == nil {
			sc.Annotations = map[string]string{}
		}
		sc.Annotations[reservation.AnnotationReleaseCooldown] = value
		_, err = cidrs.Update(ctx, sc, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("annotate ServiceCIDR kubernetes: %v", err)
	}
	testenv.WaitFor(t, "the controller's informer to show the cooldown "+value, func() bool {
		sc, err := s.cidrs.Lister().Get("kubernetes")
		return err == nil && sc.Annotations[reservation.AnnotationReleaseCooldown] == value
	})
}

// staticService returns a ClusterIP Service default/name asking for ip.
func staticService(name, ip string) *corev1.Service {
	svc := testenv.ClusterIPService(name, ip)
	svc.Spec.ClusterIPs = []string{ip}
	return svc
}

// alreadyAllocated reports whether err is kube-apiserver's 422 refusal of an address something
// holds.
func alreadyAllocated(err error) bool {
	var status apierrors.APIStatus
	return errors.As(err, &status) && status.Status().Code == 422 && strings.Contains(err.Error(), "already allocated")
}

// TestStockKubeAPIServerKeepsAReleasedAddressForItsServiceCIDRsCooldown runs the controller
// beside stock kube-apiserver v1.37.2 with the release-cooldown annotation on its default
// ServiceCIDR: a cooldown that does not parse is a typed error and leaves a deleted Service's
// address free; with "3s", once stock has deleted a deleted Service's IPAddress object the
// controller makes it a reservation kept for the Service until 3 s after the delete, stock
// refuses the address with 422 to a Service that asks for it and gives it to no dynamic create,
// still refuses it just before the end, and gives it within a bounded time after (the
// ExpiryController deleted the reservation), never before. No window is lost without churn.
func TestStockKubeAPIServerKeepsAReleasedAddressForItsServiceCIDRsCooldown(t *testing.T) {
	t.Parallel()
	s := startStockWithWebhook(t)
	ctx := context.Background()
	svcs := s.api.CoreV1().Services("default")
	ipas := s.api.NetworkingV1().IPAddresses()
	const ip = "10.96.0.30"

	t.Run("a cooldown that does not parse changes nothing", func(t *testing.T) {
		s.setCooldown(t, ctx, "500ms")
		sc, err := s.api.NetworkingV1().ServiceCIDRs().Get(ctx, "kubernetes", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var ie *reservation.InvalidError
		if _, err := reservation.ReleaseCooldownOf(sc.Annotations); !errors.As(err, &ie) || !errors.Is(err, allocator.ErrInvalid) {
			t.Errorf("ReleaseCooldownOf(the ServiceCIDR's annotations) = %v, want an *InvalidError", err)
		}
		if _, err := svcs.Create(ctx, staticService("plain", ip), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := svcs.Delete(ctx, "plain", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, "stock to free "+ip, func() bool {
			_, err := ipas.Get(ctx, ip, metav1.GetOptions{})
			return apierrors.IsNotFound(err)
		})
		time.Sleep(200 * time.Millisecond) // time enough for the controller to do the wrong thing
		if obj, err := ipas.Get(ctx, ip, metav1.GetOptions{}); err == nil {
			t.Fatalf("%s = %+v after the delete; want it free", ip, obj)
		}
	})

	t.Run("a cooldown of 3s holds a released address for 3 s", func(t *testing.T) {
		s.setCooldown(t, ctx, "3s")
		lostBefore := s.counter(t, "clusterip_reservation_controller_window_lost_total")
		if _, err := svcs.Create(ctx, staticService("cool", ip), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		deleted := time.Now()
		if err := svcs.Delete(ctx, "cool", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		var r reservation.Reservation
		testenv.WaitFor(t, "the controller to make the cooldown's reservation", func() bool {
			obj, err := ipas.Get(ctx, ip, metav1.GetOptions{})
			if err != nil {
				return false
			}
			var ok bool
			r, ok = reservation.FromObject(obj)
			return ok
		})
		t.Logf("reserved %v after the delete, until %v after it", time.Since(deleted).Round(time.Millisecond), r.Expires.Sub(deleted).Round(time.Millisecond))
		if r.For != (types.NamespacedName{Namespace: "default", Name: "cool"}) || !strings.Contains(r.Reason, "default/cool") {
			t.Errorf("reservation %+v; want one kept for default/cool naming it", r)
		}
		if d := r.Expires.Sub(deleted); d < 3*time.Second || d > 4*time.Second {
			t.Errorf("the reservation ends %v after the delete, want 3s", d)
		}

		if _, err := svcs.Create(ctx, staticService("asks", ip), metav1.CreateOptions{}); !alreadyAllocated(err) {
			t.Errorf("a Service asking for %s in its cooldown got %v, want 422 already allocated", ip, err)
		}
		for i := range 20 {
			svc, err := svcs.Create(ctx, testenv.ClusterIPService(fmt.Sprintf("dyn-%d", i), ""), metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if svc.Spec.ClusterIP == ip && time.Now().Before(r.Expires) {
				t.Errorf("dynamic create %d got %s in its cooldown", i, ip)
			}
		}
		if time.Now().After(r.Expires) {
			t.Fatal("the creates outlasted the cooldown: the checks before its end did not run")
		}

		time.Sleep(time.Until(r.Expires.Add(-300 * time.Millisecond)))
		if _, err := svcs.Create(ctx, staticService("early", ip), metav1.CreateOptions{}); !alreadyAllocated(err) {
			t.Errorf("%v before the end, a Service asking for %s got %v; want 422", time.Until(r.Expires).Round(time.Millisecond), ip, err)
		}
		deadline := r.Expires.Add(10 * time.Second)
		for {
			_, err := svcs.Create(ctx, staticService("late", ip), metav1.CreateOptions{})
			returned := time.Now()
			if err == nil {
				if returned.Before(r.Expires) {
					t.Errorf("a Service got %s %v before the end of its cooldown", ip, r.Expires.Sub(returned))
				}
				t.Logf("a Service got %s %v after the end its annotation names", ip, returned.Sub(r.Expires).Round(time.Millisecond))
				break
			}
			if !alreadyAllocated(err) {
				t.Fatalf("create asking for %s: %v", ip, err)
			}
			if returned.After(deadline) {
				t.Fatalf("%s still held %v after the end of its cooldown", ip, returned.Sub(r.Expires).Round(time.Millisecond))
			}
			time.Sleep(50 * time.Millisecond)
		}
		if got := s.counter(t, "clusterip_reservation_controller_window_lost_total") - lostBefore; got != 0 {
			t.Errorf("%d controller windows lost, want 0", got)
		}
	})
}
