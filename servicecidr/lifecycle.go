package servicecidr

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	networkingv1informers "k8s.io/client-go/informers/networking/v1"
	"k8s.io/client-go/kubernetes"
	networkingv1listers "k8s.io/client-go/listers/networking/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
)

const (
	// Finalizer is the finalizer the LifecycleController puts on every ServiceCIDR, so that a
	// ServiceCIDR is not removed while IPAddresses would be left in no ServiceCIDR.
	Finalizer = "networking.k8s.io/service-cidr-finalizer"

	// ReasonReady is the reason of the Ready=True condition the LifecycleController sets.
	ReasonReady = "ServiceCIDRReady"

	// ReasonTerminating is the reason of the Ready=False condition of a ServiceCIDR whose
	// deletion is blocked by IPAddresses that no other ServiceCIDR contains.
	ReasonTerminating = networkingv1.ServiceCIDRReasonTerminating

	messageReady       = "Kubernetes Service CIDR is ready"
	messageTerminating = "There are still IPAddresses referencing the ServiceCIDR, please remove them or create a new ServiceCIDR"
)

// LifecycleOptions configures NewLifecycleController. The zero value gives the defaults.
type LifecycleOptions struct {
	// GracePeriod is how long a ServiceCIDR being deleted must have no IPAddress that would be
	// orphaned before its finalizer is removed; it lets every allocator see that the ServiceCIDR
	// is not ready before it goes. Defaults to 10 seconds; a negative value means no wait.
	GracePeriod time.Duration
	// RecheckInterval is how often a blocked deletion is checked again, besides the checks that
	// IPAddress and ServiceCIDR events trigger. Defaults to 10 seconds.
	RecheckInterval time.Duration
}

// LifecycleController does for ServiceCIDRs what kube-controller-manager's ServiceCIDR controller
// does upstream, for clusters or tests where it does not run: it adds Finalizer to every
// ServiceCIDR and the Ready=True condition to those that lack one, and removes the finalizer of a
// ServiceCIDR being deleted only once no IPAddress would be left in no other ready ServiceCIDR and
// that has held for the grace period. While deletion is blocked the ServiceCIDR has Ready=False
// with reason Terminating. The checks read the informer caches, except the last one before the
// finalizer comes off, which lists ServiceCIDRs and IPAddresses from the API server; the update
// that removes the finalizer carries the resourceVersion read there.
//
// The zero LifecycleController is not usable; use NewLifecycleController. Its methods are safe for
// concurrent use.
type LifecycleController struct {
	client     kubernetes.Interface
	cidrs      cache.SharedIndexInformer
	ips        cache.SharedIndexInformer
	cidrLister networkingv1listers.ServiceCIDRLister
	ipLister   networkingv1listers.IPAddressLister
	opts       LifecycleOptions
	now        func() time.Time

	started atomic.Bool                                  // Run has been called
	queue   workqueue.TypedRateLimitingInterface[string] // set by Run before any handler runs

	mu         sync.Mutex           // guards clearSince
	clearSince map[string]clearMark // ServiceCIDR being deleted → since when it orphans nothing
}

// clearMark records since when the ServiceCIDR with uid has orphaned nothing. The UID keeps a
// ServiceCIDR re-created under the same name from inheriting the grace period of the old one.
type clearMark struct {
	uid   types.UID
	since time.Time
}

// NewLifecycleController returns a controller that manages the ServiceCIDRs seen by cidrs, judging
// orphans with the IPAddresses seen by ips, and writes with client. It registers both informers
// with their factory and starts nothing; call Run. A nil client or informer returns an error.
func NewLifecycleController(client kubernetes.Interface, cidrs networkingv1informers.ServiceCIDRInformer, ips networkingv1informers.IPAddressInformer, opts LifecycleOptions) (*LifecycleController, error) {
	switch {
	case client == nil:
		return nil, errors.New("servicecidr: NewLifecycleController needs a client")
	case cidrs == nil:
		return nil, errors.New("servicecidr: NewLifecycleController needs a ServiceCIDR informer")
	case ips == nil:
		return nil, errors.New("servicecidr: NewLifecycleController needs an IPAddress informer")
	}
	if opts.GracePeriod == 0 {
		opts.GracePeriod = 10 * time.Second
	}
	opts.GracePeriod = max(opts.GracePeriod, 0)
	if opts.RecheckInterval <= 0 {
		opts.RecheckInterval = 10 * time.Second
	}
	return &LifecycleController{
		client:     client,
		cidrs:      cidrs.Informer(),
		ips:        ips.Informer(),
		cidrLister: cidrs.Lister(),
		ipLister:   ips.Lister(),
		opts:       opts,
		now:        time.Now,
		clearSince: map[string]clearMark{},
	}, nil
}

