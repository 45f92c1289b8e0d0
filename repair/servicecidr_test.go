package repair

import (
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	clusterip "github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

// TestRepairTreatsAddressesOfATerminatingServiceCIDRAsInRange: while a ServiceCIDR is being
// removed (deletionTimestamp set, Ready=False, held by its finalizer while Services use it),
// kube-apiserver v1.33's repair still counts its addresses in range. Ours must too: a healthy
// Service in it gets no "please recreate Service" Event, and a missing IPAddress is created.
func TestRepairTreatsAddressesOfATerminatingServiceCIDRAsInRange(t *testing.T) {
	tests := []struct {
		name       string
		cidr       func() *networkingv1.ServiceCIDR
		wantEvents []string
	}{
		{name: "terminating", cidr: func() *networkingv1.ServiceCIDR { return deleting(notReady(testenv.ServiceCIDR("old", "10.1.0.0/24"))) },
			wantEvents: []string{"Warning ClusterIPNotAllocated missing"}},
		{name: "Ready=False", cidr: func() *networkingv1.ServiceCIDR { return notReady(testenv.ServiceCIDR("old", "10.1.0.0/24")) },
			wantEvents: []string{"Warning ClusterIPNotAllocated missing"}},
		{name: "being deleted, Ready=True still", cidr: func() *networkingv1.ServiceCIDR { return deleting(testenv.ServiceCIDR("old", "10.1.0.0/24")) },
			wantEvents: []string{"Warning ClusterIPNotAllocated missing"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client := fake.NewClientset([]runtime.Object{
				testenv.ServiceCIDR("kubernetes", "10.0.0.0/24"), tt.cidr(),
				svc("a/healthy", "10.1.0.10"), aged(ipAddr("10.1.0.10", "a/healthy"), time.Hour),
				svc("a/missing", "10.1.0.11"),
			}...)
			cfg := clusterip.Config{Mode: featuregate.IPAddressOnly, Ranges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}, Client: client}
			rep, err := Audit(t.Context(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([]Finding{f("10.1.0.11", Missing, "a/missing")}, rep.Findings, ignoreDetail); diff != "" {
				t.Errorf("Audit() findings (-want +got):\n%s", diff)
			}
			rec := &recorder{}
			c, err := NewController(cfg, Options{Recorder: rec})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.RunOnce(t.Context()); err != nil {
				t.Fatalf("RunOnce() error = %v", err)
			}
			if diff := cmp.Diff(tt.wantEvents, rec.Got(), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("Events (-want +got):\n%s", diff)
			}
			if _, err := client.NetworkingV1().IPAddresses().Get(t.Context(), "10.1.0.11", metav1.GetOptions{}); err != nil {
				t.Errorf("IPAddress of Service a/missing after a pass: %v, want it created", err)
			}
			if rep, err = Audit(t.Context(), cfg); err != nil || !rep.Consistent {
				t.Errorf("Audit() after a pass: %+v, %v; want consistent", rep, err)
			}
		})
	}
}
