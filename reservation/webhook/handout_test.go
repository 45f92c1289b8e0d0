package webhook_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"regexp"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admission/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"github.com/kube-ipam/clusterip/internal/fakeclient"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/reservation"
	"github.com/kube-ipam/clusterip/reservation/webhook"
)

// handoutNS is the webhook's namespace in these tests.
const handoutNS = "clusterip-system"

func TestHandoutNameIsOneDNSSubdomainPerAddress(t *testing.T) {
	dns1123 := regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	tests := []struct{ ip, want string }{
		{"10.96.0.10", "clusterip-handout-10-96-0-10"},
		{"::ffff:10.96.0.10", "clusterip-handout-10-96-0-10"},
		{"fd00::10", "clusterip-handout-fd00-0000-0000-0000-0000-0000-0000-0010"},
		{"fd00::", "clusterip-handout-fd00-0000-0000-0000-0000-0000-0000-0000"},
		{"::1", "clusterip-handout-0000-0000-0000-0000-0000-0000-0000-0001"},
	}
	for _, tt := range tests {
		got := webhook.HandoutName(netip.MustParseAddr(tt.ip))
		if got != tt.want {
			t.Errorf("HandoutName(%s) = %q, want %q", tt.ip, got, tt.want)
		}
		if len(got) > 253 || !dns1123.MatchString(got) {
			t.Errorf("HandoutName(%s) = %q, not a DNS-1123 subdomain", tt.ip, got)
		}
	}
	if got := webhook.HandoutName(netip.Addr{}); got != "" {
		t.Errorf("HandoutName(invalid) = %q, want empty", got)
	}
}

// handoutFixture is a fake clientset with a Handler and Handouts over it, their informers synced.
type handoutFixture struct {
	fake     *fakeclient.Clientset
	srv      *httptest.Server
	handouts *webhook.Handouts
	factory  informers.SharedInformerFactory
	leases   informers.SharedInformerFactory
	reg      *prometheus.Registry
	metrics  *webhook.Metrics
	ctx      context.Context
}

// newHandoutFixture builds it on objs, with bound as the Handouts' bound; reactors, if any, are
// prepended to the fake's before anything starts.
func newHandoutFixture(t *testing.T, bound time.Duration, reactors []k8stesting.Reactor, objs ...runtime.Object) *handoutFixture {
	t.Helper()
	f := &handoutFixture{fake: fakeclient.New(fakeclient.Options{Objects: objs}), reg: prometheus.NewRegistry()}
	for _, r := range reactors {
		f.fake.ReactionChain = append([]k8stesting.Reactor{r}, f.fake.ReactionChain...)
	}
	var err error
	if f.metrics, err = webhook.NewMetrics(f.reg); err != nil {
		t.Fatal(err)
	}
	f.factory = informers.NewSharedInformerFactory(f.fake, 0)
	f.leases = informers.NewSharedInformerFactoryWithOptions(f.fake, 0, webhook.HandoutInformerOptions(handoutNS)...)
	if f.handouts, err = webhook.NewHandouts(f.fake, f.leases.Coordination().V1().Leases(), handoutNS, webhook.HandoutsOptions{Bound: bound}); err != nil {
		t.Fatal(err)
	}
	ipas := f.factory.Networking().V1().IPAddresses()
	h, err := webhook.NewHandler(f.fake, ipas, webhook.HandlerOptions{Metrics: f.metrics, Handouts: f.handouts})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	f.ctx = ctx
	f.factory.Start(ctx.Done())
	f.leases.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), ipas.Informer().HasSynced, f.handouts.HasSynced) {
		t.Fatal("the informers did not sync")
	}
	f.fake.WaitWatching(t, "ipaddresses", "leases")
	f.srv = httptest.NewServer(h)
	t.Cleanup(f.srv.Close)
	return f
}

