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

// defaultFollowWindow is the least time from the start of one pass to that of a pass followed
// Services bring forward: however many Services a Legacy peer creates, and however often they
// change, following them costs at most one pass (a LIST of every ServiceCIDR, IPAddress and
// Service) per window. A Service followed within a window of the last pass waits for the
// window's end, so a burst of a peer's creates that straddles a pass gets its last IPAddress
// objects one window later: kube-apiserver's own integration tests of a skew
// (TestSkewAllocatorsRollout) give them 10 seconds in all.
const defaultFollowWindow = 2 * time.Second

// follower notes, from the Service and IPAddress informers of a Config, the Services that hold a
// ClusterIP without an IPAddress object, as kube-apiserver's IPAddress repair loop follows
// Service events: a Service a Legacy peer (a kube-apiserver of the skew window) allocated gets
// its IPAddress within seconds instead of at the next pass. It only schedules passes, and only
// for a Service that still lacks the object followDelay later; the pass confirms with live reads
// what the cache suggests. Run brings at most one pass forward per follow window (defaultFollowWindow), and none for an
// address a pass has reported as one it cannot fix (out of every ServiceCIDR, say). It is safe
// for concurrent use.
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

// stillMissing returns the Service last seen lacking the IPAddress object of ip if it still
// holds ip and still lacks it, else nil, and forgets it. The Service is the cache's: read only.
func (f *follower) stillMissing(ip netip.Addr) *corev1.Service {
	f.mu.Lock()
	key, ok := f.pending[ip]
	delete(f.pending, ip)
	f.mu.Unlock()
	if !ok {
		return nil
	}
	obj, exists, err := f.services.GetStore().GetByKey(key)
	if err != nil || !exists {
		return nil
	}
	if svc, ok := obj.(*corev1.Service); ok && slices.Contains(f.missing(svc), ip) {
		return svc
	}
	return nil
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
