package webhook_test

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/reservation"
	"github.com/kube-ipam/clusterip/reservation/webhook"
)

// stockHandoutBound is the hand-out bound of these tests: short, so that they wait little, and
// long enough for a create to follow a forged review within it on a loaded machine.
const stockHandoutBound = 8 * time.Second

// stockWithHandouts is a stock kube-apiserver v1.37.2 calling a webhook.Handler with hand-out
// records, served over TLS on 127.0.0.1 by this test process, which runs the webhook.Controller
// that ends them, and a ValidatingAdmissionPolicy that refuses every Service named "doomed":
// a create the webhook patches and that then fails.
type stockWithHandouts struct {
	api    kubernetes.Interface
	res    *reservation.Client
	reg    *prometheus.Registry
	srv    *httptest.Server
	leases func() int // the hand-out records the informer holds
}

// startStockWithHandouts starts it all and waits until kube-apiserver calls the webhook and
// applies the policy.
func startStockWithHandouts(t *testing.T) *stockWithHandouts {
	t.Helper()
	api := testenv.NewKubeAPIServer(t, testenv.NewEtcd(t), testenv.KubeAPIServerOptions{Release: "v1.37.2", ServiceClusterIPRange: "10.96.0.0/24"})
	testenv.WaitForKubernetesService(t, api.Client)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s := &stockWithHandouts{api: api.Client, reg: prometheus.NewRegistry()}
	var err error
	if s.res, err = reservation.New(api.Client); err != nil {
		t.Fatal(err)
	}
	m, err := webhook.NewMetrics(s.reg)
	if err != nil {
		t.Fatal(err)
	}
	factory := informers.NewSharedInformerFactory(api.Client, 0)
	leaseFactory := informers.NewSharedInformerFactoryWithOptions(api.Client, 0, webhook.HandoutInformerOptions(metav1.NamespaceSystem)...)
	leases := leaseFactory.Coordination().V1().Leases()
	handouts, err := webhook.NewHandouts(api.Client, leases, metav1.NamespaceSystem, webhook.HandoutsOptions{Bound: stockHandoutBound})
	if err != nil {
		t.Fatal(err)
	}
	s.leases = func() int { return len(leases.Informer().GetStore().List()) }
	ipas := factory.Networking().V1().IPAddresses()
	h, err := webhook.NewHandler(api.Client, ipas, webhook.HandlerOptions{Metrics: m, Handouts: handouts})
	if err != nil {
		t.Fatal(err)
	}
	ctrl, err := webhook.NewController(api.Client, factory.Core().V1().Services(), webhook.ControllerOptions{Metrics: m, Handouts: handouts})
	if err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	leaseFactory.Start(ctx.Done())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := ctrl.Run(ctx, 1); err != nil {
			t.Errorf("Controller.Run: %v", err)
		}
	}()
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		factory.Shutdown()
		leaseFactory.Shutdown()
	})
	factory.WaitForCacheSync(ctx.Done())
	leaseFactory.WaitForCacheSync(ctx.Done())

	mux := http.NewServeMux()
	mux.Handle("/mutate-services", h)
	s.srv = httptest.NewUnstartedServer(mux)
	s.srv.StartTLS()
	t.Cleanup(s.srv.Close)
	caBundle := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.srv.Certificate().Raw})
	url := s.srv.URL + "/mutate-services"
	fail := admissionregistrationv1.Fail
	sideEffects := admissionregistrationv1.SideEffectClassNoneOnDryRun
	timeout := int32(10)
	cfg := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "clusterip-reservations"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:                    "services.reservations.clusterip.kube-ipam.io",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: caBundle},
			Rules:                   []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update}, Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"services"}}}},
			FailurePolicy:           &fail,
			SideEffects:             &sideEffects,
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          &timeout,
		}},
	}
	if _, err := api.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, cfg, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "no-doomed-services"},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: &fail,
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
					Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"services"}}},
			}}},
			Validations: []admissionregistrationv1.Validation{{Expression: `object.metadata.name != "doomed"`, Message: "no Service may be named doomed"}},
		},
	}
	if _, err := api.Client.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "no-doomed-services"},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: policy.Name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}},
	}
	if _, err := api.Client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Both take effect once kube-apiserver's informers have them: a dry run of a doomed Service
	// with a malformed release policy is refused by the webhook, and one without by the policy.
	testenv.WaitFor(t, "kube-apiserver to call the webhook and apply the policy", func() bool {
		_, errWebhook := api.Client.CoreV1().Services("default").Create(ctx, withPolicy(testenv.ClusterIPService("probe", ""), "Keep"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		_, errPolicy := api.Client.CoreV1().Services("default").Create(ctx, testenv.ClusterIPService("doomed", ""), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return errWebhook != nil && strings.Contains(errWebhook.Error(), reservation.AnnotationReleasePolicy) &&
			errPolicy != nil && strings.Contains(errPolicy.Error(), "no Service may be named doomed")
	})
	return s
}

// reservationAt returns the reservation the API server holds at ip.
func (s *stockWithHandouts) reservationAt(ctx context.Context, ip netip.Addr) (reservation.Reservation, bool) {
	obj, err := s.api.NetworkingV1().IPAddresses().Get(ctx, ip.String(), metav1.GetOptions{})
	if err != nil {
		return reservation.Reservation{}, false
	}
	return reservation.FromObject(obj)
}

// counter returns the value of the counter name.
func (s *stockWithHandouts) counter(t *testing.T, name string) int {
	t.Helper()
	return counterValue(t, s.reg, name)
}

// TestStockKubeAPIServerGetsBackAReservationHandedToAFailedCreate runs the webhook with hand-out
// records beside stock kube-apiserver v1.37.2: a reservation handed to a Service whose create
// then fails (a ValidatingAdmissionPolicy refuses it) is put back within the bound and counted,
// and an address a forged review made the webhook hand out is refused, with kube-apiserver's own
// answer, to another Service that asks for it by spec.clusterIP, and is reserved again after the
// bound.
func TestStockKubeAPIServerGetsBackAReservationHandedToAFailedCreate(t *testing.T) {
	t.Parallel()
	s := startStockWithHandouts(t)
	ctx := context.Background()
	svcs := s.api.CoreV1().Services("default")

	t.Run("a create refused after the webhook patched it: the reservation comes back, counted", func(t *testing.T) {
		doomed := reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.30"), For: types.NamespacedName{Namespace: "default", Name: "doomed"},
			Expires: time.Now().Add(time.Hour).UTC().Truncate(time.Second), Reason: "restored"}
		if err := s.res.Reserve(ctx, doomed); err != nil {
			t.Fatal(err)
		}
		// The webhook hands it out once its informer has the reservation: until then the create
		// is refused by the policy alone, with a dynamic address.
		testenv.WaitFor(t, "the webhook to hand out the reservation", func() bool {
			_, err := svcs.Create(ctx, testenv.ClusterIPService("doomed", ""), metav1.CreateOptions{})
			if err == nil || !strings.Contains(err.Error(), "no Service may be named doomed") {
				t.Fatalf("create doomed: %v, want the policy's refusal", err)
			}
			_, ok := s.reservationAt(ctx, doomed.Addr)
			return !ok
		})
		start := time.Now()
		testenv.WaitFor(t, "the reservation to be put back", func() bool {
			_, ok := s.reservationAt(ctx, doomed.Addr)
			return ok
		})
		t.Logf("put back %v after the hand-out (bound %v)", time.Since(start).Round(time.Millisecond), stockHandoutBound)
		if got, _ := s.reservationAt(ctx, doomed.Addr); got != doomed {
			t.Errorf("the reservation put back = %+v, want %+v", got, doomed)
		}
		if got := s.counter(t, "clusterip_reservation_webhook_handouts_returned_total"); got != 1 {
			t.Errorf("handouts_returned_total = %d, want 1", got)
		}
		testenv.WaitFor(t, "the hand-out record to be deleted", func() bool { return s.leases() == 0 })
	})

	t.Run("a forged review frees nothing another Service can ask for, and the reservation comes back", func(t *testing.T) {
		db := reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.40"), For: types.NamespacedName{Namespace: "prod", Name: "db"}}
		if err := s.res.Reserve(ctx, db); err != nil {
			t.Fatal(err)
		}
		returned := s.counter(t, "clusterip_reservation_webhook_handouts_returned_total")
		testenv.WaitFor(t, "the forged review to be handed the reservation", func() bool {
			return s.forge(t, "prod", "db") != nil
		})
		forged := time.Now()
		if _, ok := s.reservationAt(ctx, db.Addr); ok {
			t.Fatal("the forged review was patched but the reservation is still there")
		}
		// The webhook refuses from its Lease informer, which has the record milliseconds after
		// the write: wait for it, so that the test does not race the informer.
		testenv.WaitFor(t, "the webhook's informer to hold the hand-out record", func() bool { return s.leases() == 1 })
		_, err := svcs.Create(ctx, testenv.ClusterIPService("thief", db.Addr.String()), metav1.CreateOptions{})
		if time.Since(forged) > stockHandoutBound {
			t.Fatalf("the create came %v after the forged review, after the bound %v: the test says nothing", time.Since(forged), stockHandoutBound)
		}
		var status apierrors.APIStatus
		want := `spec.clusterIPs: Invalid value: ["10.96.0.40"]: failed to allocate IP 10.96.0.40: provided IP is already allocated`
		if !errors.As(err, &status) || status.Status().Code != http.StatusUnprocessableEntity || status.Status().Reason != metav1.StatusReasonInvalid ||
			!strings.Contains(err.Error(), "admission webhook") || !strings.Contains(err.Error(), want) {
			t.Errorf("create thief asking for %s: %v, want the webhook's 422 ...%s", db.Addr, err, want)
		}
		if _, err := svcs.Get(ctx, "thief", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("Service thief: %v, want NotFound", err)
		}
		testenv.WaitFor(t, "prod/db's reservation to be put back", func() bool {
			_, ok := s.reservationAt(ctx, db.Addr)
			return ok
		})
		if got, _ := s.reservationAt(ctx, db.Addr); got != db {
			t.Errorf("the reservation put back = %+v, want %+v", got, db)
		}
		if got := s.counter(t, "clusterip_reservation_webhook_handouts_returned_total"); got != returned+1 {
			t.Errorf("handouts_returned_total = %d, want %d", got, returned+1)
		}
		// Put back, the address is refused as every reservation is: by kube-apiserver itself.
		testenv.WaitFor(t, "the hand-out record to be deleted", func() bool { return s.leases() == 0 })
		if _, err := svcs.Create(ctx, testenv.ClusterIPService("thief", db.Addr.String()), metav1.CreateOptions{}); !apierrors.IsInvalid(err) || strings.Contains(err.Error(), "admission webhook") {
			t.Errorf("create thief after the bound: %v, want kube-apiserver's own 422", err)
		}
	})
}

// forge posts a forged review of the create of ns/name asking for no ClusterIP to the handler
// directly, as a Pod that reaches its port could, and returns the patch it answers, if any.
func (s *stockWithHandouts) forge(t *testing.T, ns, name string) []byte {
	t.Helper()
	svc := corev1.Service{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}
	raw, err := json.Marshal(svc)
	if err != nil {
		t.Fatal(err)
	}
	body, err := json.Marshal(admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{UID: "forged-1",
			Kind:      metav1.GroupVersionKind{Version: "v1", Kind: "Service"},
			Resource:  metav1.GroupVersionResource{Version: "v1", Resource: "services"},
			Namespace: ns, Name: name, Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw}}})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := s.srv.Client().Post(s.srv.URL+"/mutate-services", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out admissionv1.AdmissionReview
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || out.Response == nil {
		t.Fatalf("the forged review's answer: %v", err)
	}
	return out.Response.Patch
}
