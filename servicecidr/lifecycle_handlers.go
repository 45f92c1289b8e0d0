package servicecidr

import (
	"net/netip"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/kube-ipam/clusterip/internal/informerutil"
)

// onServiceCIDR queues a ServiceCIDR that was added or changed, and every ServiceCIDR being deleted:
// a new or newly ready ServiceCIDR may now hold their IPAddresses.
func (c *LifecycleController) onServiceCIDR(obj any) {
	sc, ok := informerutil.ObjectFrom[*networkingv1.ServiceCIDR](obj)
	if !ok {
		return
	}
	c.queue.Add(sc.Name)
	c.enqueueTerminating(func(*networkingv1.ServiceCIDR) bool { return true })
}

// onIPAddress queues the ServiceCIDRs being deleted that contain the IPAddress's address.
func (c *LifecycleController) onIPAddress(obj any) {
	ipa, ok := informerutil.ObjectFrom[*networkingv1.IPAddress](obj)
	if !ok {
		return
	}
	ip, err := netip.ParseAddr(ipa.Name)
	if err != nil {
		return
	}
	c.enqueueTerminating(func(sc *networkingv1.ServiceCIDR) bool { return containsAddr(sc, ip) })
}

func (c *LifecycleController) enqueueTerminating(match func(*networkingv1.ServiceCIDR) bool) {
	list, err := c.cidrLister.List(labels.Everything())
	if err != nil {
		return
	}
	for _, sc := range list {
		if sc.DeletionTimestamp != nil && match(sc) {
			c.queue.Add(sc.Name)
		}
	}
}
