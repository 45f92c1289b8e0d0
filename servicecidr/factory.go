package servicecidr

import (
	"errors"
	"net/netip"

	networkingv1informers "k8s.io/client-go/informers/networking/v1"
	"k8s.io/client-go/kubernetes"
)

// ipaddressFactory builds an ipaddress.Allocator per prefix, sharing client and the IPAddress
// informer.
func ipaddressFactory(client kubernetes.Interface, ips networkingv1informers.IPAddressInformer) allocatorFactory {
	return func(cidr netip.Prefix) (cidrAllocator, error) {
		return nil, errors.New("servicecidr: ipaddress allocator not available yet")
	}
}