// Run processes ServiceCIDRs with workers goroutines (at least one) until ctx is done, then
// returns nil. It returns an error at once if the controller was already started. The informers
// must be started by their factory; until they have synced, Run only waits.
func (c *LifecycleController) Run(ctx context.Context, workers int) error {
	if !c.started.CompareAndSwap(false, true) {
		return errors.New("servicecidr: LifecycleController.Run called twice")
	}
	logger := klog.FromContext(ctx).WithValues("controller", "servicecidr-lifecycle")
	ctx = klog.NewContext(ctx, logger)
	c.queue = workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "servicecidr_lifecycle"},
	)
	defer c.queue.ShutDown()

	cidrReg, err := c.cidrs.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.onServiceCIDR,
		UpdateFunc: func(_, cur any) { c.onServiceCIDR(cur) },
		DeleteFunc: func(any) { c.enqueueTerminating(func(*networkingv1.ServiceCIDR) bool { return true }) },
	})
	if err != nil {
		return fmt.Errorf("servicecidr: watch ServiceCIDRs: %w", err)
	}
	defer func() { _ = c.cidrs.RemoveEventHandler(cidrReg) }() // fails only for a foreign handle
	ipReg, err := c.ips.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.onIPAddress,
		UpdateFunc: func(_, cur any) { c.onIPAddress(cur) },
		DeleteFunc: c.onIPAddress,
	})
	if err != nil {
		return fmt.Errorf("servicecidr: watch IPAddresses: %w", err)
	}
	defer func() { _ = c.ips.RemoveEventHandler(ipReg) }()

	logger.Info("Starting", "workers", workers)
	defer logger.Info("Stopped")
	if !cache.WaitForNamedCacheSync("servicecidr-lifecycle", ctx.Done(), cidrReg.HasSynced, ipReg.HasSynced) {
		return nil // ctx is done
	}
	var wg sync.WaitGroup
	for range max(workers, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c.processNext(ctx) {
			}
		}()
	}
	<-ctx.Done()
	c.queue.ShutDown()
	wg.Wait()
	return nil
}

// onServiceCIDR queues a ServiceCIDR that was added or changed, and every ServiceCIDR being deleted:
// a new or newly ready ServiceCIDR may now hold their IPAddresses.
func (c *LifecycleController) onServiceCIDR(obj any) {
	sc, ok := serviceCIDRFrom(obj)
	if !ok {
		return
	}
	c.queue.Add(sc.Name)
	c.enqueueTerminating(func(*networkingv1.ServiceCIDR) bool { return true })
}

// onIPAddress queues the ServiceCIDRs being deleted that contain the IPAddress's address.
func (c *LifecycleController) onIPAddress(obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	ipa, ok := obj.(*networkingv1.IPAddress)
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

// containsAddr reports whether some prefix of sc can allocate ip.
func containsAddr(sc *networkingv1.ServiceCIDR, ip netip.Addr) bool {
	for _, s := range sc.Spec.CIDRs {
		if p, err := netip.ParsePrefix(s); err == nil && usable(p.Masked(), ip) {
			return true
		}
	}
	return false
}

func (c *LifecycleController) processNext(ctx context.Context) bool {
	name, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(name)
	if err := c.sync(ctx, name); err != nil {
		logger := klog.FromContext(ctx)
		if apierrors.IsConflict(err) {
			logger.V(2).Info("Conflict updating ServiceCIDR, will retry", "serviceCIDR", name)
		} else {
			logger.Error(err, "Syncing ServiceCIDR, will retry", "serviceCIDR", name)
		}
		c.queue.AddRateLimited(name)
		return true
	}
	c.queue.Forget(name)
	return true
}

// sync brings one ServiceCIDR to its wanted state: finalizer and Ready condition while it lives,
// and while it is being deleted either a Terminating condition (orphans left) or, after the grace
// period without orphans, no finalizer.
func (c *LifecycleController) sync(ctx context.Context, name string) error {
	sc, err := c.cidrLister.Get(name)
	if apierrors.IsNotFound(err) {
		c.setClearSince(name, "", time.Time{})
		return nil
	}
	if err != nil {
		return err
	}
	if sc.DeletionTimestamp == nil {
		return c.syncLive(ctx, sc)
	}
	return c.syncDeleting(ctx, sc)
}

func (c *LifecycleController) syncLive(ctx context.Context, sc *networkingv1.ServiceCIDR) error {
	logger := klog.FromContext(ctx)
	if !slices.Contains(sc.Finalizers, Finalizer) {
		cp := sc.DeepCopy()
		cp.Finalizers = append(cp.Finalizers, Finalizer)
		updated, err := c.client.NetworkingV1().ServiceCIDRs().Update(ctx, cp, metav1.UpdateOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("servicecidr: add finalizer to %s: %w", sc.Name, err)
		}
		logger.V(2).Info("Added the finalizer", "serviceCIDR", sc.Name)
		sc = updated
	}
	if meta.FindStatusCondition(sc.Status.Conditions, networkingv1.ServiceCIDRConditionReady) != nil {
		return nil
	}
	cp := sc.DeepCopy()
	meta.SetStatusCondition(&cp.Status.Conditions, metav1.Condition{
		Type:               networkingv1.ServiceCIDRConditionReady,
		Status:             metav1.ConditionTrue,
		Reason:             ReasonReady,
		Message:            messageReady,
		ObservedGeneration: sc.Generation,
	})
	if _, err := c.client.NetworkingV1().ServiceCIDRs().UpdateStatus(ctx, cp, metav1.UpdateOptions{}); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("servicecidr: set Ready on %s: %w", sc.Name, err)
	}
	logger.V(2).Info("Set Ready=True", "serviceCIDR", sc.Name)
	return nil
}

