package service_test

import (
	"context"
	"errors"
	"net/netip"
	"regexp"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"

	"github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

// TestNamelessServiceAnswersAsStock creates a Service without a name on a stock kube-apiserver
// of each release and mode, and through the library configured as that release and mode beside
// it: both give the same status code, reason, field and message, up to the address stock names.
// Stock's answer comes from the API server's refusal of the IPAddress its allocator tries to
// create for an owner without a name; so, by release and mode:
//   - v1.33 in IPAddressOnly tries every address, each refused, and answers the full range's 500;
//   - v1.33 in DualWrite takes a bit, then answers 500 with the IPAddress's refusal;
//   - from v1.35, a 422 Invalid at spec.clusterIPs, "failed to allocate IP: " and the refusal.
//
// The library refuses the owner before it writes anything and names the address its allocator
// would have tried.
func TestNamelessServiceAnswersAsStock(t *testing.T) {
	const refusal = `IPAddress\.networking\.k8s\.io "10\.96\.0\.\d+" is invalid: spec\.parentRef\.name: Required value`
	tests := []struct {
		release, emulated string
		mode              featuregate.Mode
		gates             string
		code              int32
		reason            metav1.StatusReason
		field             string
		message           string // a regexp of the whole message
	}{
		{release: "v1.33.13", mode: featuregate.IPAddressOnly, gates: "DisableAllocatorDualWrite=true",
			code: 500, reason: metav1.StatusReasonInternalError,
			message: `^Internal error occurred: failed to allocate a serviceIP: range is full$`},
		{release: "v1.33.13", mode: featuregate.DualWrite,
			code: 500, reason: metav1.StatusReasonInternalError,
			message: `^Internal error occurred: failed to allocate a serviceIP: ` + refusal + `$`},
		{release: "v1.35.4", mode: featuregate.IPAddressOnly,
			code: 422, reason: metav1.StatusReasonInvalid, field: "spec.clusterIPs",
			message: `^Service "" is invalid: spec\.clusterIPs: Invalid value: \[""\]: failed to allocate IP: ` + refusal + `$`},
		{release: "v1.36.3", mode: featuregate.IPAddressOnly,
			code: 422, reason: metav1.StatusReasonInvalid, field: "spec.clusterIPs",
			message: `^Service "" is invalid: spec\.clusterIPs: Invalid value: \[""\]: failed to allocate IP: ` + refusal + `$`},
		{release: "v1.37.2", mode: featuregate.IPAddressOnly,
			code: 422, reason: metav1.StatusReasonInvalid, field: "spec.clusterIPs",
			message: `^Service "" is invalid: spec\.clusterIPs: Invalid value: \[""\]: failed to allocate IP: ` + refusal + `$`},
	}
	for _, tt := range tests {
		t.Run(tt.release+"/"+tt.mode.String(), func(t *testing.T) {
			etcd := testenv.NewEtcd(t)
			api := testenv.NewKubeAPIServer(t, etcd, testenv.KubeAPIServerOptions{
				Release: tt.release, ServiceClusterIPRange: "10.96.0.0/24", FeatureGates: tt.gates})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			nameless := func() *corev1.Service {
				return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default"}, Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}
			}
			_, stockErr := api.Client.CoreV1().Services("default").Create(ctx, nameless(), metav1.CreateOptions{})

			v, err := featuregate.KubeVersion(tt.release[1:], tt.emulated)
			if err != nil {
				t.Fatal(err)
			}
			inf := informers.NewSharedInformerFactory(api.Client, 0)
			cfg := clusterip.Config{Mode: tt.mode, Version: v, Ranges: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/24")},
				Client: api.Client, Informers: inf}
			if tt.mode != featuregate.IPAddressOnly {
				cfg.Bitmaps = etcdstore.Stores{Client: etcd.TestClient(t)}
			}
			a, err := clusterip.New(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			inf.Start(ctx.Done())
			done := make(chan error, 1)
			go func() { done <- a.Run(ctx) }()
			defer func() { cancel(); <-done; inf.Shutdown() }()
			if err := a.WaitReady(ctx); err != nil {
				t.Fatal(err)
			}
			_, libErr := a.Services().Allocate(ctx, nameless(), false)

			re := regexp.MustCompile(tt.message)
			for side, err := range map[string]error{"stock " + tt.release: stockErr, "library as " + tt.release: libErr} {
				var se *apierrors.StatusError
				if !errors.As(err, &se) {
					t.Fatalf("%s: %v, want a StatusError", side, err)
				}
				st := se.Status()
				var field string
				if st.Details != nil && len(st.Details.Causes) == 1 {
					field = st.Details.Causes[0].Field
				}
				if st.Code != tt.code || st.Reason != tt.reason || field != tt.field || !re.MatchString(st.Message) {
					t.Errorf("%s answered %d %s at %q: %q; want %d %s at %q matching %s", side, st.Code, st.Reason, field, st.Message, tt.code, tt.reason, tt.field, tt.message)
				}
			}
		})
	}
}
