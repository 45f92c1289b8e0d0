package webhook_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/informers"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kube-ipam/clusterip/internal/fakeclient"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/reservation"
	"github.com/kube-ipam/clusterip/reservation/webhook"
)

// other is a finalizer of someone else's.
const other = "example.com/other"

// admitted returns svc as kube-apiserver stores it after the handler's review of op: the
// response's JSONPatch applied with the library kube-apiserver applies it with. It fails t on a
// denied review.
func admitted(t *testing.T, srv string, op admissionv1.Operation, svc *corev1.Service, dryRun bool) (*corev1.Service, bool) {
	t.Helper()
	resp, err := http.Post(srv, "application/json", bytes.NewReader(review(t, op, svc, dryRun)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got admissionv1.AdmissionReview
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	if got.Response == nil || !got.Response.Allowed {
		t.Fatalf("response %+v, want allowed", got.Response)
	}
	if got.Response.Patch == nil {
		return svc, false
	}
	if got.Response.PatchType == nil || *got.Response.PatchType != admissionv1.PatchTypeJSONPatch {
		t.Fatalf("patchType = %v, want JSONPatch", got.Response.PatchType)
	}
	patch, err := jsonpatch.DecodePatch(got.Response.Patch)
	if err != nil {
		t.Fatalf("patch %s: %v", got.Response.Patch, err)
	}
	raw, err := json.Marshal(svc)
	if err != nil {
		t.Fatal(err)
	}
	out, err := patch.Apply(raw)
	if err != nil {
		t.Fatalf("apply patch %s: %v", got.Response.Patch, err)
	}
	var patched corev1.Service
	if err := json.Unmarshal(out, &patched); err != nil {
		t.Fatal(err)
	}
	return &patched, true
}

func TestHandlerAddsTheFinalizerToARetainService(t *testing.T) {
	retain := func(policy string, finalizers ...string) func(*corev1.Service) {
		return func(s *corev1.Service) {
			if policy != "" {
				s.Annotations = map[string]string{reservation.AnnotationReleasePolicy: policy}
			}
			s.Finalizers = finalizers
		}
	}
	deleting := func(s *corev1.Service) { s.DeletionTimestamp = &metav1.Time{Time: now} }
	tests := []struct {
		name           string
		objs           []runtime.Object
		op             admissionv1.Operation
		svc            *corev1.Service
		dryRun         bool
		wantFinalizers []string
		wantIPs        []string // spec.clusterIPs after the patch
	}{
		{name: "a Retain Service created without finalizers gets it", op: admissionv1.Create,
			svc: service(retain("Retain")), wantFinalizers: []string{webhook.Finalizer}},
		{name: "a Retain/<d> Service created with another finalizer gets it after that one", op: admissionv1.Create,
			svc: service(retain("Retain/1h", other)), wantFinalizers: []string{other, webhook.Finalizer}},
		{name: "a Retain Service created with an empty list gets it", op: admissionv1.Create,
			svc: service(retain("Retain", []string{}...)), wantFinalizers: []string{webhook.Finalizer}},
		{name: "a Retain Service handed its reservation gets both in one patch", op: admissionv1.Create,
			objs: []runtime.Object{reserved(t, "10.96.0.20", time.Time{})},
			svc:  service(retain("Retain")), wantFinalizers: []string{webhook.Finalizer}, wantIPs: []string{"10.96.0.20"}},
		{name: "a Retain Service with another finalizer handed its reservation gets both", op: admissionv1.Create,
			objs: []runtime.Object{reserved(t, "10.96.0.20", time.Time{})},
			svc:  service(retain("Retain", other)), wantFinalizers: []string{other, webhook.Finalizer}, wantIPs: []string{"10.96.0.20"}},
		{name: "a dry run is patched the same", op: admissionv1.Create, dryRun: true,
			objs: []runtime.Object{reserved(t, "10.96.0.20", time.Time{})},
			svc:  service(retain("Retain")), wantFinalizers: []string{webhook.Finalizer}, wantIPs: []string{"10.96.0.20"}},
		{name: "a Retain Service updated without it gets it", op: admissionv1.Update,
			svc: service(retain("Retain/10m")), wantFinalizers: []string{webhook.Finalizer}},
		{name: "a Retain Service updated with another finalizer gets it after that one", op: admissionv1.Update,
			svc: service(retain("Retain", other)), wantFinalizers: []string{other, webhook.Finalizer}},
		{name: "a Retain Service that has it is not patched", op: admissionv1.Update,
			svc: service(retain("Retain", other, webhook.Finalizer)), wantFinalizers: []string{other, webhook.Finalizer}},
		{name: "a Retain Service being deleted gets none: kube-apiserver refuses a new finalizer then", op: admissionv1.Update,
			svc: service(func(s *corev1.Service) { retain("Retain", other)(s); deleting(s) }), wantFinalizers: []string{other}},
		{name: "a Service without a release policy gets none", op: admissionv1.Create,
			svc: service(nil)},
		{name: "a Release Service gets none", op: admissionv1.Create,
			svc: service(retain("Release"))},
		{name: "the webhook never removes it, even from a Service no longer Retain", op: admissionv1.Update,
			svc: service(retain("Release", webhook.Finalizer)), wantFinalizers: []string{webhook.Finalizer}},
		{name: "a Retain ExternalName Service gets none: it has no address to keep", op: admissionv1.Create,
			svc: service(func(s *corev1.Service) {
				retain("Retain")(s)
				s.Spec.Type, s.Spec.ExternalName = corev1.ServiceTypeExternalName, "example.com"
			})},
		{name: "a Retain headless Service gets none", op: admissionv1.Create,
			svc: service(func(s *corev1.Service) { retain("Retain")(s); s.Spec.ClusterIP = corev1.ClusterIPNone })},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, _ := newServer(t, tt.objs...)
			got, _ := admitted(t, srv.URL, tt.op, tt.svc, tt.dryRun)
			if diff := cmp.Diff(tt.wantFinalizers, got.Finalizers, cmp.Comparer(func(a, b []string) bool { return slices.Equal(a, b) })); diff != "" {
				t.Errorf("finalizers after the review (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantIPs, got.Spec.ClusterIPs); diff != "" {
				t.Errorf("spec.clusterIPs after the review (-want +got):\n%s", diff)
			}
			if len(tt.wantIPs) > 0 && got.Spec.ClusterIP != tt.wantIPs[0] {
				t.Errorf("spec.clusterIP after the review = %q, want %q", got.Spec.ClusterIP, tt.wantIPs[0])
			}
		})
	}
}

// finalizersOf returns the finalizers of the Service ns/name in fake.
func finalizersOf(t *testing.T, fake *fakeclient.Clientset, ns, name string) []string {
	t.Helper()
	svc, err := fake.CoreV1().Services(ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return svc.Finalizers
}

func TestControllerAddsAndRemovesTheFinalizer(t *testing.T) {
	deletedAt := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name       string
		namespace  string // default unless set
		policy     string // "" for no annotation
		finalizers []string
		deleting   bool
		patchErr   error // the patches of the Service fail with it
		once       bool  // only the first
		want       []string
		wantKept   bool // its address 10.96.0.20 is kept, until deletedAt + 1h
	}{
		{name: "a live Retain Service without it gets it", policy: "Retain/1h",
			want: []string{webhook.Finalizer}},
		{name: "a live Retain Service gets it after the finalizers it has", policy: "Retain/1h", finalizers: []string{other},
			want: []string{other, webhook.Finalizer}},
		{name: "a live Retain Service that has it keeps it", policy: "Retain/1h", finalizers: []string{webhook.Finalizer},
			want: []string{webhook.Finalizer}},
		{name: "a live Retain Service the webhook is not sent gets none", namespace: metav1.NamespaceSystem, policy: "Retain/1h"},
		{name: "a live Service no longer Retain loses it, and only it", policy: "Release", finalizers: []string{other, webhook.Finalizer},
			want: []string{other}},
		{name: "a live Service whose policy no longer parses loses it", policy: "Keep", finalizers: []string{webhook.Finalizer}},
		{name: "a live Service without it and not Retain is left alone", finalizers: []string{other},
			want: []string{other}},
		{name: "a Service being deleted with it alone has its address kept from its deletionTimestamp, and loses it",
			policy: "Retain/1h", finalizers: []string{webhook.Finalizer}, deleting: true, wantKept: true},
		{name: "a Service being deleted loses it after a conflict, tried again",
			policy: "Retain/1h", finalizers: []string{webhook.Finalizer}, deleting: true, wantKept: true,
			patchErr: apierrors.NewConflict(schema.GroupResource{Resource: "services"}, "web", errors.New("the object has been modified")), once: true},
		{name: "a Service being deleted has its address queued before its finalizer goes, even if it cannot go",
			policy: "Retain/1h", finalizers: []string{webhook.Finalizer}, deleting: true, wantKept: true, want: []string{webhook.Finalizer},
			patchErr: apierrors.NewForbidden(schema.GroupResource{Resource: "services"}, "web", errors.New("no patch"))},
		{name: "a Service being deleted with another finalizer too keeps ours until that one goes",
			policy: "Retain/1h", finalizers: []string{other, webhook.Finalizer}, deleting: true,
			want: []string{other, webhook.Finalizer}},
		{name: "a Service being deleted without it is left to its delete event", policy: "Retain/1h", finalizers: []string{other}, deleting: true,
			want: []string{other}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := testenv.ClusterIPService("web", "10.96.0.20")
			svc.Spec.ClusterIPs = []string{"10.96.0.20"}
			svc.ResourceVersion = "5"
			if tt.namespace != "" {
				svc.Namespace = tt.namespace
			}
			if tt.policy != "" {
				svc.Annotations = map[string]string{reservation.AnnotationReleasePolicy: tt.policy}
			}
			svc.Finalizers = tt.finalizers
			if tt.deleting {
				svc.DeletionTimestamp = &metav1.Time{Time: deletedAt}
			}
			// Both namespaces may retain: the caps are another test's.
			fake := fakeclient.New(fakeclient.Options{Objects: []runtime.Object{svc, optedIn("default", "100"), optedIn("kube-system", "100"),
				webhookConfiguration([]admissionregistrationv1.OperationType{admissionregistrationv1.Create}, notKubeSystem, nil)}})
			var failed atomic.Bool
			fake.PrependReactor("patch", "services", func(action k8stesting.Action) (bool, runtime.Object, error) {
				if tt.patchErr != nil && action.(k8stesting.PatchAction).GetName() == "web" && !(tt.once && failed.Swap(true)) {
					return true, nil, tt.patchErr
				}
				if p := string(action.(k8stesting.PatchAction).GetPatch()); !strings.Contains(p, `"resourceVersion":`) {
					t.Errorf("patch %s has no resourceVersion precondition", p)
				}
				return false, nil, nil
			})
			factory := informers.NewSharedInformerFactory(fake, 0)
			sent, err := webhook.NewSent(factory.Admissionregistration().V1().MutatingWebhookConfigurations(), factory.Core().V1().Namespaces(), "clusterip-reservations")
			if err != nil {
				t.Fatal(err)
			}
			c, err := webhook.NewController(fake, factory.Core().V1().Services(), webhook.ControllerOptions{Sent: sent, Limits: limitsOf(t, factory, false), ReleaseTimeout: 2 * time.Second, PollInterval: time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			ctx := runController(t, factory, c)
			fake.WaitWatching(t, "services")
			factory.WaitForCacheSync(ctx.Done())
			if tt.wantKept {
				r := waitForReservation(t, ctx, fake, "10.96.0.20")
				if r.For.String() != svc.Namespace+"/web" || !r.Expires.Equal(deletedAt.Add(time.Hour)) {
					t.Errorf("the reservation is kept for %s until %v, want %s/web until %v (an hour from the deletionTimestamp)", r.For, r.Expires, svc.Namespace, deletedAt.Add(time.Hour))
				}
			}
			// A marker Service the controller gives the finalizer, added after the Service under
			// test: once it has it, the one worker has handled the Service under test.
			marker := testenv.ClusterIPService("marker", "10.96.0.99")
			marker.Annotations = map[string]string{reservation.AnnotationReleasePolicy: "Retain"}
			if _, err := fake.CoreV1().Services("default").Create(ctx, marker, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			testenv.WaitFor(t, "the marker Service's finalizer", func() bool {
				return slices.Contains(finalizersOf(t, fake, "default", "marker"), webhook.Finalizer)
			})
			if tt.once {
				testenv.WaitFor(t, "the finalizer's removal after the failed patch", func() bool {
					return len(finalizersOf(t, fake, svc.Namespace, "web")) == 0
				})
			}
			if got := finalizersOf(t, fake, svc.Namespace, "web"); !slices.Equal(got, tt.want) {
				t.Errorf("finalizers = %q, want %q", got, tt.want)
			}
			if !tt.wantKept {
				if obj, err := fake.NetworkingV1().IPAddresses().Get(ctx, "10.96.0.20", metav1.GetOptions{}); err == nil {
					t.Errorf("the address 10.96.0.20 is kept: %+v", obj)
				}
			}
		})
	}
}