// send posts body to the handler and returns its response.
func (f *handoutFixture) send(t *testing.T, body []byte) *admissionv1.AdmissionResponse {
	t.Helper()
	resp, err := http.Post(f.srv.URL, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out admissionv1.AdmissionReview
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out.Response
}

// writes returns the verbs and resources of the fake's writes, in order, as "create leases".
func writes(fake *fakeclient.Clientset) []string {
	var out []string
	for _, a := range fake.Actions() {
		switch a.GetVerb() {
		case "create", "update", "delete":
			out = append(out, a.GetVerb()+" "+a.GetResource().Resource)
		}
	}
	return out
}

// handoutLease returns the record of a hand-out of r to holder at at, as the Handler writes it.
func handoutLease(t *testing.T, r reservation.Reservation, uid types.UID, holder string, at time.Time) *coordinationv1.Lease {
	t.Helper()
	obj, err := reservation.ObjectFor(r)
	if err != nil {
		t.Fatal(err)
	}
	obj.UID = uid
	data, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	acquired := metav1.NewMicroTime(at)
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: handoutNS, Name: webhook.HandoutName(r.Addr), UID: "lease-" + types.UID(r.Addr.String()),
			Labels: map[string]string{webhook.LabelHandout: "true"}, Annotations: map[string]string{webhook.AnnotationHandoutReservation: string(data)}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, AcquireTime: &acquired},
	}
}

func TestHandlerRecordsAHandoutBeforeItDeletesTheReservation(t *testing.T) {
	f := newHandoutFixture(t, time.Minute, nil, reserved(t, "10.96.0.10", now.Add(time.Hour)))
	resp := f.send(t, review(t, admissionv1.Create, service(nil), false))
	if !resp.Allowed || resp.Patch == nil {
		t.Fatalf("response %+v, want allowed with a patch", resp)
	}
	if diff := cmp.Diff([]string{"create leases", "delete ipaddresses"}, writes(f.fake)); diff != "" {
		t.Errorf("writes (-want +got):\n%s", diff)
	}
	l, err := f.fake.CoordinationV1().Leases(handoutNS).Get(f.ctx, "clusterip-handout-10-96-0-10", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the hand-out record: %v", err)
	}
	if got := *l.Spec.HolderIdentity; got != "default/web" {
		t.Errorf("holderIdentity = %q, want default/web", got)
	}
	if l.Spec.AcquireTime == nil || time.Since(l.Spec.AcquireTime.Time) > time.Minute {
		t.Errorf("acquireTime = %v, want about now", l.Spec.AcquireTime)
	}
	var obj networkingv1.IPAddress
	if err := json.Unmarshal([]byte(l.Annotations[webhook.AnnotationHandoutReservation]), &obj); err != nil {
		t.Fatal(err)
	}
	got, ok := reservation.FromObject(&obj)
	want := reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.10"), For: types.NamespacedName{Namespace: "default", Name: "web"}, Expires: now.Add(time.Hour)}
	if !ok || got != want {
		t.Errorf("the recorded reservation = %+v, %v; want %+v", got, ok, want)
	}

	t.Run("a dry run writes nothing", func(t *testing.T) {
		f := newHandoutFixture(t, time.Minute, nil, reserved(t, "10.96.0.10", time.Time{}))
		if resp := f.send(t, review(t, admissionv1.Create, service(nil), true)); resp.Patch == nil {
			t.Fatalf("response %+v, want a patch", resp)
		}
		if w := writes(f.fake); len(w) != 0 {
			t.Errorf("writes %v, want none", w)
		}
	})
}

func TestHandlerHandsOutNothingWithoutItsRecord(t *testing.T) {
	refuse := &k8stesting.SimpleReactor{Verb: "create", Resource: "leases", Reaction: func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(coordinationv1.Resource("leases"), "", errors.New("no RBAC"))
	}}
	f := newHandoutFixture(t, time.Minute, []k8stesting.Reactor{refuse}, reserved(t, "10.96.0.10", time.Time{}))
	resp := f.send(t, review(t, admissionv1.Create, service(nil), false))
	if !resp.Allowed || resp.Patch != nil {
		t.Errorf("response %+v, want allowed without a patch (a dynamic address)", resp)
	}
	if d := deleted(f.fake); len(d) != 0 {
		t.Errorf("deleted %v, want nothing", d)
	}
}

