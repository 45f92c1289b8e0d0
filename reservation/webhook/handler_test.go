package webhook_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/kube-ipam/clusterip/internal/fakeclient"
	"github.com/kube-ipam/clusterip/reservation"
	"github.com/kube-ipam/clusterip/reservation/webhook"
)

// now is the clock of every handler test.
var now = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// reserved returns the object of a reservation of ip for default/web, ending at expires (zero for
// never).
func reserved(t *testing.T, ip string, expires time.Time) runtime.Object {
	t.Helper()
	obj, err := reservation.ObjectFor(reservation.Reservation{Addr: netip.MustParseAddr(ip), For: types.NamespacedName{Namespace: "default", Name: "web"}, Expires: expires})
	if err != nil {
		t.Fatal(err)
	}
	obj.UID = types.UID("uid-" + ip)
	obj.ResourceVersion = "7"
	return obj
}

// service returns the Service default/web of one port, changed by mutate.
func service(mutate func(*corev1.Service)) *corev1.Service {
	svc := &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, Ports: []corev1.ServicePort{{Port: 80}}},
	}
	if mutate != nil {
		mutate(svc)
	}
	return svc
}

// review returns the AdmissionReview of op on svc, a dry run if dryRun.
func review(t *testing.T, op admissionv1.Operation, svc *corev1.Service, dryRun bool) []byte {
	t.Helper()
	raw, err := json.Marshal(svc)
	if err != nil {
		t.Fatal(err)
	}
	ar := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID:       "req-1",
			Kind:      metav1.GroupVersionKind{Version: "v1", Kind: "Service"},
			Resource:  metav1.GroupVersionResource{Version: "v1", Resource: "services"},
			Name:      svc.Name,
			Namespace: svc.Namespace,
			Operation: op,
			Object:    runtime.RawExtension{Raw: raw},
			DryRun:    &dryRun,
		},
	}
	body, err := json.Marshal(ar)
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// newServer returns a webhook server over a fake clientset holding objs, with the IPAddress
// informer synced.
func newServer(t *testing.T, objs ...runtime.Object) (*httptest.Server, *fakeclient.Clientset) {
	t.Helper()
	objs = append([]runtime.Object{optedIn("default", "10")}, objs...) // default may retain
	fake := fakeclient.New(fakeclient.Options{Objects: objs})
	factory := informers.NewSharedInformerFactory(fake, 0)
	ipas := factory.Networking().V1().IPAddresses()
	limits, err := reservation.NewLimits(ipas, factory.Core().V1().Namespaces(), nil)
	if err != nil {
		t.Fatal(err)
	}
	h, err := webhook.NewHandler(fake, ipas, webhook.HandlerOptions{Now: func() time.Time { return now }, Limits: limits})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), ipas.Informer().HasSynced, limits.HasSynced) {
		t.Fatal("the IPAddress informer did not sync")
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv, fake
}

// deleted returns the names of the IPAddresses deleted through fake, in order.
func deleted(fake *fakeclient.Clientset) []string {
	var out []string
	for _, a := range fake.Actions() {
		if d, ok := a.(interface{ GetName() string }); ok && a.GetVerb() == "delete" && a.GetResource().Resource == "ipaddresses" {
			out = append(out, d.GetName())
		}
	}
	return out
}

