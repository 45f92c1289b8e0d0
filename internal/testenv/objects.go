package testenv

import (
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ServiceCIDR returns a ServiceCIDR named name of cidrs, with no conditions: the allocators take
// it for ready, as kube-apiserver's do until its controller says otherwise.
func ServiceCIDR(name string, cidrs ...string) *networkingv1.ServiceCIDR {
	return &networkingv1.ServiceCIDR{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       networkingv1.ServiceCIDRSpec{CIDRs: cidrs},
	}
}

// IPAddress returns an IPAddress named ip (which should be an address in canonical form) whose
// parentRef is the Service namespace/name, with no labels.
func IPAddress(ip, namespace, name string) *networkingv1.IPAddress {
	return &networkingv1.IPAddress{
		ObjectMeta: metav1.ObjectMeta{Name: ip},
		Spec: networkingv1.IPAddressSpec{ParentRef: &networkingv1.ParentReference{
			Resource: "services", Namespace: namespace, Name: name,
		}},
	}
}
