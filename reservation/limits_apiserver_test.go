package reservation_test

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/reservation"
)

// TestRegistryCapsWhatANamespaceRetains runs the library's allocators with Config.Reservations
// beside a real stock kube-apiserver v1.37.2, as a registry on the library does, through a
// tenant's loop of creating Retain Services under new names and deleting them: the namespace
// keeps exactly its max-retained, the next create is refused with 422 Invalid, Forbidden at the
// release-policy annotation, naming the cap, and allocates nothing; a namespace without the
// annotation may not retain at all; and a Retain Service deleted while its namespace is at the
// cap (created before the cap was reached) releases its address.
func TestRegistryCapsWhatANamespaceRetains(t *testing.T) {
	api := testenv.NewKubeAPIServer(t, testenv.NewEtcd(t), testenv.KubeAPIServerOptions{Release: "v1.37.2", ServiceClusterIPRange: "10.96.0.0/24"})
	ctx := t.Context()
	optIn(t, api.Client, "team-a", "3")
	if _, err := api.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "closed"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	a := startRegistry(t, api, clusterip.Config{Mode: featuregate.IPAddressOnly, Reservations: true,
		Ranges: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/24")}})
	retain := func(ns, name string) *corev1.Service {
		s := fresh(name)
		s.Namespace = ns
		s.Annotations = map[string]string{reservation.AnnotationReleasePolicy: "Retain"}
		return s
	}
	refusal := func(t *testing.T, err error, svc *corev1.Service, wantMsg string) {
		t.Helper()
		var se *apierrors.StatusError
		if !errors.As(err, &se) || se.Status().Code != 422 || se.Status().Reason != metav1.StatusReasonInvalid || se.Status().Details == nil ||
			len(se.Status().Details.Causes) != 1 || se.Status().Details.Causes[0].Field != "metadata.annotations["+reservation.AnnotationReleasePolicy+"]" ||
			se.Status().Details.Causes[0].Type != metav1.CauseTypeForbidden {
			t.Fatalf("Allocate(%s) = %v, want 422 Invalid, Forbidden at the release-policy annotation", svc.Name, err)
		}
		if want := fmt.Sprintf("Service %q is invalid: metadata.annotations[%s]: Forbidden: %s", svc.Name, reservation.AnnotationReleasePolicy, wantMsg); se.Error() != want {
			t.Errorf("Allocate(%s) = %q\nwant %q", svc.Name, se.Error(), want)
		}
		if len(svc.Spec.ClusterIPs) != 0 {
			t.Errorf("the refused %s was given %v", svc.Name, svc.Spec.ClusterIPs)
		}
	}

	// A Retain Service created while there is room, deleted once the namespace is full.
	late := retain("team-a", "late")
	if _, err := a.Services().Allocate(ctx, late, false); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		svc := retain("team-a", fmt.Sprintf("tenant-%d", i))
		_, err := a.Services().Allocate(ctx, svc, false)
		if i == 3 {
			refusal(t, err, svc, `namespace "team-a" keeps 3 reserved addresses and may keep 3 (annotation clusterip.kube-ipam.io/max-retained of Namespace "team-a")`)
			break
		}
		if err != nil {
			t.Fatalf("Allocate(%s), with room: %v", svc.Name, err)
		}
		if err := a.Services().Release(ctx, svc); err != nil {
			t.Fatal(err)
		}
		// The registry's informer must see the reservation before the next create counts it.
		testenv.WaitFor(t, "the reservation of "+svc.Name+" to be seen", func() bool {
			_, ok := a.Reservations().Reserved(corev1.IPv4Protocol, allocator.ServiceOwner(svc))
			return ok
		})
	}
	rc, err := reservation.New(api.Client)
	if err != nil {
		t.Fatal(err)
	}
	count := func() int {
		list, err := rc.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return len(list)
	}
	if n := count(); n != 3 {
		t.Errorf("reservations = %d, want exactly the cap, 3", n)
	}

	ip := late.Spec.ClusterIPs[0]
	if err := a.Services().Release(ctx, late); err != nil {
		t.Fatal(err)
	}
	if _, err := api.Client.NetworkingV1().IPAddresses().Get(ctx, ip, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("team-a/late, deleted at the cap: %s = %v; want it released", ip, err)
	}
	if n := count(); n != 3 {
		t.Errorf("reservations after a delete at the cap = %d, want 3", n)
	}

	closed := retain("closed", "web")
	_, err = a.Services().Allocate(ctx, closed, false)
	refusal(t, err, closed, `namespace "closed" may not retain addresses: its Namespace has no clusterip.kube-ipam.io/max-retained annotation`)
}