func TestHandlerHandsReservedAddressesToTheirService(t *testing.T) {
	dual := corev1.IPFamilyPolicyPreferDualStack
	single := corev1.IPFamilyPolicySingleStack
	tests := []struct {
		name        string
		objs        []runtime.Object
		op          admissionv1.Operation
		svc         *corev1.Service
		dryRun      bool
		wantAllowed bool
		wantCode    int32
		wantIPs     []string // spec.clusterIPs the patch sets; nil: no patch
		wantDeleted []string
	}{
		{
			name: "a Service with a reservation gets its address, after the reservation is deleted",
			objs: []runtime.Object{reserved(t, "10.96.0.20", time.Time{})},
			op:   admissionv1.Create, svc: service(nil),
			wantAllowed: true, wantIPs: []string{"10.96.0.20"}, wantDeleted: []string{"10.96.0.20"},
		},
		{
			name: "a reservation that has not ended yet counts",
			objs: []runtime.Object{reserved(t, "10.96.0.20", now.Add(time.Second))},
			op:   admissionv1.Create, svc: service(nil),
			wantAllowed: true, wantIPs: []string{"10.96.0.20"}, wantDeleted: []string{"10.96.0.20"},
		},
		{
			name: "of two reservations of a family the lowest is given",
			objs: []runtime.Object{reserved(t, "10.96.0.30", time.Time{}), reserved(t, "10.96.0.20", time.Time{})},
			op:   admissionv1.Create, svc: service(nil),
			wantAllowed: true, wantIPs: []string{"10.96.0.20"}, wantDeleted: []string{"10.96.0.20"},
		},
		{
			name: "a single-stack Service gets the IPv4 reservation first when it names no family",
			objs: []runtime.Object{reserved(t, "fd00::20", time.Time{}), reserved(t, "10.96.0.20", time.Time{})},
			op:   admissionv1.Create, svc: service(func(s *corev1.Service) { s.Spec.IPFamilyPolicy = &single }),
			wantAllowed: true, wantIPs: []string{"10.96.0.20"}, wantDeleted: []string{"10.96.0.20"},
		},
		{
			name: "a dual-stack Service gets both, in the order of its ipFamilies",
			objs: []runtime.Object{reserved(t, "fd00::20", time.Time{}), reserved(t, "10.96.0.20", time.Time{})},
			op:   admissionv1.Create,
			svc: service(func(s *corev1.Service) {
				s.Spec.IPFamilyPolicy = &dual
				s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol, corev1.IPv4Protocol}
			}),
			wantAllowed: true, wantIPs: []string{"fd00::20", "10.96.0.20"}, wantDeleted: []string{"fd00::20", "10.96.0.20"},
		},
		{
			name: "a Service whose primary family has no reservation gets nothing",
			objs: []runtime.Object{reserved(t, "fd00::20", time.Time{})},
			op:   admissionv1.Create, svc: service(func(s *corev1.Service) { s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol} }),
			wantAllowed: true,
		},
		{
			name: "a dry run is patched but deletes nothing",
			objs: []runtime.Object{reserved(t, "10.96.0.20", time.Time{})},
			op:   admissionv1.Create, svc: service(nil), dryRun: true,
			wantAllowed: true, wantIPs: []string{"10.96.0.20"},
		},
		{
			name:        "a Service with no reservation is allowed unchanged",
			op:          admissionv1.Create,
			svc:         service(nil),
			wantAllowed: true,
		},
		{
			name: "a reservation for another Service is not given",
			objs: []runtime.Object{reserved(t, "10.96.0.20", time.Time{})},
			op:   admissionv1.Create, svc: service(func(s *corev1.Service) { s.Name = "api" }),
			wantAllowed: true,
		},
		{
			name: "an ended reservation is ignored",
			objs: []runtime.Object{reserved(t, "10.96.0.20", now)},
			op:   admissionv1.Create, svc: service(nil),
			wantAllowed: true,
		},
		{
			name: "an ExternalName Service gets nothing",
			objs: []runtime.Object{reserved(t, "10.96.0.20", time.Time{})},
			op:   admissionv1.Create,
			svc: service(func(s *corev1.Service) {
				s.Spec.Type = corev1.ServiceTypeExternalName
				s.Spec.ExternalName = "example.com"
			}),
			wantAllowed: true,
		},
		{
			name: "a headless Service gets nothing",
			objs: []runtime.Object{reserved(t, "10.96.0.20", time.Time{})},
			op:   admissionv1.Create, svc: service(func(s *corev1.Service) { s.Spec.ClusterIP = corev1.ClusterIPNone }),
			wantAllowed: true,
		},
		{
			name: "a Service that asks for an address keeps it",
			objs: []runtime.Object{reserved(t, "10.96.0.20", time.Time{})},
			op:   admissionv1.Create, svc: service(func(s *corev1.Service) { s.Spec.ClusterIPs = []string{"10.96.0.21"} }),
			wantAllowed: true,
		},
		{
			name: "an update gets nothing",
			objs: []runtime.Object{reserved(t, "10.96.0.20", time.Time{})},
			op:   admissionv1.Update, svc: service(nil),
			wantAllowed: true,
		},
		{
			name: "a malformed release policy is denied on create, and nothing is handed out",
			objs: []runtime.Object{reserved(t, "10.96.0.20", time.Time{})},
			op:   admissionv1.Create,
			svc: service(func(s *corev1.Service) {
				s.Annotations = map[string]string{reservation.AnnotationReleasePolicy: "Keep"}
			}),
			wantCode: 422,
		},
		{
			name: "a malformed release policy is denied on update",
			op:   admissionv1.Update,
			svc: service(func(s *corev1.Service) {
				s.Annotations = map[string]string{reservation.AnnotationReleasePolicy: "Retain/0s"}
			}),
			wantCode: 422,
		},
		{
			name: "a well-formed release policy is allowed",
			op:   admissionv1.Update,
			svc: service(func(s *corev1.Service) {
				s.Annotations = map[string]string{reservation.AnnotationReleasePolicy: "Retain/10m"}
			}),
			wantAllowed: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, fake := newServer(t, tt.objs...)
			resp, err := http.Post(srv.URL, "application/json", bytes.NewReader(review(t, tt.op, tt.svc, tt.dryRun)))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("HTTP status = %d, want 200", resp.StatusCode)
			}
			var got admissionv1.AdmissionReview
			if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
				t.Fatal(err)
			}
			r := got.Response
			if r == nil || r.UID != "req-1" {
				t.Fatalf("response = %+v, want one for request req-1", r)
			}
			if r.Allowed != tt.wantAllowed {
				t.Errorf("allowed = %v, want %v (result %+v)", r.Allowed, tt.wantAllowed, r.Result)
			}
			if tt.wantCode != 0 {
				if r.Result == nil || r.Result.Code != tt.wantCode || !bytes.Contains([]byte(r.Result.Message), []byte(reservation.AnnotationReleasePolicy)) {
					t.Errorf("result = %+v, want code %d naming %s", r.Result, tt.wantCode, reservation.AnnotationReleasePolicy)
				}
			}
			var gotIPs []string
			if r.Patch != nil {
				if r.PatchType == nil || *r.PatchType != admissionv1.PatchTypeJSONPatch {
					t.Errorf("patchType = %v, want JSONPatch", r.PatchType)
				}
				var ops []struct {
					Op, Path string
					Value    any
				}
				if err := json.Unmarshal(r.Patch, &ops); err != nil {
					t.Fatalf("patch %s: %v", r.Patch, err)
				}
				for _, op := range ops {
					switch op.Path {
					case "/spec/clusterIPs":
						for _, v := range op.Value.([]any) {
							gotIPs = append(gotIPs, v.(string))
						}
					case "/spec/clusterIP":
						if len(tt.wantIPs) > 0 && op.Value != tt.wantIPs[0] {
							t.Errorf("patch sets spec.clusterIP to %v, want %s", op.Value, tt.wantIPs[0])
						}
					}
				}
			}
			if diff := cmp.Diff(tt.wantIPs, gotIPs); diff != "" {
				t.Errorf("spec.clusterIPs patched (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantDeleted, deleted(fake)); diff != "" {
				t.Errorf("IPAddresses deleted (-want +got):\n%s", diff)
			}
		})
	}
}