func TestHandlerRefusesAnAddressHandedOutToAnotherService(t *testing.T) {
	db := reservation.Reservation{Addr: netip.MustParseAddr("10.96.0.10"), For: types.NamespacedName{Namespace: "prod", Name: "db"}}
	f := newHandoutFixture(t, time.Minute, nil, handoutLease(t, db, "uid-1", "prod/db", time.Now()))
	asking := func(ns, name string, ips ...string) *corev1.Service {
		return service(func(s *corev1.Service) {
			s.Namespace, s.Name = ns, name
			s.Spec.ClusterIPs = ips
			if len(ips) > 0 {
				s.Spec.ClusterIP = ips[0]
			}
		})
	}
	const message = `Service "thief" is invalid: spec.clusterIPs: Invalid value: ["10.96.0.10"]: failed to allocate IP 10.96.0.10: provided IP is already allocated`
	tests := []struct {
		name    string
		op      admissionv1.Operation
		svc     *corev1.Service
		old     *corev1.Service
		refused bool
	}{
		{name: "another Service's create asking for it by spec.clusterIPs is refused", op: admissionv1.Create, svc: asking("default", "thief", "10.96.0.10"), refused: true},
		{name: "by spec.clusterIP alone too", op: admissionv1.Create, svc: service(func(s *corev1.Service) { s.Name = "thief"; s.Spec.ClusterIP = "10.96.0.10" }), refused: true},
		{name: "an update that asks for it is refused", op: admissionv1.Update, svc: asking("default", "thief", "10.96.0.10"), old: service(func(s *corev1.Service) { s.Name = "thief"; s.Spec.Type = corev1.ServiceTypeExternalName }), refused: true},
		{name: "the Service it was handed to may ask for it", op: admissionv1.Create, svc: asking("prod", "db", "10.96.0.10")},
		{name: "a Service that already holds it may be updated", op: admissionv1.Update, svc: asking("default", "thief", "10.96.0.10"), old: asking("default", "thief", "10.96.0.10")},
		{name: "another address is not refused", op: admissionv1.Create, svc: asking("default", "thief", "10.96.0.11")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := review(t, tt.op, tt.svc, false)
			if tt.old != nil {
				var ar admissionv1.AdmissionReview
				if err := json.Unmarshal(body, &ar); err != nil {
					t.Fatal(err)
				}
				raw, err := json.Marshal(tt.old)
				if err != nil {
					t.Fatal(err)
				}
				ar.Request.OldObject = runtime.RawExtension{Raw: raw}
				if body, err = json.Marshal(ar); err != nil {
					t.Fatal(err)
				}
			}
			resp := f.send(t, body)
			if !tt.refused {
				if !resp.Allowed {
					t.Errorf("refused: %+v", resp.Result)
				}
				return
			}
			if resp.Allowed || resp.Result == nil {
				t.Fatalf("allowed, want refused")
			}
			if r := resp.Result; r.Code != 422 || r.Reason != metav1.StatusReasonInvalid || r.Message != message ||
				r.Details == nil || len(r.Details.Causes) != 1 || r.Details.Causes[0].Field != "spec.clusterIPs" {
				t.Errorf("refusal %+v, want 422 Invalid at spec.clusterIPs: %s", r, message)
			}
		})
	}
}

// handoutController runs a Controller with f's Handouts over f's fake, and returns its metrics'
// registry.
func (f *handoutFixture) runController(t *testing.T) *prometheus.Registry {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := webhook.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	factory := informers.NewSharedInformerFactory(f.fake, 0)
	c, err := webhook.NewController(f.fake, factory.Core().V1().Services(), webhook.ControllerOptions{Metrics: m, Handouts: f.handouts})
	if err != nil {
		t.Fatal(err)
	}
	runController(t, factory, c)
	return reg
}

