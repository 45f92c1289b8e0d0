package repair_test

import (
	"context"
	"net/http"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	clusterip "github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/ipaddress"
	"github.com/kube-ipam/clusterip/repair"
)

// TestRepairFollowsTheServicesOfALegacyKubeAPIServer is the skew window of an upgrade: a real
// kube-apiserver v1.33 with MultiCIDRServiceAllocator=false allocates from the bitmap only and
// creates no IPAddress objects, while our DualWrite repair Controller runs beside it with passes
// an hour apart. Each Service the legacy peer creates after the first pass gets its IPAddress
// (named by the ClusterIP, parentRef the Service, managed by ipallocator.k8s.io) within seconds,
// as kube-apiserver's own IPAddress repair loop gives it on the Service's event (a few seconds:
// the follow window after the last pass), and within one pass per Service: a Service that
// already has its object brings no pass forward.
func TestRepairFollowsTheServicesOfALegacyKubeAPIServer(t *testing.T) {
	t.Parallel()
	const flag = "10.96.0.0/24"
	e := testenv.NewEtcd(t)
	api := testenv.NewKubeAPIServer(t, e, testenv.KubeAPIServerOptions{
		ServiceClusterIPRange: flag,
		FeatureGates:          "MultiCIDRServiceAllocator=false",
	})
	ctx := t.Context()
	services := api.Client.CoreV1().Services(metav1.NamespaceDefault)
	ipas := api.Client.NetworkingV1().IPAddresses()
	testenv.WaitForKubernetesService(t, api.Client)
	// The legacy peer creates no default ServiceCIDR; a cluster being moved to DualWrite has one.
	if _, err := api.Client.NetworkingV1().ServiceCIDRs().Create(ctx, &networkingv1.ServiceCIDR{
		ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"},
		Spec:       networkingv1.ServiceCIDRSpec{CIDRs: []string{flag}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ServiceCIDR kubernetes: %v", err)
	}

	// Repair's client counts its passes by their list of Services.
	var passes atomic.Int32
	rc := rest.CopyConfig(api.Config)
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
			if req.Method == http.MethodGet && req.URL.Path == "/api/v1/services" && req.URL.Query().Get("watch") == "" {
				passes.Add(1)
			}
			return rt.RoundTrip(req)
		})
	})
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	factory := informers.NewSharedInformerFactory(api.Client, 0)
	cfg := clusterip.Config{
		Mode:   featuregate.DualWrite,
		Ranges: []netip.Prefix{netip.MustParsePrefix(flag)},
		Client: client, Bitmaps: etcdstore.Stores{Client: e.TestClient(t)}, Informers: factory,
	}
	rec := &recorder{}
	c, err := repair.NewController(cfg, repair.Options{Interval: time.Hour, Recorder: rec})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run() = %v, want nil after cancel", err)
		}
		factory.Shutdown()
	})
	factory.Start(runCtx.Done())
	go func() { done <- c.Run(runCtx) }()
	select {
	case <-c.FirstPass():
	case <-time.After(testenv.WaitTimeout):
		t.Fatal("the repair Controller's first pass did not succeed")
	}
	testenv.WaitFor(t, "the kubernetes Service's IPAddress, created by the first pass", func() bool {
		_, err := ipas.Get(ctx, "10.96.0.1", metav1.GetOptions{})
		return err == nil
	})
	base := passes.Load()

	var followed []string
	for _, name := range []string{"peer-a", "peer-b", "peer-c"} {
		svc, err := services.Create(ctx, testenv.ClusterIPService(name, ""), metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("the legacy peer creates Service %s: %v", name, err)
		}
		ip := svc.Spec.ClusterIP
		followed = append(followed, ip)
		var got *networkingv1.IPAddress
		testenv.WaitFor(t, "the IPAddress "+ip+" of Service "+name, func() bool {
			got, err = ipas.Get(ctx, ip, metav1.GetOptions{})
			if err != nil && !apierrors.IsNotFound(err) {
				t.Fatalf("get IPAddress %s: %v", ip, err)
			}
			return err == nil
		})
		ref := got.Spec.ParentRef
		if ref == nil || ref.Resource != "services" || ref.Namespace != metav1.NamespaceDefault || ref.Name != name {
			t.Errorf("IPAddress %s: parentRef %+v, want services default/%s", ip, ref, name)
		}
		if m := got.Labels["ipaddress.kubernetes.io/managed-by"]; m != "ipallocator.k8s.io" {
			t.Errorf("IPAddress %s: managed-by %q, want ipallocator.k8s.io", ip, m)
		}
	}
	// Each followed Service costs at most one pass: a pass may find the next Service's too.
	if got := passes.Load() - base; got < 1 || got > 3 {
		t.Errorf("the Controller made %d passes for the 3 followed Services, want 1 to 3", got)
	}

	// A Service that comes with its IPAddress (ours allocated it) brings no pass forward.
	before := passes.Load()
	ip := unheld("10.96.0.200", followed, 1)[0]
	if _, err := ipas.Create(ctx, ipaddress.ObjectFor(netip.MustParseAddr(ip),
		allocator.Owner{Resource: "services", Namespace: "default", Name: "with-object"}, ipaddress.DefaultManagedBy), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := services.Create(ctx, testenv.ClusterIPService("with-object", ip), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create Service with-object: %v", err)
	}
	time.Sleep(3 * time.Second) // three times the follow delay
	if got := passes.Load() - before; got != 0 {
		t.Errorf("the Controller made %d passes after a Service came with its IPAddress, want none", got)
	}
	for _, ev := range rec.Got() {
		t.Logf("Event: %s", ev)
	}
}
