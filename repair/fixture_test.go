package repair

import (
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/ipaddress"
)

// svc returns a ClusterIP Service "namespace/name" holding ips.
func svc(key string, ips ...string) *corev1.Service {
	ns, name, _ := strings.Cut(key, "/")
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIPs: ips},
	}
	if len(ips) > 0 {
		s.Spec.ClusterIP = ips[0]
	}
	return s
}

// ipAddr returns the IPAddress object of ip, labelled as the Service IP allocator labels it (its
// IP family, if ip parses, and managed-by), whose parent is the Service "namespace/name" (no
// parentRef if parent is empty).
func ipAddr(ip, parent string) *networkingv1.IPAddress {
	a := &networkingv1.IPAddress{ObjectMeta: metav1.ObjectMeta{Name: ip, Labels: map[string]string{
		networkingv1.LabelManagedBy: ipaddress.DefaultManagedBy,
	}}}
	if addr, err := netip.ParseAddr(ip); err == nil {
		a.Labels[networkingv1.LabelIPAddressFamily] = string(allocator.FamilyOf(addr))
	}
	if parent != "" {
		ns, name, _ := strings.Cut(parent, "/")
		a.Spec.ParentRef = &networkingv1.ParentReference{Resource: "services", Namespace: ns, Name: name}
	}
	return a
}

// managedBy sets the managed-by label of ipa to v.
func managedBy(ipa *networkingv1.IPAddress, v string) *networkingv1.IPAddress {
	ipa.Labels[networkingv1.LabelManagedBy] = v
	return ipa
}

// foreign marks ipa as managed by another controller than the Service IP allocator.
func foreign(ipa *networkingv1.IPAddress) *networkingv1.IPAddress {
	ipa.Labels[networkingv1.LabelManagedBy] = "gateway.example.com"
	return ipa
}

// withLabel sets ipa's label key to value, or removes it if value is empty.
func withLabel(ipa *networkingv1.IPAddress, key, value string) *networkingv1.IPAddress {
	if value == "" {
		delete(ipa.Labels, key)
	} else {
		ipa.Labels[key] = value
	}
	return ipa
}

// notReady marks sc Ready=False.
func notReady(sc *networkingv1.ServiceCIDR) *networkingv1.ServiceCIDR {
	sc.Status.Conditions = []metav1.Condition{{Type: networkingv1.ServiceCIDRConditionReady, Status: metav1.ConditionFalse, Reason: "Terminating"}}
	return sc
}

// deleting gives sc a deletionTimestamp.
func deleting(sc *networkingv1.ServiceCIDR) *networkingv1.ServiceCIDR {
	now := metav1.Now()
	sc.DeletionTimestamp = &now
	return sc
}

// bits returns a bitmap of cidr with ips set.
func bits(t testing.TB, cidr string, ips ...string) *bitmap.Allocator {
	t.Helper()
	b, err := bitmap.New(netip.MustParsePrefix(cidr))
	if err != nil {
		t.Fatal(err)
	}
	for _, ip := range ips {
		if err := b.Allocate(t.Context(), netip.MustParseAddr(ip), allocator.Owner{}); err != nil {
			t.Fatalf("set bit %s in %s: %v", ip, cidr, err)
		}
	}
	return b
}