func TestControllerEndsHandouts(t *testing.T) {
	web := types.NamespacedName{Namespace: "default", Name: "web"}
	ip := netip.MustParseAddr("10.96.0.10")
	kept := reservation.Reservation{Addr: ip, For: web, Expires: time.Now().Add(time.Hour).UTC(), Reason: "restore"}
	allocation := func(ns, name string) *networkingv1.IPAddress {
		return &networkingv1.IPAddress{ObjectMeta: metav1.ObjectMeta{Name: ip.String(), CreationTimestamp: metav1.Now(),
			Labels: map[string]string{networkingv1.LabelManagedBy: "ipallocator.k8s.io"}},
			Spec: networkingv1.IPAddressSpec{ParentRef: &networkingv1.ParentReference{Resource: "services", Namespace: ns, Name: name}}}
	}
	const bound = 300 * time.Millisecond
	tests := []struct {
		name        string
		record      reservation.Reservation
		bound       time.Duration // the hand-outs' bound; 0 for bound
		objs        []runtime.Object
		controllers int
		want        *reservation.Reservation // the reservation at ip at the end; nil for none
		holder      string                   // else the Service whose allocation is at ip
		returned    int
		lost        int
	}{
		{name: "a Service that never appears: put back after the bound, counted", record: kept, controllers: 1, want: &kept, returned: 1},
		{name: "two controllers put it back once", record: kept, controllers: 2, want: &kept, returned: 1},
		{name: "its Service holds the address: done", record: kept, objs: []runtime.Object{allocation("default", "web"),
			service(func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = ip.String(), []string{ip.String()} })}, controllers: 1, holder: "web"},
		{name: "its Service's allocation, after the bound: done", record: kept, objs: []runtime.Object{allocation("default", "web")}, controllers: 1, holder: "web"},
		{name: "another Service took it in the window: a lost window", record: kept, objs: []runtime.Object{allocation("default", "thief")}, controllers: 1, holder: "thief", lost: 1},
		{name: "another Service shown holding it: a lost window before the bound", record: kept, bound: time.Hour, objs: []runtime.Object{allocation("default", "thief"),
			service(func(s *corev1.Service) {
				s.Name, s.Spec.ClusterIP, s.Spec.ClusterIPs = "thief", ip.String(), []string{ip.String()}
			})}, controllers: 1, holder: "thief", lost: 1},
		{name: "its Service was created again with another address: a lost window, not put back", record: kept, objs: []runtime.Object{
			service(func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.0.20", []string{"10.96.0.20"} })}, controllers: 1, lost: 1},
		{name: "its Service holds only another family's address: put back", record: kept, objs: []runtime.Object{
			service(func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "fd00::20", []string{"fd00::20"} })}, controllers: 1, want: &kept, returned: 1},
		{name: "its Service holds no address (ExternalName): put back", record: kept, objs: []runtime.Object{
			service(func(s *corev1.Service) {
				s.Spec.Type, s.Spec.ClusterIP, s.Spec.ClusterIPs = corev1.ServiceTypeExternalName, "", nil
			})}, controllers: 1, want: &kept, returned: 1},
		{name: "a reservation that has ended is dropped", record: reservation.Reservation{Addr: ip, For: web, Expires: time.Now().Add(-time.Second).UTC()}, controllers: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lease := handoutLease(t, tt.record, "uid-gone", "default/web", time.Now())
			b := bound
			if tt.bound != 0 {
				b = tt.bound
			}
			f := newHandoutFixture(t, b, nil, append([]runtime.Object{lease}, tt.objs...)...)
			var regs []*prometheus.Registry
			for range tt.controllers {
				regs = append(regs, f.runController(t))
			}
			testenv.WaitFor(t, "the hand-out record to be deleted", func() bool {
				_, err := f.fake.CoordinationV1().Leases(handoutNS).Get(f.ctx, lease.Name, metav1.GetOptions{})
				return apierrors.IsNotFound(err)
			})
			obj, err := f.fake.NetworkingV1().IPAddresses().Get(f.ctx, ip.String(), metav1.GetOptions{})
			switch {
			case tt.want != nil:
				if got, ok := reservation.FromObject(obj); err != nil || !ok || got != *tt.want {
					t.Errorf("IPAddress %s = %v, %v; want the reservation %+v", ip, obj, err, *tt.want)
				}
			case tt.holder != "":
				if err != nil || obj.Spec.ParentRef.Name != tt.holder {
					t.Errorf("IPAddress %s = %v, %v; want %s's allocation", ip, obj, err, tt.holder)
				}
			case !apierrors.IsNotFound(err):
				t.Errorf("IPAddress %s = %v, %v; want none", ip, obj, err)
			}
			var returned, lost int
			for _, reg := range regs {
				returned += counterValue(t, reg, "clusterip_reservation_webhook_handouts_returned_total")
				lost += counterValue(t, reg, "clusterip_reservation_webhook_window_lost_total")
			}
			if returned != tt.returned || lost != tt.lost {
				t.Errorf("returned %d, lost %d; want %d, %d", returned, lost, tt.returned, tt.lost)
			}
			var creates int
			for _, a := range f.fake.Actions() {
				if a.GetVerb() == "create" && a.GetResource().Resource == "ipaddresses" {
					creates++
				}
			}
			if tt.want == nil && creates != 0 {
				t.Errorf("%d IPAddress creates, want none", creates)
			}
		})
	}
}

