package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/reservation"
)

// TestShippedWebhookKeepsARetainServicesAddressWithNoWindow runs the shipped webhook (see
// startShippedWebhook) beside stock kube-apiserver v1.37.2 serving a /28 that Services fill but
// for the address of default/web, a Retain Service. web is deleted while another Service asks for
// an address again and again from the moment the delete is sent. With the shipped configuration
// the address is never free: every other create is refused "range is full", and the reservation
// kept for web is web's own IPAddress object (the same UID), which kube-apiserver's release did
// not delete; web created again gets the address. Without the entry that sends kube-apiserver's
// release of a reservation to the webhook, the controller does not keep the address in place:
// kube-apiserver frees it, and the reservation, if the other Service did not take the address,
// is a new object.
func TestShippedWebhookKeepsARetainServicesAddressWithNoWindow(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name           string
		drop           []string
		wantSameObject bool
	}{
		{name: "the shipped configuration keeps it in place", wantSameObject: true},
		{name: "without the release entry it is freed and made again", drop: []string{"ipaddress-releases.reservations.clusterip.kube-ipam.io"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := startShippedWebhook(t, shippedOptions{ServiceClusterIPRange: "10.96.0.0/28", Drop: tt.drop})
			api, ctx := s.api.Client, t.Context()
			services := api.CoreV1().Services(metav1.NamespaceDefault)
			webKey := types.NamespacedName{Namespace: metav1.NamespaceDefault, Name: "web"}

			web, err := services.Create(ctx, retainedService(webKey.Name, corev1.IPFamilyPolicySingleStack), metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			ip := web.Spec.ClusterIP
			alloc, err := api.NetworkingV1().IPAddresses().Get(ctx, ip, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			// Fill the range: 14 usable addresses, the kubernetes Service's and web's among them.
			for i := 0; ; i++ {
				_, err := services.Create(ctx, testenv.ClusterIPService(fmt.Sprintf("fill-%d", i), ""), metav1.CreateOptions{})
				if err != nil {
					if !strings.Contains(err.Error(), "range is full") {
						t.Fatalf("fill the range: %v", err)
					}
					break
				}
				if i > 20 {
					t.Fatal("the /28 took more than 20 Services")
				}
			}

			// Another Service asks for an address from the delete on, until web is gone and a
			// second after, well past the release.
			if err := services.Delete(ctx, webKey.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			var took []string
			var goneAt time.Time
			for i := 0; goneAt.IsZero() || time.Since(goneAt) < time.Second; i++ {
				if i > 2000 {
					t.Fatal("web was not deleted after 2000 tries")
				}
				if _, err := services.Get(ctx, webKey.Name, metav1.GetOptions{}); apierrors.IsNotFound(err) && goneAt.IsZero() {
					goneAt = time.Now()
				}
				thief, err := services.Create(ctx, testenv.ClusterIPService(fmt.Sprintf("thief-%d", i), ""), metav1.CreateOptions{})
				switch {
				case err == nil:
					took = append(took, thief.Name+" "+thief.Spec.ClusterIP)
				case !strings.Contains(err.Error(), "range is full"):
					t.Fatalf("another Service's create: %v", err)
				}
			}
			obj, err := api.NetworkingV1().IPAddresses().Get(ctx, ip, metav1.GetOptions{})
			if !tt.wantSameObject {
				if err == nil && obj.UID == alloc.UID {
					t.Errorf("without the release entry, %s is still web's own object: the controller kept it in place with no guard on its release", ip)
				}
				return
			}
			if len(took) > 0 {
				t.Fatalf("other Services got addresses while web was deleted: %q", took)
			}
			if err != nil {
				t.Fatalf("IPAddress %s after web's delete: %v, want its reservation", ip, err)
			}
			if r, ok := reservation.FromObject(obj); !ok || r.For != webKey || obj.UID != alloc.UID {
				t.Fatalf("IPAddress %s after web's delete: %+v; want web's own object (UID %s) kept for default/web", ip, obj, alloc.UID)
			}
			poll(t, "the webhook to hand out the reservation of default/web", func() bool {
				got, err := services.Create(ctx, retainedService(webKey.Name, corev1.IPFamilyPolicySingleStack), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
				return err == nil && got.Spec.ClusterIP == ip
			})
			again, err := services.Create(ctx, retainedService(webKey.Name, corev1.IPFamilyPolicySingleStack), metav1.CreateOptions{})
			if err != nil || again.Spec.ClusterIP != ip {
				t.Fatalf("web created again: %v, %v; want %s", again, err, ip)
			}
		})
	}
}
