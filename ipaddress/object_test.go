package ipaddress_test

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/ipaddress"
)

func TestObjectForIsKubeAPIServersObject(t *testing.T) {
	owner := allocator.Owner{Resource: "services", Namespace: "default", Name: "web", UID: "u1"}
	tests := []struct {
		name      string
		ip        string
		managedBy string
		want      *networkingv1.IPAddress
	}{
		{"IPv4, default managed-by", "10.96.0.10", "", &networkingv1.IPAddress{
			ObjectMeta: metav1.ObjectMeta{Name: "10.96.0.10", Labels: map[string]string{
				networkingv1.LabelIPAddressFamily: "IPv4", networkingv1.LabelManagedBy: ipaddress.DefaultManagedBy}},
			Spec: networkingv1.IPAddressSpec{ParentRef: &networkingv1.ParentReference{Resource: "services", Namespace: "default", Name: "web"}},
		}},
		{"IPv6, canonical name", "fd00:0::a", "example.com/ipam", &networkingv1.IPAddress{
			ObjectMeta: metav1.ObjectMeta{Name: "fd00::a", Labels: map[string]string{
				networkingv1.LabelIPAddressFamily: "IPv6", networkingv1.LabelManagedBy: "example.com/ipam"}},
			Spec: networkingv1.IPAddressSpec{ParentRef: &networkingv1.ParentReference{Resource: "services", Namespace: "default", Name: "web"}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ipaddress.ObjectFor(netip.MustParseAddr(tt.ip), owner, tt.managedBy)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ObjectFor() (-want +got):\n%s", diff)
			}
			if !ipaddress.HasParent(got, owner) {
				t.Errorf("HasParent(ObjectFor(owner), owner) = false, want true")
			}
			other := owner
			other.Name = "db"
			if ipaddress.HasParent(got, other) {
				t.Errorf("HasParent(ObjectFor(owner), other) = true, want false")
			}
		})
	}
	if ipaddress.HasParent(&networkingv1.IPAddress{}, owner) {
		t.Errorf("HasParent(no parentRef) = true, want false")
	}
}