func (c *LifecycleController) syncDeleting(ctx context.Context, sc *networkingv1.ServiceCIDR) error {
	logger := klog.FromContext(ctx)
	if !slices.Contains(sc.Finalizers, Finalizer) {
		c.setClearSince(sc.Name, "", time.Time{})
		return nil
	}
	orphans, err := c.orphans(sc)
	if err != nil {
		return err
	}
	if len(orphans) > 0 {
		c.setClearSince(sc.Name, "", time.Time{})
		logger.V(2).Info("Deletion blocked by IPAddresses in no other ServiceCIDR", "serviceCIDR", sc.Name, "count", len(orphans), "first", orphans[0])
		c.queue.AddAfter(sc.Name, c.opts.RecheckInterval)
		return c.setTerminating(ctx, sc, orphans)
	}

	// Nothing would be orphaned now. An allocator that has not yet seen the deletion may still be
	// allocating from it, so wait out the grace period and check again before letting it go.
	now := c.now()
	mark := c.clearMarkOf(sc.Name)
	since := mark.since
	if since.IsZero() || mark.uid != sc.UID {
		c.setClearSince(sc.Name, sc.UID, now)
		since = now
	}
	if wait := since.Add(c.opts.GracePeriod).Sub(now); wait > 0 {
		c.queue.AddAfter(sc.Name, wait)
		return nil
	}
	return c.removeFinalizer(ctx, sc)
}

// removeFinalizer lets the ServiceCIDR sc, which the cache shows orphaning nothing for the grace
// period, go. Removing the finalizer cannot be undone, and the cache may lag behind the API server
// (an IPAddress created a moment before the deletion, a slow or restarted watch), so the decision
// is confirmed against live state: ServiceCIDRs and IPAddresses are listed from the API server, and
// the update that removes the finalizer carries the resourceVersion read there, so that it fails
// with a Conflict, and is retried, if the ServiceCIDR changed since.
func (c *LifecycleController) removeFinalizer(ctx context.Context, sc *networkingv1.ServiceCIDR) error {
	logger := klog.FromContext(ctx)
	live, orphans, err := c.liveOrphans(ctx, sc)
	if err != nil {
		return err
	}
	switch {
	case live == nil:
		c.setClearSince(sc.Name, "", time.Time{})
		return nil
	case live.UID != sc.UID || live.DeletionTimestamp == nil || !slices.Contains(live.Finalizers, Finalizer):
		// The cache is behind: its events will queue the ServiceCIDR again.
		c.setClearSince(sc.Name, "", time.Time{})
		return nil
	case len(orphans) > 0:
		c.setClearSince(sc.Name, "", time.Time{})
		logger.V(2).Info("Deletion blocked by IPAddresses the cache has not shown yet", "serviceCIDR", sc.Name, "count", len(orphans), "first", orphans[0])
		c.queue.AddAfter(sc.Name, c.opts.RecheckInterval)
		return c.setTerminating(ctx, live, orphans)
	}
	cp := live.DeepCopy()
	cp.Finalizers = slices.DeleteFunc(cp.Finalizers, func(f string) bool { return f == Finalizer })
	if _, err := c.client.NetworkingV1().ServiceCIDRs().Update(ctx, cp, metav1.UpdateOptions{}); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("servicecidr: remove finalizer from %s: %w", sc.Name, err)
	}
	c.setClearSince(sc.Name, "", time.Time{})
	logger.Info("Removed the finalizer of a deleted ServiceCIDR", "serviceCIDR", sc.Name)
	return nil
}

