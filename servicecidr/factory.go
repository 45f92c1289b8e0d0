package servicecidr

import (
	"net/netip"

	networkingv1informers "k8s.io/client-go/informers/networking/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/kube-ipam/clusterip/ipaddress"
)

// ipaddressFactory builds an ipaddress.Allocator per prefix, sharing client and the IPAddress
// informer.
func ipaddressFactory(client kubernetes.Interface, ips networkingv1informers.IPAddressInformer, opts []ipaddress.Option) allocatorFactory {
	return func(logger klog.Logger, cidr netip.Prefix) (cidrAllocator, error) {
		all := append([]ipaddress.Option{ipaddress.WithLogger(logger)}, opts...)
		return ipaddress.New(cidr, client, ips, all...)
	}
}
