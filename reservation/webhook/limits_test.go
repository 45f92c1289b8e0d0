package webhook_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-ipam/clusterip/internal/fakeclient"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/reservation"
	"github.com/kube-ipam/clusterip/reservation/webhook"
)

// optedIn returns Namespace name annotated max-retained: value ("" for no annotation).
func optedIn(name, value string) *corev1.Namespace {
	ns := namespace(name, nil)
	if value != "" {
		ns.Annotations = map[string]string{reservation.AnnotationMaxRetained: value}
	}
	return ns
}

// limitsOf returns the caps read from factory's IPAddress and Namespace informers, and its
// ServiceCIDR informer if cidrs.
func limitsOf(t *testing.T, factory informers.SharedInformerFactory, cidrs bool) *reservation.Limits {
	t.Helper()
	sc := factory.Networking().V1().ServiceCIDRs()
	if !cidrs {
		sc = nil
	}
	l, err := reservation.NewLimits(factory.Networking().V1().IPAddresses(), factory.Core().V1().Namespaces(), sc)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// labelledCounter returns the value of the counter name with label cap=value in reg, 0 if it has
// not counted.
func labelledCounter(t *testing.T, reg prometheus.Gatherer, name, value string) int {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "cap" && l.GetValue() == value {
					return int(m.GetCounter().GetValue())
				}
			}
		}
	}
	return 0
}

// keptFor returns the object of a reservation of ip kept for Service ns/name.
func keptFor(t *testing.T, ip, ns, name string) runtime.Object {
	t.Helper()
	obj, err := reservation.ObjectFor(reservation.Reservation{Addr: netip.MustParseAddr(ip), For: types.NamespacedName{Namespace: ns, Name: name}})
	if err != nil {
		t.Fatal(err)
	}
	return obj
}

// The handler refuses a Service whose Retain policy its namespace may not have, or would exceed
// its cap with, with kube-apiserver's own 422 Invalid (Forbidden at the release-policy
// annotation, naming the cap), and hands nothing out; an update of a Service that was Retain
// already is let through at the cap.
func TestHandlerRefusesRetainOverTheNamespacesCap(t *testing.T) {
	inTeam := func(name, policy string) *corev1.Service {
		return service(func(s *corev1.Service) {
			s.Namespace, s.Name = "team-a", name
			if policy != "" {
				s.Annotations = map[string]string{reservation.AnnotationReleasePolicy: policy}
			}
		})
	}
	inClosed := service(func(s *corev1.Service) {
		s.Namespace = "closed"
		s.Annotations = map[string]string{reservation.AnnotationReleasePolicy: "Retain"}
	})
	tests := []struct {
		name    string
		op      admissionv1.Operation
		old     *corev1.Service
		svc     *corev1.Service
		wantMsg string // "" for allowed
	}{
		{name: "a new name at the cap", op: admissionv1.Create, svc: inTeam("new", "Retain"),
			wantMsg: `Service "new" is invalid: metadata.annotations[clusterip.kube-ipam.io/release-policy]: Forbidden: namespace "team-a" keeps 1 reserved addresses and may keep 1 (annotation clusterip.kube-ipam.io/max-retained of Namespace "team-a")`},
		{name: "no annotation", op: admissionv1.Create, svc: inClosed,
			wantMsg: `Service "web" is invalid: metadata.annotations[clusterip.kube-ipam.io/release-policy]: Forbidden: namespace "closed" may not retain addresses: its Namespace has no clusterip.kube-ipam.io/max-retained annotation`},
		{name: "the own name claims its reservation back", op: admissionv1.Create, svc: inTeam("a", "Retain")},
		{name: "no policy", op: admissionv1.Create, svc: inTeam("new", "")},
		{name: "an update that makes the policy Retain at the cap", op: admissionv1.Update, old: inTeam("new", ""), svc: inTeam("new", "Retain"),
			wantMsg: `Service "new" is invalid: metadata.annotations[clusterip.kube-ipam.io/release-policy]: Forbidden: namespace "team-a" keeps 1 reserved addresses and may keep 1 (annotation clusterip.kube-ipam.io/max-retained of Namespace "team-a")`},
		{name: "an update of a Retain Service at the cap", op: admissionv1.Update, old: inTeam("new", "Retain"), svc: inTeam("new", "Retain/1h")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, fake := newServer(t, optedIn("team-a", "1"), optedIn("closed", ""), keptFor(t, "10.96.0.30", "team-a", "a"))
			var body map[string]any
			if err := json.Unmarshal(review(t, tt.op, tt.svc, false), &body); err != nil {
				t.Fatal(err)
			}
			if tt.old != nil {
				body["request"].(map[string]any)["oldObject"] = tt.old
			}
			raw, err := json.Marshal(body)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := http.Post(srv.URL, "application/json", bytes.NewReader(raw))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var got admissionv1.AdmissionReview
			if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
				t.Fatal(err)
			}
			r := got.Response
			if tt.wantMsg == "" {
				if r == nil || !r.Allowed {
					t.Fatalf("response %+v, want allowed", r)
				}
				return
			}
			if r == nil || r.Allowed || r.Result == nil || r.Result.Code != 422 || r.Result.Reason != metav1.StatusReasonInvalid || r.Result.Message != tt.wantMsg {
				t.Fatalf("response %+v, want denied with 422 Invalid:\n%s", r, tt.wantMsg)
			}
			if d := r.Result.Details; d == nil || len(d.Causes) != 1 || d.Causes[0].Type != metav1.CauseTypeForbidden ||
				d.Causes[0].Field != "metadata.annotations["+reservation.AnnotationReleasePolicy+"]" {
				t.Errorf("details %+v, want one Forbidden cause at the release-policy annotation", r.Result.Details)
			}
			if len(r.Patch) != 0 || len(deleted(fake)) != 0 {
				t.Errorf("a refused Service was patched (%s) or deleted reservations (%v)", r.Patch, deleted(fake))
			}
		})
	}
}

