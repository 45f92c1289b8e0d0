package webhook_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/reservation"
)

// TestStockKubeAPIServerWithWebhookCapsRetain runs the webhook and its controller beside stock
// kube-apiserver v1.37.2 through a tenant's attack: Retain Services created under new names and
// deleted, again and again. The loop stops at the namespace's max-retained with kube-apiserver's
// 422 naming the cap, the refused Service does not exist, and the namespace keeps exactly the cap;
// a namespace without the annotation may not retain at all; and a ServiceCIDR's max-reserved
// makes a Retain Service's delete release its address, counted.
func TestStockKubeAPIServerWithWebhookCapsRetain(t *testing.T) {
	t.Parallel()
	s := startStockWithWebhook(t)
	ctx := context.Background()
	optIn(t, s.api, "team-a", "3")
	if _, err := s.api.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "closed"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	retainIn := func(ns, name string) *corev1.Service {
		svc := withPolicy(testenv.ClusterIPService(name, ""), "Retain")
		svc.Namespace = ns
		return svc
	}
	refused := func(t *testing.T, ns, name, wantMsg string) {
		t.Helper()
		_, err := s.api.CoreV1().Services(ns).Create(ctx, retainIn(ns, name), metav1.CreateOptions{})
		var status apierrors.APIStatus
		if !apierrors.IsInvalid(err) || !errors.As(err, &status) || status.Status().Code != 422 {
			t.Fatalf("create of Retain %s/%s: %v, want 422 Invalid", ns, name, err)
		}
		want := fmt.Sprintf(`admission webhook "services.reservations.clusterip.kube-ipam.io" denied the request: Service %q is invalid: metadata.annotations[%s]: Forbidden: %s`,
			name, reservation.AnnotationReleasePolicy, wantMsg)
		if err.Error() != want {
			t.Errorf("create of Retain %s/%s:\n %s\nwant\n %s", ns, name, err, want)
		}
		if _, err := s.api.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("%s/%s after the refusal: %v, want NotFound", ns, name, err)
		}
	}
	keptBy := func(ns string) int {
		list, err := s.res.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, r := range list {
			if r.For.Namespace == ns {
				n++
			}
		}
		return n
	}

	t.Run("a tenant's create-delete loop stops at the namespace's cap", func(t *testing.T) {
		svcs := s.api.CoreV1().Services("team-a")
		// The webhook's Namespace informer shows the annotation once a Retain dry run passes.
		testenv.WaitFor(t, "the webhook to let team-a retain", func() bool {
			_, err := svcs.Create(ctx, retainIn("team-a", "probe"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return err == nil
		})
		for i := 0; ; i++ {
			name := fmt.Sprintf("tenant-%d", i)
			if i == 3 {
				// The handler's informer has all three once a dry run is refused too.
				testenv.WaitFor(t, "the webhook to see team-a's three reservations", func() bool {
					_, err := svcs.Create(ctx, retainIn("team-a", name), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
					return apierrors.IsInvalid(err)
				})
				refused(t, "team-a", name, `namespace "team-a" keeps 3 reserved addresses and may keep 3 (annotation clusterip.kube-ipam.io/max-retained of Namespace "team-a")`)
				break
			}
			if _, err := svcs.Create(ctx, retainIn("team-a", name), metav1.CreateOptions{}); err != nil {
				t.Fatalf("create of %s with room: %v", name, err)
			}
			if err := svcs.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			// Kept by the controller, and seen by the handler's informer: a dry run of the next
			// name is refused only once the namespace is full, so wait for the count.
			want := i + 1
			testenv.WaitFor(t, fmt.Sprintf("team-a to keep %d", want), func() bool { return keptBy("team-a") == want })
		}
		if n := keptBy("team-a"); n != 3 {
			t.Errorf("team-a keeps %d reservations, want exactly its cap, 3", n)
		}
	})

	t.Run("a namespace without the annotation may not retain", func(t *testing.T) {
		refused(t, "closed", "web", `namespace "closed" may not retain addresses: its Namespace has no clusterip.kube-ipam.io/max-retained annotation`)
	})

	t.Run("a ServiceCIDR at its cap makes a delete release", func(t *testing.T) {
		svcs := s.api.CoreV1().Services("default")
		svc, err := svcs.Create(ctx, withPolicy(testenv.ClusterIPService("over-cidr", ""), "Retain"), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		list, err := s.res.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		cidrs := s.api.NetworkingV1().ServiceCIDRs()
		sc, err := cidrs.Get(ctx, "kubernetes", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if sc.Annotations == nil {
			sc.Annotations = map[string]string{}
		}
		sc.Annotations[reservation.AnnotationMaxReserved] = fmt.Sprint(len(list)) // full
		if _, err := cidrs.Update(ctx, sc, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, "the controller's informer to show the cap", func() bool {
			got, err := s.cidrs.Lister().Get("kubernetes")
			return err == nil && got.Annotations[reservation.AnnotationMaxReserved] != ""
		})
		if err := svcs.Delete(ctx, "over-cidr", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, "the refusal to be counted", func() bool {
			return labelledCounter(t, s.reg, "clusterip_reservation_retain_refused_total", "servicecidr") == 1
		})
		ip := svc.Spec.ClusterIPs[0]
		if obj, err := s.api.NetworkingV1().IPAddresses().Get(ctx, ip, metav1.GetOptions{}); err == nil && reservation.IsReservation(obj) {
			t.Errorf("%s of default/over-cidr was kept over the ServiceCIDR's cap: %+v", ip, obj)
		}
		after, err := s.res.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(after) != len(list) {
			t.Errorf("reservations after the delete: %d, want %d (the cap)", len(after), len(list))
		}
	})
}