// setTerminating sets Ready=False, reason Terminating, on sc unless it has it already.
func (c *LifecycleController) setTerminating(ctx context.Context, sc *networkingv1.ServiceCIDR, orphans []netip.Addr) error {
	cond := meta.FindStatusCondition(sc.Status.Conditions, networkingv1.ServiceCIDRConditionReady)
	if cond != nil && cond.Status == metav1.ConditionFalse && cond.Reason == ReasonTerminating {
		return nil
	}
	cp := sc.DeepCopy()
	meta.SetStatusCondition(&cp.Status.Conditions, metav1.Condition{
		Type:               networkingv1.ServiceCIDRConditionReady,
		Status:             metav1.ConditionFalse,
		Reason:             ReasonTerminating,
		Message:            fmt.Sprintf("%s (%d IPAddresses, such as %s, are in no other ready ServiceCIDR)", messageTerminating, len(orphans), orphans[0]),
		ObservedGeneration: sc.Generation,
	})
	if _, err := c.client.NetworkingV1().ServiceCIDRs().UpdateStatus(ctx, cp, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("servicecidr: set Terminating on %s: %w", sc.Name, err)
	}
	return nil
}

// orphans returns the addresses of IPAddresses in the cache that sc contains and no other ready
// ServiceCIDR in the cache does, in ascending order.
func (c *LifecycleController) orphans(sc *networkingv1.ServiceCIDR) ([]netip.Addr, error) {
	cidrs, err := c.cidrLister.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	ips, err := c.ipLister.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	return orphansOf(sc, cidrs, ips), nil
}

// liveOrphans lists ServiceCIDRs and IPAddresses from the API server (consistent reads, not the
// cache) and returns the live copy of sc, nil if it is gone, and the addresses it would orphan.
func (c *LifecycleController) liveOrphans(ctx context.Context, sc *networkingv1.ServiceCIDR) (*networkingv1.ServiceCIDR, []netip.Addr, error) {
	cidrList, err := c.client.NetworkingV1().ServiceCIDRs().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("servicecidr: list ServiceCIDRs: %w", err)
	}
	var (
		live  *networkingv1.ServiceCIDR
		cidrs = make([]*networkingv1.ServiceCIDR, len(cidrList.Items))
	)
	for i := range cidrList.Items {
		cidrs[i] = &cidrList.Items[i]
		if cidrs[i].Name == sc.Name {
			live = cidrs[i]
		}
	}
	if live == nil {
		return nil, nil, nil
	}
	ipList, err := c.client.NetworkingV1().IPAddresses().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("servicecidr: list IPAddresses: %w", err)
	}
	ips := make([]*networkingv1.IPAddress, len(ipList.Items))
	for i := range ipList.Items {
		ips[i] = &ipList.Items[i]
	}
	return live, orphansOf(live, cidrs, ips), nil
}

// orphansOf returns the addresses of ips that sc contains and no ready ServiceCIDR of cidrs other
// than sc does, in ascending order.
func orphansOf(sc *networkingv1.ServiceCIDR, cidrs []*networkingv1.ServiceCIDR, ips []*networkingv1.IPAddress) []netip.Addr {
	var others []netip.Prefix
	for _, o := range cidrs {
		if o.Name == sc.Name || !isReady(o) {
			continue
		}
		for _, s := range o.Spec.CIDRs {
			if p, err := netip.ParsePrefix(s); err == nil {
				others = append(others, p.Masked())
			}
		}
	}
	var out []netip.Addr
	for _, ipa := range ips {
		ip, err := netip.ParseAddr(ipa.Name)
		if err != nil || !containsAddr(sc, ip) {
			continue
		}
		if !slices.ContainsFunc(others, func(p netip.Prefix) bool { return usable(p, ip) }) {
			out = append(out, ip)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

func (c *LifecycleController) clearSinceOf(name string) time.Time {
	return c.clearMarkOf(name).since
}

func (c *LifecycleController) clearMarkOf(name string) clearMark {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.clearSince[name]
}

// setClearSince records since when the ServiceCIDR name with uid orphans nothing; the zero time
// forgets it.
func (c *LifecycleController) setClearSince(name string, uid types.UID, t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.IsZero() {
		delete(c.clearSince, name)
	} else {
		c.clearSince[name] = clearMark{uid: uid, since: t}
	}
}