// At a delete the controller keeps a Retain Service's address only within its namespace's cap
// and its ServiceCIDR's; over either, the address is released, and the refusal counted by cap.
func TestControllerReleasesOverACap(t *testing.T) {
	tests := []struct {
		name     string
		ns       string // the Service's namespace
		cidrCap  string // the ServiceCIDR's max-reserved; "" for none
		wantKept bool
		wantCap  string // the cap counted; "" for none
	}{
		{name: "within both caps", ns: "team-a", cidrCap: "2", wantKept: true},
		{name: "the namespace is at its cap", ns: "full", wantCap: "namespace"},
		{name: "the namespace may not retain", ns: "closed", wantCap: "namespace"},
		{name: "the ServiceCIDR is at its cap", ns: "team-a", cidrCap: "1", wantCap: "servicecidr"},
		{name: "a ServiceCIDR cap that does not parse is none", ns: "team-a", cidrCap: "lots", wantKept: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := testenv.ClusterIPService("web", "10.96.0.20")
			svc.Namespace = tt.ns
			svc.Spec.ClusterIPs = []string{"10.96.0.20"}
			svc.Annotations = map[string]string{reservation.AnnotationReleasePolicy: "Retain"}
			sc := testenv.ServiceCIDR("kubernetes", "10.96.0.0/24")
			if tt.cidrCap != "" {
				sc.Annotations = map[string]string{reservation.AnnotationMaxReserved: tt.cidrCap}
			}
			fake := fakeclient.New(fakeclient.Options{Objects: []runtime.Object{svc, sc,
				optedIn("team-a", "5"), optedIn("full", "1"), optedIn("closed", ""),
				keptFor(t, "10.96.0.30", "full", "other")}})
			reg := prometheus.NewRegistry()
			m, err := webhook.NewMetrics(reg)
			if err != nil {
				t.Fatal(err)
			}
			factory := informers.NewSharedInformerFactory(fake, 0)
			c, err := webhook.NewController(fake, factory.Core().V1().Services(), webhook.ControllerOptions{Metrics: m, ReleaseTimeout: 2 * time.Second, PollInterval: time.Millisecond,
				ServiceCIDRs: factory.Networking().V1().ServiceCIDRs(), Limits: limitsOf(t, factory, true)})
			if err != nil {
				t.Fatal(err)
			}
			ctx := runController(t, factory, c)
			fake.WaitWatching(t, "services")
			factory.WaitForCacheSync(ctx.Done())
			if err := fake.CoreV1().Services(tt.ns).Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			if tt.wantKept {
				if r := waitForReservation(t, ctx, fake, "10.96.0.20"); r.For.String() != tt.ns+"/web" {
					t.Errorf("the reservation is kept for %s, want %s/web", r.For, tt.ns)
				}
				return
			}
			testenv.WaitFor(t, "the refusal to be counted", func() bool {
				return labelledCounter(t, reg, "clusterip_reservation_retain_refused_total", tt.wantCap) == 1
			})
			if obj, err := fake.NetworkingV1().IPAddresses().Get(ctx, "10.96.0.20", metav1.GetOptions{}); err == nil {
				t.Errorf("the address was kept over the cap: %+v", obj)
			}
		})
	}
}

// optIn annotates Namespace ns (creating it if kube-apiserver has not yet) with
// reservation.AnnotationMaxRetained: value.
func optIn(t *testing.T, client kubernetes.Interface, ns, value string) {
	t.Helper()
	nss := client.CoreV1().Namespaces()
	testenv.WaitFor(t, "Namespace "+ns+" to be annotated max-retained="+value, func() bool {
		obj, err := nss.Get(context.Background(), ns, metav1.GetOptions{})
		if err != nil {
			_, err = nss.Create(context.Background(), optedIn(ns, value), metav1.CreateOptions{})
			return err == nil
		}
		if obj.Annotations[reservation.AnnotationMaxRetained] == value {
			return true
		}
		obj = obj.DeepCopy()
		if obj.Annotations == nil {
			obj.Annotations = map[string]string{}
		}
		obj.Annotations[reservation.AnnotationMaxRetained] = value
		_, err = nss.Update(context.Background(), obj, metav1.UpdateOptions{})
		return err == nil
	})
}
