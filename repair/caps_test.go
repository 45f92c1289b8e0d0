package repair

import (
	"bytes"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-ipam/clusterip/reservation"
)

// An audit reports each namespace's reservations against its max-retained (and those over it),
// and each capped ServiceCIDR prefix's against its max-reserved; ended reservations are not
// counted, and the table lists them after the findings.
func TestAuditReportsReservationsAgainstTheirCaps(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	ns := func(name, value string) *corev1.Namespace {
		o := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if value != "" {
			o.Annotations = map[string]string{reservation.AnnotationMaxRetained: value}
		}
		return o
	}
	w := &world{namespaces: []*corev1.Namespace{ns("team-a", "3"), ns("team-b", "1"), ns("team-c", "5"), ns("closed", ""), ns("quiet", ""), ns("typo", "x")}}
	w.cidrs = []*networkingv1.ServiceCIDR{
		{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Annotations: map[string]string{reservation.AnnotationMaxReserved: "10%"}},
			Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.96.0.0/24"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "small", Annotations: map[string]string{reservation.AnnotationMaxReserved: "2"}},
			Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.97.0.0/28"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "uncapped"}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.98.0.0/24"}}},
	}
	keep := func(ip, ns, name string, expires time.Time) {
		r := reservation.Reservation{Addr: netip.MustParseAddr(ip), Expires: expires}
		if ns == "" {
			r.Name = name
		} else {
			r.For = types.NamespacedName{Namespace: ns, Name: name}
		}
		obj, err := reservation.ObjectFor(r)
		if err != nil {
			t.Fatal(err)
		}
		w.ipAddresses = append(w.ipAddresses, obj)
	}
	keep("10.96.0.10", "team-a", "a", time.Time{})
	keep("10.96.0.11", "team-a", "b", time.Time{})
	keep("10.96.0.12", "team-a", "c", now.Add(time.Hour))
	keep("10.96.0.13", "team-b", "a", time.Time{})
	keep("10.96.0.14", "team-b", "b", time.Time{})
	keep("10.96.0.15", "team-c", "a", now.Add(-time.Second)) // ended
	keep("10.96.0.16", "closed", "a", now.Add(time.Minute))  // a release cooldown's
	keep("10.96.0.17", "gone", "a", time.Time{})             // of a Namespace that is no more
	keep("10.97.0.2", "", "block-a", time.Time{})
	keep("10.97.0.3", "", "block-b", time.Time{})
	keep("10.97.0.4", "", "block-c", time.Time{})
	keep("10.98.0.2", "", "block-d", time.Time{})

	rep := &Report{Mode: "IPAddressOnly", Consistent: true, Counts: map[string]int{}, Caps: capsOf(w, now)}
	var out bytes.Buffer
	if err := rep.WriteTable(&out); err != nil {
		t.Fatal(err)
	}
	want := `Mode IPAddressOnly: consistent
Read 0 Services, 0 IPAddress objects, 0 bitmap bits.

Reservation caps (clusterip.kube-ipam.io/max-retained on Namespaces, clusterip.kube-ipam.io/max-reserved on ServiceCIDRs):
NAMESPACE  RESERVED  MAX-RETAINED  STATE
closed     1         none          may not retain
gone       1         none          may not retain
team-a     3         3             at cap
team-b     2         1             over
team-c     0         5             ok
typo       0         "x"           invalid (may not retain)

SERVICECIDR  PREFIX        RESERVED  MAX-RESERVED  STATE
kubernetes   10.96.0.0/24  7         25 (10%)      ok
small        10.97.0.0/28  3         2             over
Namespaces over their cap: [team-b] (deletes in flight can overshoot it; no Retain Service of theirs is created, and no address kept, until they are back within it).
`
	if diff := cmp.Diff(want, out.String()); diff != "" {
		t.Errorf("caps report (-want +got):\n%s", diff)
	}
}
