package ipaddress

import (
	"net/netip"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-ipam/clusterip/allocator"
)

// ObjectFor returns the IPAddress object that records ip for owner, as kube-apiserver's Service
// IP allocator writes it: named after the canonical address, labelled with ip's IP family and
// with managed-by managedBy (DefaultManagedBy if empty), and with the parentRef ParentRefFor
// gives. It is the object an Allocator creates, and the one package repair creates for a
// Service's address that has none. ip must be valid; ObjectFor does not check it.
func ObjectFor(ip netip.Addr, owner allocator.Owner, managedBy string) *networkingv1.IPAddress {
	if managedBy == "" {
		managedBy = DefaultManagedBy
	}
	return &networkingv1.IPAddress{
		ObjectMeta: metav1.ObjectMeta{
			Name: ip.String(),
			Labels: map[string]string{
				networkingv1.LabelIPAddressFamily: string(allocator.FamilyOf(ip)),
				networkingv1.LabelManagedBy:       managedBy,
			},
		},
		Spec: networkingv1.IPAddressSpec{ParentRef: ParentRefFor(owner)},
	}
}

// ParentRefFor returns the parentRef of the IPAddress object of an address owner holds: its
// group, resource, namespace and name. The UID is not recorded; IPAddress parentRefs have none.
func ParentRefFor(owner allocator.Owner) *networkingv1.ParentReference {
	return &networkingv1.ParentReference{
		Group:     owner.Group,
		Resource:  owner.Resource,
		Namespace: owner.Namespace,
		Name:      owner.Name,
	}
}

// HasParent reports whether obj's parentRef names owner, as ParentRefFor writes it; an object
// without a parentRef has no parent, and owner's UID is not compared.
func HasParent(obj *networkingv1.IPAddress, owner allocator.Owner) bool {
	return obj.Spec.ParentRef != nil && *obj.Spec.ParentRef == *ParentRefFor(owner)
}