// ipAddressReview returns the AdmissionReview of the CREATE of obj.
func ipAddressReview(t *testing.T, obj *networkingv1.IPAddress) []byte {
	t.Helper()
	raw, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	body, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID:       "req-ip",
			Kind:      metav1.GroupVersionKind{Group: "networking.k8s.io", Version: "v1", Kind: "IPAddress"},
			Resource:  metav1.GroupVersionResource{Group: "networking.k8s.io", Version: "v1", Resource: "ipaddresses"},
			Name:      obj.Name,
			Operation: admissionv1.Create,
			Object:    runtime.RawExtension{Raw: raw},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return body
}

func TestHandlerGuardsAnAddressHandedOut(t *testing.T) {
	ip := netip.MustParseAddr("10.96.0.10")
	web := types.NamespacedName{Namespace: "prod", Name: "web"}
	allocation := func(addr, ns, name string) *networkingv1.IPAddress {
		return &networkingv1.IPAddress{ObjectMeta: metav1.ObjectMeta{Name: addr, Labels: map[string]string{networkingv1.LabelManagedBy: "ipallocator.k8s.io"}},
			Spec: networkingv1.IPAddressSpec{ParentRef: &networkingv1.ParentReference{Resource: "services", Namespace: ns, Name: name}}}
	}
	kept, err := reservation.ObjectFor(reservation.Reservation{Addr: ip, For: web})
	if err != nil {
		t.Fatal(err)
	}
	handedOut := handoutLease(t, reservation.Reservation{Addr: ip, For: web}, "uid-gone", web.String(), time.Now())
	for _, rec := range []struct {
		name  string
		lease *coordinationv1.Lease
	}{{"handed out", handedOut}} {
		tests := []struct {
			name    string
			obj     *networkingv1.IPAddress
			refused bool
		}{
			{name: "the allocation to the Service it is kept for is allowed", obj: allocation(ip.String(), "prod", "web")},
			{name: "another Service's allocation is refused as existing", obj: allocation(ip.String(), "default", "thief"), refused: true},
			{name: "a Service of the same name in another namespace is refused", obj: allocation(ip.String(), "default", "web"), refused: true},
			{name: "its reservation is allowed", obj: kept},
			{name: "another address is allowed", obj: allocation("10.96.0.11", "default", "thief")},
		}
		for _, tt := range tests {
			t.Run(rec.name+"/"+tt.name, func(t *testing.T) {
				f := newHandoutFixture(t, time.Hour, nil, rec.lease.DeepCopy())
				resp := f.send(t, ipAddressReview(t, tt.obj))
				if !tt.refused {
					if !resp.Allowed {
						t.Errorf("refused: %+v", resp.Result)
					}
					return
				}
				want := fmt.Sprintf("ipaddresses.networking.k8s.io %q already exists: the address is kept for Service %s", ip, web)
				if r := resp.Result; resp.Allowed || r == nil || r.Code != http.StatusConflict || r.Reason != metav1.StatusReasonAlreadyExists || r.Message != want ||
					r.Details == nil || r.Details.Name != ip.String() || r.Details.Group != "networking.k8s.io" || r.Details.Kind != "ipaddresses" {
					t.Errorf("response %+v, want 409 AlreadyExists %q", resp.Result, want)
				}
				if len(writes(f.fake)) != 0 {
					t.Errorf("the review wrote %q", writes(f.fake))
				}
			})
		}
	}
}
