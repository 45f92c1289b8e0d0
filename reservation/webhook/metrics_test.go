package webhook_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/kube-ipam/clusterip/internal/fakeclient"
	"github.com/kube-ipam/clusterip/reservation"
	"github.com/kube-ipam/clusterip/reservation/webhook"
)

// admissionCounts returns clusterip_reservation_webhook_admission_requests_total by result and
// the sample count of clusterip_reservation_webhook_admission_duration_seconds by result, from reg.
func admissionCounts(t *testing.T, reg *prometheus.Registry) (requests, timed map[string]int) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	requests, timed = map[string]int{}, map[string]int{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			result := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" {
					result = l.GetValue()
				}
			}
			switch mf.GetName() {
			case "clusterip_reservation_webhook_admission_requests_total":
				requests[result] = int(m.GetCounter().GetValue())
			case "clusterip_reservation_webhook_admission_duration_seconds":
				timed[result] = int(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return requests, timed
}

// TestHandlerCountsAdmissionRequestsByResult sends the Handler one request of each result and
// checks that each is counted, and timed, under its result, with every result present from the
// start.
func TestHandlerCountsAdmissionRequestsByResult(t *testing.T) {
	fake := fakeclient.New(fakeclient.Options{Objects: append([]runtime.Object{optedIn("default", "10")}, reserved(t, "10.96.0.10", time.Time{}))})
	factory := informers.NewSharedInformerFactory(fake, 0)
	ipas := factory.Networking().V1().IPAddresses()
	limits, err := reservation.NewLimits(ipas, factory.Core().V1().Namespaces(), nil)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m, err := webhook.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	h, err := webhook.NewHandler(fake, ipas, webhook.HandlerOptions{Now: func() time.Time { return now }, Limits: limits, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), ipas.Informer().HasSynced, limits.HasSynced) {
		t.Fatal("the informers did not sync")
	}
	srv := httptest.NewServer(h)
	defer srv.Close()

	want := map[string]int{"allowed": 0, "patched": 0, "refused": 0, "error": 0}
	if got, _ := admissionCounts(t, reg); !cmp.Equal(got, want) {
		t.Fatalf("before any request: %v, want every result at zero", got)
	}
	malformed := service(func(s *corev1.Service) {
		s.Annotations = map[string]string{reservation.AnnotationReleasePolicy: "Keep"}
	})
	other := service(func(s *corev1.Service) { s.Name = "other" })
	tests := []struct {
		name   string
		method string
		body   []byte
		result string
	}{
		{"a Service without a reservation is allowed unchanged", http.MethodPost, review(t, admissionv1.Create, other, false), "allowed"},
		{"a Service with a reservation is patched", http.MethodPost, review(t, admissionv1.Create, service(nil), true), "patched"},
		{"a malformed release policy is refused", http.MethodPost, review(t, admissionv1.Create, malformed, false), "refused"},
		{"a GET is an error", http.MethodGet, nil, "error"},
		{"a body that is not a review is an error", http.MethodPost, []byte("{"), "error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest(tt.method, srv.URL, bytes.NewReader(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			want[tt.result]++
			requests, timed := admissionCounts(t, reg)
			if diff := cmp.Diff(want, requests); diff != "" {
				t.Errorf("admission_requests_total by result (-want +got):\n%s", diff)
			}
			if timed[tt.result] != want[tt.result] {
				t.Errorf("admission_duration_seconds{result=%q} count = %d, want %d", tt.result, timed[tt.result], want[tt.result])
			}
		})
	}
}
