package service_test

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"

	"github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

// TestNamelessServiceAnswersAsStockV137 creates a Service without a name on a stock
// kube-apiserver v1.37.2 and through the library configured as v1.37.2 beside it: both answer 422
// Invalid at spec.clusterIPs, showing the requested clusterIPs as [""], with "failed to allocate
// IP: " and the reason. The reason's text differs on purpose: stock's is the API server's refusal
// of the IPAddress it tried to create (naming a random address), the library refuses the owner
// without a name before it writes anything.
func TestNamelessServiceAnswersAsStockV137(t *testing.T) {
	api := testenv.NewKubeAPIServer(t, testenv.NewEtcd(t), testenv.KubeAPIServerOptions{Release: "v1.37.2", ServiceClusterIPRange: "10.96.0.0/24"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	nameless := func() *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default"}, Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}
	}
	_, stockErr := api.Client.CoreV1().Services("default").Create(ctx, nameless(), metav1.CreateOptions{})

	v, err := featuregate.KubeVersion("1.37.2", "")
	if err != nil {
		t.Fatal(err)
	}
	inf := informers.NewSharedInformerFactory(api.Client, 0)
	a, err := clusterip.New(ctx, clusterip.Config{Mode: featuregate.IPAddressOnly, Version: v,
		Ranges: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/24")}, Client: api.Client, Informers: inf})
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

	const prefix = `Service "" is invalid: spec.clusterIPs: Invalid value: [""]: failed to allocate IP: `
	for side, err := range map[string]error{"stock v1.37.2": stockErr, "library as v1.37.2": libErr} {
		var se *apierrors.StatusError
		if !errors.As(err, &se) {
			t.Fatalf("%s: %v, want a StatusError", side, err)
		}
		st := se.Status()
		if st.Code != 422 || st.Reason != metav1.StatusReasonInvalid || !strings.HasPrefix(st.Message, prefix) ||
			st.Details == nil || len(st.Details.Causes) != 1 || st.Details.Causes[0].Field != "spec.clusterIPs" {
			t.Errorf("%s answered %d %s %q %+v; want 422 Invalid at spec.clusterIPs beginning %q", side, st.Code, st.Reason, st.Message, st.Details, prefix)
		}
	}
}
