package reservation_test

import (
	"context"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/informers"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/internal/fakeclient"
	"github.com/kube-ipam/clusterip/reservation"
)

// TestClaimRacingAReleaseFallsBackToADynamicAddress claims a reservation that is released (or
// claimed by another kube-apiserver) between the claim's read and its update: the Service is then
// created with a dynamic address, as without a reservation, instead of failing.
func TestClaimRacingAReleaseFallsBackToADynamicAddress(t *testing.T) {
	ipaddresses := schema.GroupResource{Group: networkingv1.GroupName, Resource: "ipaddresses"}
	tests := []struct {
		name   string
		update error // what the API server answers every update of the reservation
	}{
		{"released between the read and the update", apierrors.NewNotFound(ipaddresses, "10.96.0.20")},
		{"changed at every read, past the retries", apierrors.NewConflict(ipaddresses, "10.96.0.20", nil)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.20"), For: web}
			obj, err := reservation.ObjectFor(r)
			if err != nil {
				t.Fatal(err)
			}
			fake := fakeclient.New(fakeclient.Options{Objects: []runtime.Object{obj}})
			fake.PrependReactor("update", "ipaddresses", func(k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, tt.update
			})
			factory := informers.NewSharedInformerFactory(fake, 0)
			c, err := reservation.NewClaimer(fake, factory.Networking().V1().IPAddresses(), "")
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer func() { cancel(); factory.Shutdown() }()
			factory.Start(ctx.Done())
			if !cache.WaitForCacheSync(ctx.Done(), factory.Networking().V1().IPAddresses().Informer().HasSynced) {
				t.Fatal("the informer did not sync")
			}
			owner := allocator.Owner{Resource: "services", Namespace: web.Namespace, Name: web.Name}
			addr, undo, err := c.Claim(ctx, corev1.IPv4Protocol, owner)
			if err != nil || addr.IsValid() || undo != nil {
				t.Errorf("Claim() = %v, undo %v, %v; want nothing claimed and no error (a dynamic address)", addr, undo != nil, err)
			}
			got, err := fake.NetworkingV1().IPAddresses().Get(ctx, "10.96.0.20", metav1.GetOptions{})
			if err != nil || !reservation.IsReservation(got) {
				t.Errorf("the reservation after the failed claim: %v, %v; want it unchanged", got, err)
			}
		})
	}
}
