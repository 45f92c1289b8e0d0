package clusterip

import (
	"context"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/ipaddress"
)

// testManagedBy is the Config.ManagedBy of tests whose addresses are held for no Service, so that a
// real kube-apiserver's repair loop leaves their IPAddress objects alone.
const testManagedBy = "clusterip-test"

// TestConfigManagedByLabelsTheIPAddressObjects: the IPAddress objects of an allocation carry
// Config.ManagedBy as their managed-by label, and kube-apiserver's value when it is empty.
func TestConfigManagedByLabelsTheIPAddressObjects(t *testing.T) {
	tests := []struct {
		name, managedBy, want string
	}{
		{name: "default", managedBy: "", want: ipaddress.DefaultManagedBy},
		{name: "own value", managedBy: testManagedBy, want: testManagedBy},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			client := fake.NewSimpleClientset(testenv.ServiceCIDR("kubernetes", "10.96.0.0/24")) //nolint:staticcheck // the simple fake needs no apply configurations
			factory := informers.NewSharedInformerFactory(client, 0)
			a, err := New(ctx, Config{
				Mode:      featuregate.IPAddressOnly,
				Ranges:    []netip.Prefix{netip.MustParsePrefix("10.96.0.0/24")},
				Client:    client,
				Informers: factory,
				ManagedBy: tt.managedBy,
			})
			if err != nil {
				t.Fatalf("New() = %v", err)
			}
			defer a.Close()
			factory.Start(ctx.Done())
			go func() { _ = a.Run(ctx) }()
			testenv.WaitFor(t, "the ServiceCIDR allocator to be ready", a.ServiceCIDRs(corev1.IPv4Protocol).Ready)
			ip := netip.MustParseAddr("10.96.0.10")
			owner := allocator.Owner{Resource: "services", Namespace: "default", Name: "svc"}
			if err := a.For(corev1.IPv4Protocol).Allocate(ctx, ip, owner); err != nil {
				t.Fatalf("Allocate(%s) = %v", ip, err)
			}
			obj, err := client.NetworkingV1().IPAddresses().Get(ctx, ip.String(), metav1.GetOptions{})
			if err != nil {
				t.Fatalf("Get IPAddress %s: %v", ip, err)
			}
			if got := obj.Labels[networkingv1.LabelManagedBy]; got != tt.want {
				t.Errorf("label %s = %q, want %q", networkingv1.LabelManagedBy, got, tt.want)
			}
		})
	}
}
