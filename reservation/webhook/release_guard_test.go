package webhook_test

import (
	"encoding/json"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/kube-ipam/clusterip/internal/fakeclient"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/reservation"
	"github.com/kube-ipam/clusterip/reservation/webhook"
)

// releaseEntry is the shipped webhook entry that sends kube-apiserver's deletes of reservations,
// with failurePolicy policy and objectSelector sel.
func releaseEntry(policy admissionregistrationv1.FailurePolicyType, sel *metav1.LabelSelector) admissionregistrationv1.MutatingWebhook {
	return admissionregistrationv1.MutatingWebhook{
		Name: "ipaddress-releases.reservations.clusterip.kube-ipam.io",
		Rules: []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Delete},
			Rule: admissionregistrationv1.Rule{APIGroups: []string{"networking.k8s.io"}, APIVersions: []string{"v1"}, Resources: []string{"ipaddresses"}}}},
		ObjectSelector: sel,
		FailurePolicy:  ptr.To(policy),
	}
}

// reservationsSelector is the shipped entry's objectSelector: every reservation.
var reservationsSelector = &metav1.LabelSelector{MatchLabels: map[string]string{networkingv1.LabelManagedBy: reservation.ManagedBy}}

// guardedConfiguration is the shipped configuration: the Services entry, and the entry of
// kube-apiserver's releases of reservations with failurePolicy Fail.
func guardedConfiguration() *admissionregistrationv1.MutatingWebhookConfiguration {
	cfg := webhookConfiguration([]admissionregistrationv1.OperationType{admissionregistrationv1.Create}, notKubeSystem, nil)
	cfg.Webhooks = append(cfg.Webhooks, releaseEntry(admissionregistrationv1.Fail, reservationsSelector))
	return cfg
}

func TestSentGuardsReleasesOnlyWhenEveryReservationsDeleteFailsWithoutTheWebhook(t *testing.T) {
	ipv4Only := &metav1.LabelSelector{MatchLabels: map[string]string{networkingv1.LabelManagedBy: reservation.ManagedBy, networkingv1.LabelIPAddressFamily: "IPv4"}}
	allocations := &metav1.LabelSelector{MatchLabels: map[string]string{networkingv1.LabelManagedBy: "ipallocator.k8s.io"}}
	tests := []struct {
		name  string
		entry *admissionregistrationv1.MutatingWebhook // nil: the Services entry alone
		want  bool
	}{
		{"the shipped entry", ptr.To(releaseEntry(admissionregistrationv1.Fail, reservationsSelector)), true},
		{"every IPAddress delete", ptr.To(releaseEntry(admissionregistrationv1.Fail, nil)), true},
		{"failurePolicy Ignore would free the address while the webhook is down", ptr.To(releaseEntry(admissionregistrationv1.Ignore, reservationsSelector)), false},
		{"IPv4 reservations only", ptr.To(releaseEntry(admissionregistrationv1.Fail, ipv4Only)), false},
		{"kube-apiserver's allocations only", ptr.To(releaseEntry(admissionregistrationv1.Fail, allocations)), false},
		{"no such entry", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := webhookConfiguration([]admissionregistrationv1.OperationType{admissionregistrationv1.Create}, notKubeSystem, nil)
			if tt.entry != nil {
				cfg.Webhooks = append(cfg.Webhooks, *tt.entry)
			}
			fake := fakeclient.New(fakeclient.Options{Objects: []runtime.Object{cfg}})
			factory := informers.NewSharedInformerFactory(fake, 0)
			sent, err := webhook.NewSent(factory.Admissionregistration().V1().MutatingWebhookConfigurations(), factory.Core().V1().Namespaces(), "clusterip-reservations")
			if err != nil {
				t.Fatal(err)
			}
			factory.Start(t.Context().Done())
			factory.WaitForCacheSync(t.Context().Done())
			t.Cleanup(factory.Shutdown)
			if got := sent.GuardsReleases(); got != tt.want {
				t.Errorf("GuardsReleases() = %v, want %v", got, tt.want)
			}
		})
	}
}

