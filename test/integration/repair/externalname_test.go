package repair_test

import (
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	clusterip "github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/repair"
)

// TestRepairHoldsTheIPAddressOfAnExternalNameServiceForAMinute runs repair passes beside a real
// kube-apiserver v1.37.2 on an IPAddress whose parentRef names a Service still of type
// ExternalName: kube-apiserver creates the IPAddress of an update from ExternalName to a type
// with a ClusterIP before it stores the Service, so repair holds such an object for 60 s from its
// creation, with no leak grace at all (kubernetes#135503), while an IPAddress naming a ClusterIP
// Service that holds another address goes after the 5 s of kubernetes#132321. The objects carry
// a managed-by label of the test's own (Config.ManagedBy), which kube-apiserver's own repair
// leaves alone, so what goes is what clusterip's repair deleted.
func TestRepairHoldsTheIPAddressOfAnExternalNameServiceForAMinute(t *testing.T) {
	t.Parallel()
	const managedBy = "clusterip-repair-test"
	api := testenv.NewKubeAPIServer(t, testenv.NewEtcd(t), testenv.KubeAPIServerOptions{Release: "v1.37.2", ServiceClusterIPRange: "10.96.0.0/24"})
	ctx := t.Context()
	testenv.WaitForKubernetesService(t, api.Client)
	services := api.Client.CoreV1().Services(metav1.NamespaceDefault)
	ext := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "ext", Namespace: metav1.NamespaceDefault},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "example.com"}}
	if _, err := services.Create(ctx, ext, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	other, err := services.Create(ctx, testenv.ClusterIPService("other", ""), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// CreationTimestamps count whole seconds: the seeds must be a second newer than the Services.
	time.Sleep(1100 * time.Millisecond)
	seeds := unheld("10.96.0.200", other.Spec.ClusterIPs, 2)
	extIP, wrongIP := seeds[0], seeds[1]
	ipas := api.Client.NetworkingV1().IPAddresses()
	for ip, parent := range map[string]string{extIP: "ext", wrongIP: "other"} {
		o := testenv.IPAddress(ip, metav1.NamespaceDefault, parent)
		o.Labels = map[string]string{networkingv1.LabelManagedBy: managedBy, networkingv1.LabelIPAddressFamily: string(corev1.IPv4Protocol)}
		if _, err := ipas.Create(ctx, o, metav1.CreateOptions{}); err != nil {
			t.Fatalf("seed IPAddress %s for Service %s: %v", ip, parent, err)
		}
	}
	created := time.Now()

	c, err := repair.NewController(clusterip.Config{Mode: featuregate.IPAddressOnly, Ranges: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/24")},
		Client: api.Client, ManagedBy: managedBy}, repair.Options{LeakGrace: -1})
	if err != nil {
		t.Fatal(err)
	}
	exists := func(ip string) bool {
		_, err := ipas.Get(ctx, ip, metav1.GetOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		return err == nil
	}
	passAt := func(after time.Duration) {
		t.Helper()
		time.Sleep(time.Until(created.Add(after)))
		if _, err := c.RunOnce(ctx); err != nil {
			t.Fatalf("repair pass %v after the seeds: %v", after, err)
		}
	}
	tests := []struct {
		after            time.Duration
		wantExt, wantOld bool
	}{
		{after: 0, wantExt: true, wantOld: true},
		{after: 6 * time.Second, wantExt: true, wantOld: false},
		{after: 50 * time.Second, wantExt: true, wantOld: false},
		{after: 62 * time.Second, wantExt: false, wantOld: false},
	}
	for _, tt := range tests {
		passAt(tt.after)
		if got := exists(extIP); got != tt.wantExt {
			t.Errorf("%v after: the IPAddress of the ExternalName Service exists = %v, want %v", tt.after, got, tt.wantExt)
		}
		if got := exists(wrongIP); got != tt.wantOld {
			t.Errorf("%v after: the IPAddress naming a ClusterIP Service that holds another address exists = %v, want %v", tt.after, got, tt.wantOld)
		}
	}
}
