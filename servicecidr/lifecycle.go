package servicecidr

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	networkingv1informers "k8s.io/client-go/informers/networking/v1"
	"k8s.io/client-go/kubernetes"
	networkingv1listers "k8s.io/client-go/listers/networking/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/kube-ipam/clusterip/internal/informerutil"
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

// The reasons of the Events the LifecycleController emits (see LifecycleOptions.Recorder).
const (
	// EventReasonReadyError is the reason of the Warning Event about a ServiceCIDR whose
	// Ready=True condition could not be set: kube-controller-manager's reason for it.
	EventReasonReadyError = "KubernetesServiceCIDRError"

	// EventReasonTerminating is the reason of the Warning Event about a ServiceCIDR whose deletion
	// is blocked by IPAddresses in no other ready ServiceCIDR, emitted when its Ready condition
	// turns False with reason Terminating. kube-controller-manager only sets the condition.
	EventReasonTerminating = ReasonTerminating
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
	// Recorder receives Warning Events regarding ServiceCIDRs: EventReasonReadyError when the
	// Ready=True condition cannot be set for another reason than a Conflict, which is retried at
	// once (kube-controller-manager's ServiceCIDR controller emits it on any error of its
	// server-side apply, which does not conflict), and EventReasonTerminating each time a deletion becomes blocked by IPAddresses
	// that no other ready ServiceCIDR contains. Defaults to none: no Events are emitted. Build
	// one with client-go's events.NewBroadcaster; the controller does not start or stop it.
	Recorder events.EventRecorder
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
		if ctx.Err() != nil {
			return nil // done before it started: the informer stopped with ctx
		}
		return fmt.Errorf("servicecidr: watch ServiceCIDRs: %w", err)
	}
	defer func() { _ = c.cidrs.RemoveEventHandler(cidrReg) }() // fails only for a foreign handle
	ipReg, err := c.ips.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.onIPAddress,
		UpdateFunc: func(_, cur any) { c.onIPAddress(cur) },
		DeleteFunc: c.onIPAddress,
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil // done before it started: the informer stopped with ctx
		}
		return fmt.Errorf("servicecidr: watch IPAddresses: %w", err)
	}
	defer func() { _ = c.ips.RemoveEventHandler(ipReg) }()

	logger.Info("Starting", "workers", workers)
	defer logger.Info("Stopped")
	if !cache.WaitForNamedCacheSyncWithContext(ctx, cidrReg.HasSynced, ipReg.HasSynced) {
		return nil // ctx is done
	}
	informerutil.RunWorkers(ctx, workers, c.queue, c.processNext)
	return nil
}

// processNext syncs the next ServiceCIDR; it returns false once the queue is shut down.
func (c *LifecycleController) processNext(ctx context.Context) bool {
	return informerutil.ProcessNext(ctx, c.queue, c.sync, func(ctx context.Context, name string, err error) {
		logger := klog.FromContext(ctx)
		if apierrors.IsConflict(err) {
			logger.V(2).Info("Conflict updating ServiceCIDR, will retry", "serviceCIDR", name)
		} else {
			logger.Error(err, "Syncing ServiceCIDR, will retry", "serviceCIDR", name)
		}
	})
}