// deleteReview is kube-apiserver's review of the delete of obj by user.
func deleteReview(t *testing.T, obj *networkingv1.IPAddress, user string) *admissionv1.AdmissionRequest {
	t.Helper()
	raw, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	return &admissionv1.AdmissionRequest{
		UID:       "review-1",
		Resource:  metav1.GroupVersionResource{Group: "networking.k8s.io", Version: "v1", Resource: "ipaddresses"},
		Name:      obj.Name,
		Operation: admissionv1.Delete,
		UserInfo:  authenticationv1.UserInfo{Username: user},
		OldObject: runtime.RawExtension{Raw: raw},
	}
}

func TestHandlerRefusesKubeAPIServersReleaseOfAnAddressKeptForAService(t *testing.T) {
	keptForWeb, err := reservation.ObjectFor(reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.20"), For: types.NamespacedName{Namespace: "default", Name: "web"}})
	if err != nil {
		t.Fatal(err)
	}
	anonymous, err := reservation.ObjectFor(reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.20"), Name: "pinned"})
	if err != nil {
		t.Fatal(err)
	}
	allocation := &networkingv1.IPAddress{ObjectMeta: metav1.ObjectMeta{Name: "10.96.0.20", Labels: map[string]string{networkingv1.LabelManagedBy: "ipallocator.k8s.io"}},
		Spec: networkingv1.IPAddressSpec{ParentRef: &networkingv1.ParentReference{Resource: "services", Namespace: "default", Name: "web"}}}
	service := func(name string, deleting bool) *corev1.Service {
		svc := testenv.ClusterIPService(name, "10.96.0.20")
		svc.Spec.ClusterIPs = []string{"10.96.0.20"}
		if deleting {
			svc.DeletionTimestamp = &metav1.Time{Time: time.Now()}
			svc.Finalizers = []string{webhook.Finalizer}
		}
		return svc
	}
	tests := []struct {
		name     string
		obj      *networkingv1.IPAddress
		user     string
		services []runtime.Object
		allowed  bool
	}{
		{"kube-apiserver's release of web's kept address, web being deleted", keptForWeb, webhook.KubeAPIServerUser, []runtime.Object{service("web", true)}, false},
		{"kube-apiserver's release of web's kept address, web gone", keptForWeb, webhook.KubeAPIServerUser, nil, false},
		{"kube-apiserver's repair for another live Service holding the address (the Service wins)", keptForWeb, webhook.KubeAPIServerUser, []runtime.Object{service("db", false)}, true},
		{"kube-apiserver's repair for web, live, holding its own reservation", keptForWeb, webhook.KubeAPIServerUser, []runtime.Object{service("web", false)}, true},
		{"an operator's delete of web's kept address", keptForWeb, "alice", []runtime.Object{service("web", true)}, true},
		{"the webhook's own delete (a hand-out)", keptForWeb, "system:serviceaccount:kube-system:clusterip-reservations-webhook", nil, true},
		{"kube-apiserver's delete of an anonymous reservation", anonymous, webhook.KubeAPIServerUser, nil, true},
		{"kube-apiserver's release of its own allocation", allocation, webhook.KubeAPIServerUser, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fake := fakeclient.New(fakeclient.Options{Objects: tt.services})
			factory := informers.NewSharedInformerFactory(fake, 0)
			h, err := webhook.NewHandler(fake, factory.Networking().V1().IPAddresses(), webhook.HandlerOptions{Services: factory.Core().V1().Services()})
			if err != nil {
				t.Fatal(err)
			}
			factory.Start(t.Context().Done())
			factory.WaitForCacheSync(t.Context().Done())
			t.Cleanup(factory.Shutdown)
			resp := h.Review(t.Context(), deleteReview(t, tt.obj, tt.user))
			if resp.UID != "review-1" {
				t.Errorf("UID = %q, want the request's", resp.UID)
			}
			if resp.Allowed != tt.allowed {
				t.Fatalf("allowed = %v, want %v (result %+v)", resp.Allowed, tt.allowed, resp.Result)
			}
			if !tt.allowed && (resp.Result == nil || resp.Result.Code != http.StatusForbidden || resp.Result.Reason != metav1.StatusReasonForbidden) {
				t.Errorf("refusal = %+v, want 403 Forbidden", resp.Result)
			}
		})
	}
}

func TestControllerKeepsARetainServicesAddressesInPlaceWhenReleasesAreGuarded(t *testing.T) {
	deletedAt := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name        string
		config      *admissionregistrationv1.MutatingWebhookConfiguration
		policy      string
		wantInPlace bool // the allocation is the reservation (same object) before the finalizer goes
	}{
		{"guarded: the allocation becomes the reservation", guardedConfiguration(), "Retain/1h", true},
		{"not guarded: the allocation is left for kube-apiserver's release", webhookConfiguration([]admissionregistrationv1.OperationType{admissionregistrationv1.Create}, notKubeSystem, nil), "Retain/1h", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := testenv.ClusterIPService("web", "10.96.0.20")
			svc.Spec.ClusterIPs = []string{"10.96.0.20"}
			svc.Annotations = map[string]string{reservation.AnnotationReleasePolicy: tt.policy}
			svc.Finalizers = []string{webhook.Finalizer}
			svc.DeletionTimestamp = &metav1.Time{Time: deletedAt}
			alloc := &networkingv1.IPAddress{ObjectMeta: metav1.ObjectMeta{Name: "10.96.0.20", UID: "alloc-uid",
				Labels: map[string]string{networkingv1.LabelManagedBy: "ipallocator.k8s.io", networkingv1.LabelIPAddressFamily: "IPv4"}},
				Spec: networkingv1.IPAddressSpec{ParentRef: &networkingv1.ParentReference{Resource: "services", Namespace: "default", Name: "web"}}}
			fake := fakeclient.New(fakeclient.Options{Objects: []runtime.Object{svc, alloc, optedIn("default", "100"), tt.config}})
			// The order of the writes: the update of the object must come before the patch that
			// removes the finalizer, after which kube-apiserver would release the address.
			var (
				mu     sync.Mutex
				writes []string // guarded by mu
			)
			fake.PrependReactor("*", "*", func(action k8stesting.Action) (bool, runtime.Object, error) {
				switch action.GetVerb() {
				case "create", "update", "patch", "delete":
					mu.Lock()
					writes = append(writes, action.GetVerb()+" "+action.GetResource().Resource)
					mu.Unlock()
				}
				return false, nil, nil
			})
			factory := informers.NewSharedInformerFactory(fake, 0)
			sent, err := webhook.NewSent(factory.Admissionregistration().V1().MutatingWebhookConfigurations(), factory.Core().V1().Namespaces(), "clusterip-reservations")
			if err != nil {
				t.Fatal(err)
			}
			c, err := webhook.NewController(fake, factory.Core().V1().Services(), webhook.ControllerOptions{Sent: sent, Limits: limitsOf(t, factory, false), ReleaseTimeout: 100 * time.Millisecond, PollInterval: time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			ctx := runController(t, factory, c)
			testenv.WaitFor(t, "the finalizer's removal", func() bool {
				return len(finalizersOf(t, fake, "default", "web")) == 0
			})
			obj, err := fake.NetworkingV1().IPAddresses().Get(ctx, "10.96.0.20", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			r, isReservation := reservation.FromObject(obj)
			if !tt.wantInPlace {
				if isReservation {
					t.Errorf("the allocation was turned into a reservation %+v without a guard on its release", r)
				}
				return
			}
			if !isReservation || obj.UID != "alloc-uid" {
				t.Fatalf("10.96.0.20 = %+v, want the allocation's own object turned into a reservation", obj)
			}
			if r.For != (types.NamespacedName{Namespace: "default", Name: "web"}) || !r.Expires.Equal(deletedAt.Add(time.Hour)) {
				t.Errorf("kept for %s until %v, want default/web until %v", r.For, r.Expires, deletedAt.Add(time.Hour))
			}
			mu.Lock()
			defer mu.Unlock()
			upd := slices.Index(writes, "update ipaddresses")
			patch := slices.Index(writes, "patch services")
			if upd < 0 || patch < upd || slices.Contains(writes, "create ipaddresses") || slices.Contains(writes, "delete ipaddresses") {
				t.Errorf("writes = %q, want the IPAddress updated, then the Service's finalizer patched, and no create or delete", writes)
			}
		})
	}
}
