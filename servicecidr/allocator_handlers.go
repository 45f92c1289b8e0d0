package servicecidr

import (
	"fmt"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/kube-ipam/clusterip/internal/informerutil"
)

// syncAllKey is the only key of the Allocator's queue: every change reconciles every prefix.
const syncAllKey = "all"

// handlers turns ServiceCIDR events into work: adds and updates queue a sync of every prefix,
// deletes drop the ServiceCIDR's hold at once. Events of ServiceCIDRs with no prefix of the family
// are ignored.
func (a *Allocator) handlers(logger klog.Logger) cache.ResourceEventHandler {
	mine := func(obj any) bool {
		sc, ok := informerutil.ObjectFrom[*networkingv1.ServiceCIDR](obj)
		return ok && len(a.prefixesOf(logger, sc)) > 0
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if mine(obj) {
				a.queue.Add(syncAllKey)
			}
		},
		UpdateFunc: func(old, cur any) {
			if mine(old) || mine(cur) {
				a.queue.Add(syncAllKey)
			}
		},
		DeleteFunc: func(obj any) {
			sc, ok := informerutil.ObjectFrom[*networkingv1.ServiceCIDR](obj)
			if !ok {
				logger.Info("Ignoring the deletion of an object that is not a ServiceCIDR", "type", fmt.Sprintf("%T", obj))
				return
			}
			a.removeServiceCIDR(logger, sc)
			a.queue.Add(syncAllKey)
		},
	}
}
