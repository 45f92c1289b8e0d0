package repair

import (
	"net/netip"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/featuregate"
)

// followDelay is how long after a Service is seen holding a ClusterIP without an IPAddress
// object in the cache Run makes a pass: the allocators create the object before the Service is
// stored, so a lag shorter than this is the cache's, not a missing object.
const followDelay = time.Second

// follower notes, from the Service and IPAddress informers of a Config, the Services that hold a
// ClusterIP without an IPAddress object, as kube-apiserver's IPAddress repair loop follows
// Service events: a Service a Legacy peer (a kube-apiserver of the skew window) allocated gets
// its IPAddress within seconds instead of at the next pass. It only schedules passes, and only
// for a Service that still lacks the object followDelay later; the pass confirms with live reads
// what the cache suggests. It is safe for concurrent use.
type follower struct {
	services    cache.SharedIndexInformer
	ipAddresses cache.SharedIndexInformer

	mu      sync.Mutex            // guards pending
	pending map[netip.Addr]string // address → namespace/name of the Service seen lacking its object
}

// followClass is the class of the queue keys of followed addresses.
const followClass Class = "follow"

// newFollower registers the Service and IPAddress informers of the Config's factory, so that a
// Start of the factory after NewController starts them. It returns nil in Legacy mode, which has
// no IPAddress objects, and without informers.
func newFollower(c *Controller) *follower {
	if c.cfg.Mode == featuregate.Legacy || c.cfg.Informers == nil {
		return nil
	}
	return &follower{
		services:    c.cfg.Informers.Core().V1().Services().Informer(),
		ipAddresses: c.cfg.Informers.Networking().V1().IPAddresses().Informer(),
		pending:     map[netip.Addr]string{},
	}
}

// follow queues, followDelay after a Service is added or updated holding an address without an
// IPAddress object, that address's followClass key in q. It returns a function that stops
// following.
func (f *follower) follow(q workqueue.TypedDelayingInterface[itemKey]) (stop func()) {
	if f == nil {
		return func() {}
	}
	onService := func(obj any) {
		svc, ok := obj.(*corev1.Service)
		if !ok {
			return
		}
		for _, ip := range f.missing(svc) {
			f.mu.Lock()
			f.pending[ip] = svc.Namespace + "/" + svc.Name
			f.mu.Unlock()
			q.AddAfter(itemKey{addr: ip, class: followClass}, followDelay)
		}
	}
	reg, err := f.services.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    onService,
		UpdateFunc: func(_, obj any) { onService(obj) },
	})
	return func() {
		if err == nil {
			_ = f.services.RemoveEventHandler(reg)
		}
	}
}

// stillMissing reports whether the Service last seen lacking the IPAddress object of ip still
// holds ip and still lacks it, and forgets it.
func (f *follower) stillMissing(ip netip.Addr) bool {
	f.mu.Lock()
	key, ok := f.pending[ip]
	delete(f.pending, ip)
	f.mu.Unlock()
	if !ok {
		return false
	}
	obj, exists, err := f.services.GetStore().GetByKey(key)
	if err != nil || !exists {
		return false
	}
	svc, ok := obj.(*corev1.Service)
	return ok && slices.Contains(f.missing(svc), ip)
}

// missing returns the ClusterIPs of svc that have no IPAddress object in the cache. An invalid
// ClusterIP is left out: a pass only reports it.
func (f *follower) missing(svc *corev1.Service) []netip.Addr {
	var out []netip.Addr
	for _, ip := range allocator.ClusterIPs(svc) {
		if _, exists, err := f.ipAddresses.GetStore().GetByKey(ip.String()); err == nil && !exists {
			out = append(out, ip)
		}
	}
	return out
}
