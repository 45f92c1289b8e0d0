package repair

import (
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/reservation"
)

// An audit reports the reservations to look at: ended ones still held, ones no live ServiceCIDR
// serves (outside every one, or in one being deleted), ones kept for a Service of a namespace
// that does not exist, and ones kept for a Service that holds another address of the family; a
// reservation in order, and objects that are not reservations, are not reported.
func TestAuditReportsReservationsToLookAt(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	obj := func(r reservation.Reservation) *networkingv1.IPAddress {
		o, err := reservation.ObjectFor(r)
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	web := types.NamespacedName{Namespace: "default", Name: "web"}
	closing := testenv.ServiceCIDR("closing", "10.98.0.0/24")
	closing.DeletionTimestamp = &metav1.Time{Time: now}
	w := &world{
		cidrs:      []*networkingv1.ServiceCIDR{testenv.ServiceCIDR("kubernetes", "10.96.0.0/24"), closing},
		namespaces: []*corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "default"}}},
		services:   []*corev1.Service{testenv.ClusterIPService("web", "10.96.0.30")},
		ipAddresses: []*networkingv1.IPAddress{
			obj(reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.50"), For: types.NamespacedName{Namespace: "default", Name: "later"}}),
			obj(reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.20"), For: web}),
			obj(reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.40"), Name: "cooldown", Expires: now.Add(-time.Second)}),
			obj(reservation.Reservation{Addr: netip.MustParseAddr("10.97.0.1"), Name: "moved"}),
			obj(reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.41"), Name: "cooling", Expires: now.Add(time.Minute)}),
			obj(reservation.Reservation{Addr: netip.MustParseAddr("10.98.0.7"), Name: "closing"}),
			obj(reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.60"), For: types.NamespacedName{Namespace: "team-gone", Name: "db"}}),
			testenv.IPAddress("10.96.0.30", "default", "web"),
		},
	}
	want := []ReservationFinding{
		{IP: "10.96.0.20", For: "default/web", Problem: ReservationServiceHoldsAnother},
		{IP: "10.96.0.40", Name: "cooldown", Problem: ReservationExpired},
		{IP: "10.96.0.60", For: "team-gone/db", Problem: ReservationNamespaceGone},
		{IP: "10.97.0.1", Name: "moved", Problem: ReservationOutsideServiceCIDRs},
		{IP: "10.98.0.7", Name: "closing", Problem: ReservationOutsideServiceCIDRs},
	}
	if diff := cmp.Diff(want, reservationFindings(w, now)); diff != "" {
		t.Errorf("reservationFindings (-want +got):\n%s", diff)
	}
}
