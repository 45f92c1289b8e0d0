package reservation_test

import (
	"net/netip"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-ipam/clusterip/reservation"
)

func TestServed(t *testing.T) {
	cidr := func(name string, deleting bool, prefixes ...string) *networkingv1.ServiceCIDR {
		sc := &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: prefixes}}
		if deleting {
			sc.DeletionTimestamp = &metav1.Time{}
		}
		return sc
	}
	kubernetes := cidr("kubernetes", false, "10.96.0.0/24", "fd00:10:96::/112")
	closing := cidr("closing", true, "10.97.0.0/24")
	tests := []struct {
		name  string
		cidrs []*networkingv1.ServiceCIDR
		ip    string
		want  bool
	}{
		{"an address of a live ServiceCIDR", []*networkingv1.ServiceCIDR{kubernetes}, "10.96.0.20", true},
		{"an IPv6 address of a live ServiceCIDR", []*networkingv1.ServiceCIDR{kubernetes}, "fd00:10:96::14", true},
		{"an IPv4-mapped IPv6 form of a served address", []*networkingv1.ServiceCIDR{kubernetes}, "::ffff:10.96.0.20", true},
		{"outside every ServiceCIDR", []*networkingv1.ServiceCIDR{kubernetes}, "10.98.0.5", false},
		{"the network address", []*networkingv1.ServiceCIDR{kubernetes}, "10.96.0.0", false},
		{"the IPv4 broadcast address", []*networkingv1.ServiceCIDR{kubernetes}, "10.96.0.255", false},
		{"in a ServiceCIDR being deleted", []*networkingv1.ServiceCIDR{kubernetes, closing}, "10.97.0.5", false},
		{"in a ServiceCIDR being deleted and a live one", []*networkingv1.ServiceCIDR{closing, cidr("wide", false, "10.97.0.0/16")}, "10.97.0.5", true},
		{"no ServiceCIDR at all", nil, "10.96.0.20", false},
		{"nil entries are skipped", []*networkingv1.ServiceCIDR{nil, kubernetes}, "10.96.0.20", true},
		{"a CIDR that does not parse serves nothing", []*networkingv1.ServiceCIDR{cidr("bad", false, "10.96.0.0/33")}, "10.96.0.20", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := reservation.Served(tt.cidrs, netip.MustParseAddr(tt.ip)); got != tt.want {
				t.Errorf("Served(%s) = %v, want %v", tt.ip, got, tt.want)
			}
		})
	}
}