func TestHandlerRefusesWhatIsNotAnAdmissionReview(t *testing.T) {
	tests := []struct {
		name, method, body string
		want               int
	}{
		{"a body that is not JSON", http.MethodPost, "{not json", http.StatusBadRequest},
		{"an empty body", http.MethodPost, "", http.StatusBadRequest},
		{"a review without a request", http.MethodPost, `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`, http.StatusBadRequest},
		{"a request of the wrong shape", http.MethodPost, `{"request":{"uid":7}}`, http.StatusBadRequest},
		{"a GET", http.MethodGet, "", http.StatusMethodNotAllowed},
	}
	srv, fake := newServer(t, reserved(t, "10.96.0.20", time.Time{}))
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest(tt.method, srv.URL, bytes.NewBufferString(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tt.want {
				t.Errorf("HTTP status = %d, want %d", resp.StatusCode, tt.want)
			}
		})
	}
	if got := deleted(fake); len(got) != 0 {
		t.Errorf("IPAddresses deleted = %v, want none", got)
	}
}

func TestHandlerAllowsAnObjectThatDoesNotDecodeAndOtherResources(t *testing.T) {
	srv, fake := newServer(t, reserved(t, "10.96.0.20", time.Time{}))
	for _, body := range []string{
		`{"request":{"uid":"u","resource":{"version":"v1","resource":"services"},"operation":"CREATE","namespace":"default","name":"web","object":{"spec":"nope"}}}`,
		`{"request":{"uid":"u","resource":{"version":"v1","resource":"pods"},"operation":"CREATE","namespace":"default","name":"web","object":{}}}`,
		`{"request":{"uid":"u","resource":{"version":"v1","resource":"services"},"operation":"DELETE","namespace":"default","name":"web"}}`,
	} {
		resp, err := http.Post(srv.URL, "application/json", bytes.NewBufferString(body))
		if err != nil {
			t.Fatal(err)
		}
		var got admissionv1.AdmissionReview
		err = json.NewDecoder(resp.Body).Decode(&got)
		resp.Body.Close()
		if err != nil || got.Response == nil || !got.Response.Allowed || got.Response.Patch != nil || got.Response.UID != "u" {
			t.Errorf("%s: response %+v (%v), want allowed, unpatched, uid u", body, got.Response, err)
		}
	}
	if got := deleted(fake); len(got) != 0 {
		t.Errorf("IPAddresses deleted = %v, want none", got)
	}
}
