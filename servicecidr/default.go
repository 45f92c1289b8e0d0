package servicecidr

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	metav1apply "k8s.io/client-go/applyconfigurations/meta/v1"
	networkingv1apply "k8s.io/client-go/applyconfigurations/networking/v1"
	networkingv1informers "k8s.io/client-go/informers/networking/v1"
	"k8s.io/client-go/kubernetes"
	networkingv1listers "k8s.io/client-go/listers/networking/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/component-base/compatibility"
	"k8s.io/klog/v2"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/internal/semantics"
)

const (
	// DefaultServiceCIDRName is the name of the default ServiceCIDR, which kube-apiserver creates
	// from its --service-cluster-ip-range and a DefaultController creates where no kube-apiserver
	// runs.
	DefaultServiceCIDRName = "kubernetes"

	// DefaultControllerName is kube-apiserver's name for its default-ServiceCIDR controller: the
	// field manager of the Ready condition a DefaultController applies, and the component its
	// Events should be reported by.
	DefaultControllerName = "kubernetes-service-cidr-controller"

	// EventReasonDefaultError is the reason of the Warning Event about a default ServiceCIDR that
	// cannot be created, upgraded to dual stack or set Ready=True: kube-apiserver's.
	EventReasonDefaultError = "KubernetesDefaultServiceCIDRError"

	// EventReasonDefaultInconsistent is the reason of the Warning Event about a default
	// ServiceCIDR whose spec.cidrs are not the flag ranges: kube-apiserver's.
	EventReasonDefaultInconsistent = "KubernetesDefaultServiceCIDRInconsistent"

	// messageDefaultReady is the message of the Ready=True condition, kube-apiserver's.
	messageDefaultReady = "Kubernetes default Service CIDR is ready"
)

// DefaultOptions configures NewDefaultController. The zero value gives the defaults.
type DefaultOptions struct {
	// Version is the kube-apiserver whose default-ServiceCIDR controller to behave as (its
	// binary version counts; build one with featuregate.KubeVersion). Releases up to 1.33 and
	// those from 1.34 differ in how they treat an existing default ServiceCIDR (see
	// DefaultController). Nil means featuregate.DefaultVersion(), the newest supported release.
	Version compatibility.EffectiveVersion
	// Interval is how often the default ServiceCIDR is checked after the first successful pass.
	// Defaults to 10 seconds, kube-apiserver's interval; a negative value keeps the default.
	Interval time.Duration
	// Recorder receives the Warning Events kube-apiserver emits about the default ServiceCIDR:
	// EventReasonDefaultInconsistent once when its spec.cidrs are not the flag ranges,
	// EventReasonDefaultError when it cannot be created, upgraded to dual stack or set ready, and,
	// once, one with the reason of its Ready condition when that is not True. Defaults to none: no
	// Events, only the log. Build one with client-go's events.NewBroadcaster, naming
	// DefaultControllerName as the reporting controller; the controller does not start or stop it.
	Recorder events.EventRecorder
}

// DefaultController does what kube-apiserver's default-ServiceCIDR controller does, for a
// registry that serves Services without a kube-apiserver: it creates the ServiceCIDR named
// DefaultServiceCIDRName from the flag ranges (the --service-cluster-ip-range of a
// kube-apiserver) if it is missing, recreates it within Interval if it is deleted, and sets its
// condition Ready=True, so that the servicecidr Allocators of every family have a ServiceCIDR to
// allocate from. It never deletes the default ServiceCIDR nor changes its ranges, with one
// exception kube-apiserver makes too: a single-stack default ServiceCIDR whose range is the first
// flag range gains the second (a single- to dual-stack upgrade).
//
// When the default ServiceCIDR exists with other ranges than the flags (the flags changed, or
// another server has other flags), it logs that and emits an EventReasonDefaultInconsistent
// Event, once per controller, and leaves the ServiceCIDR alone. What it does with the Ready
// condition follows DefaultOptions.Version:
//
//   - 1.34 and later (the default): ranges that differ are reported whatever the condition
//     says, and the condition is not touched. With matching ranges, Ready=True is left alone,
//     Ready=False is reported once (an Event with the condition's reason and the message
//     "Configuration matches, but " and the condition's message) and not overwritten, and a
//     missing or Unknown condition is set to True.
//   - 1.33 and earlier: a Ready condition that is not True (False or Unknown) is reported once
//     with its own reason and message and nothing else is done; ranges that differ are reported
//     only when the condition is True or missing; a missing condition with matching ranges is
//     set to True.
//
// The Ready=True condition is written with a server-side apply of the status by the field
// manager DefaultControllerName, with kube-apiserver's message and no reason, as kube-apiserver
// writes it. A default ServiceCIDR being deleted is left to whoever deletes it (the
// LifecycleController, or kube-controller-manager): it is recreated once it is gone.
//
// One difference from kube-apiserver: when another server creates the default ServiceCIDR between
// this controller's look and its create, the controller checks the other's object on its next
// pass, where kube-apiserver v1.33–v1.37 compares the empty object its failed create returned and
// can report ranges that differ when they do not.
//
// A DefaultController reads the default ServiceCIDR through an informer (any ServiceCIDR
// informer, such as a SharedInformerFactory's: it only looks up the one name). The zero
// DefaultController is not usable; use NewDefaultController. Its methods are safe for concurrent
// use.
type DefaultController struct {
	cidrs    []string // the flag ranges, primary first, as kube-apiserver prints them
	client   kubernetes.Interface
	informer cache.SharedIndexInformer
	lister   networkingv1listers.ServiceCIDRLister
	v134     bool // follow kube-apiserver 1.34 and later, else 1.33
	interval time.Duration
	recorder events.EventRecorder

	started atomic.Bool // Run has been called
	synced  atomic.Bool // a pass has succeeded (HasSynced)

	// Touched by Run's goroutine only: whether each report, made once per controller as
	// kube-apiserver makes it, has been made.
	reportedMismatch bool
	reportedNotReady bool
}

// NewDefaultController returns a controller that keeps the default ServiceCIDR of ranges (one or
// two prefixes of different IP families, the primary first, as kube-apiserver's
// --service-cluster-ip-range gives them; each is masked) through client, reading it through
// cidrs. It registers the informer with its factory and starts nothing: start the factory and
// call Run. A nil client or informer, or ranges it cannot take, make it return an error.
func NewDefaultController(ranges []netip.Prefix, client kubernetes.Interface, cidrs networkingv1informers.ServiceCIDRInformer, opts DefaultOptions) (*DefaultController, error) {
	switch {
	case client == nil:
		return nil, errors.New("servicecidr: NewDefaultController needs a client")
	case cidrs == nil:
		return nil, errors.New("servicecidr: NewDefaultController needs a ServiceCIDR informer")
	case len(ranges) == 0 || len(ranges) > 2:
		return nil, fmt.Errorf("servicecidr: NewDefaultController needs one or two ranges, got %d", len(ranges))
	}
	var cidrStrings []string
	for _, r := range ranges {
		if !r.IsValid() {
			return nil, fmt.Errorf("servicecidr: NewDefaultController: invalid range %v", r)
		}
		cidrStrings = append(cidrStrings, r.Masked().String())
	}
	if len(ranges) == 2 && allocator.FamilyOf(ranges[0].Addr()) == allocator.FamilyOf(ranges[1].Addr()) {
		return nil, fmt.Errorf("servicecidr: NewDefaultController: %s and %s are of the same IP family", ranges[0], ranges[1])
	}
	interval := opts.Interval
	if interval <= 0 {
		interval = 10 * time.Second
	}
	return &DefaultController{
		cidrs:    cidrStrings,
		client:   client,
		informer: cidrs.Informer(),
		lister:   cidrs.Lister(),
		v134:     semantics.Of(opts.Version, nil).DefaultServiceCIDRReportsMismatchFirst(),
		interval: interval,
		recorder: opts.Recorder,
	}, nil
}

// HasSynced reports whether the controller has completed a pass: the default ServiceCIDR exists
// (it found or created it) and its Ready condition has been dealt with. Once true it stays true.
// kube-apiserver does not report ready before this; WaitReady-style callers can wait for it.
func (c *DefaultController) HasSynced() bool { return c.synced.Load() }

// Run keeps the default ServiceCIDR until ctx is done, then returns nil. It returns an error at
// once if the controller was already started. The informer must be started by its factory; until
// it has synced Run only waits. Run then tries a pass every 100 ms until one succeeds (as
// kube-apiserver does before it reports ready), and then one every DefaultOptions.Interval; a
// pass that fails is logged and tried again at the next.
func (c *DefaultController) Run(ctx context.Context) error {
	if !c.started.CompareAndSwap(false, true) {
		return errors.New("servicecidr: DefaultController.Run called twice")
	}
	logger := klog.FromContext(ctx).WithValues("controller", DefaultControllerName)
	ctx = klog.NewContext(ctx, logger)
	logger.Info("Starting", "cidrs", c.cidrs)
	defer logger.Info("Stopped")
	if !cache.WaitForNamedCacheSyncWithContext(ctx, c.informer.HasSynced) {
		return nil
	}
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if err := c.sync(ctx); err != nil {
			logger.V(2).Info("Could not initialize the default ServiceCIDR, retrying", "err", err)
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return nil // ctx is done
	}
	c.synced.Store(true)
	wait.UntilWithContext(ctx, func(ctx context.Context) {
		if err := c.sync(ctx); err != nil {
			logger.Error(err, "Could not sync the default ServiceCIDR")
		}
	}, c.interval)
	return nil
}

// sync makes one pass over the default ServiceCIDR, as kube-apiserver's controller does.
func (c *DefaultController) sync(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	sc, err := c.lister.Get(DefaultServiceCIDRName)
	switch {
	case err == nil:
		if len(c.cidrs) == 2 && len(sc.Spec.CIDRs) == 1 && sc.Spec.CIDRs[0] == c.cidrs[0] {
			logger.Info("Updating the default ServiceCIDR from single-stack to dual-stack", "from", sc.Spec.CIDRs, "to", c.cidrs)
			cp := sc.DeepCopy()
			cp.Spec.CIDRs = slices.Clone(c.cidrs)
			if _, err := c.client.NetworkingV1().ServiceCIDRs().Update(ctx, cp, metav1.UpdateOptions{}); err != nil {
				// As kube-apiserver: reported, and tried again at the next pass.
				logger.Error(err, "The default ServiceCIDR cannot be updated to dual stack", "from", c.cidrs[0], "to", c.cidrs)
				c.event(sc, EventReasonDefaultError, "Upgrade", "The default ServiceCIDR can not be upgraded from %s to dual stack %v : %v", c.cidrs[0], c.cidrs, err)
			}
			return nil
		}
		c.syncStatus(ctx, sc)
		return nil
	case !apierrors.IsNotFound(err):
		return fmt.Errorf("servicecidr: get the default ServiceCIDR from the cache: %w", err)
	}

	logger.Info("Creating the default ServiceCIDR", "cidrs", c.cidrs)
	want := &networkingv1.ServiceCIDR{
		ObjectMeta: metav1.ObjectMeta{Name: DefaultServiceCIDRName},
		Spec:       networkingv1.ServiceCIDRSpec{CIDRs: slices.Clone(c.cidrs)},
	}
	created, err := c.client.NetworkingV1().ServiceCIDRs().Create(ctx, want, metav1.CreateOptions{})
	switch {
	case apierrors.IsAlreadyExists(err):
		return nil // created by another meanwhile: the next pass checks it
	case err != nil:
		c.event(want, EventReasonDefaultError, "Create", "The default ServiceCIDR can not be created")
		return fmt.Errorf("servicecidr: create the default ServiceCIDR %v: %w", c.cidrs, err)
	}
	c.syncStatus(ctx, created)
	return nil
}

// syncStatus checks the default ServiceCIDR against the flags and sets it ready, as the release
// of DefaultOptions.Version does.
func (c *DefaultController) syncStatus(ctx context.Context, sc *networkingv1.ServiceCIDR) {
	logger := klog.FromContext(ctx)
	if sc.DeletionTimestamp != nil {
		logger.V(6).Info("The default ServiceCIDR is being deleted, leaving it alone")
		return
	}
	same := slices.Equal(c.cidrs, sc.Spec.CIDRs)
	cond := meta.FindStatusCondition(sc.Status.Conditions, networkingv1.ServiceCIDRConditionReady)
	if c.v134 {
		switch {
		case !same:
			c.reportMismatch(logger, sc, "The default ServiceCIDR %v does not match the controller flag configurations %s")
		case cond != nil && cond.Status == metav1.ConditionFalse:
			// Not overwritten: someone set it, and it needs an administrator.
			if !c.reportedNotReady {
				logger.Info("The default ServiceCIDR has condition Ready=False though its ranges match the flags; check the cluster's network configuration",
					"reason", cond.Reason, "message", cond.Message)
				c.event(sc, cond.Reason, "Check", "Configuration matches, but %s", cond.Message)
				c.reportedNotReady = true
			}
		case cond != nil && cond.Status == metav1.ConditionTrue:
		default: // no condition, or Unknown
			c.setReady(ctx, sc)
		}
		return
	}
	// 1.33 and earlier.
	if cond != nil && cond.Status != metav1.ConditionTrue {
		if !c.reportedNotReady {
			logger.Info("The default ServiceCIDR's Ready condition is not True; check the cluster's network configuration",
				"status", cond.Status, "reason", cond.Reason, "message", cond.Message)
			c.event(sc, cond.Reason, "Check", "%s", cond.Message)
			c.reportedNotReady = true
		}
		return
	}
	switch {
	case !same:
		c.reportMismatch(logger, sc, "The default ServiceCIDR %v does not match the flag configurations %s")
	case cond == nil:
		c.setReady(ctx, sc)
	}
}

// reportMismatch logs, and reports with an Event of format (which takes the ServiceCIDR's ranges
// and the flags'), that sc's ranges are not the flags', once per controller.
func (c *DefaultController) reportMismatch(logger klog.Logger, sc *networkingv1.ServiceCIDR, format string) {
	if c.reportedMismatch {
		return
	}
	logger.Info("The default ServiceCIDR does not match the flags; make the flags match it, or delete it to have it created again from the flags",
		"serviceCIDRs", sc.Spec.CIDRs, "flags", c.cidrs)
	c.event(sc, EventReasonDefaultInconsistent, "Check", format, sc.Spec.CIDRs, c.cidrs)
	c.reportedMismatch = true
}

// setReady applies the condition Ready=True to sc's status, as kube-apiserver does.
func (c *DefaultController) setReady(ctx context.Context, sc *networkingv1.ServiceCIDR) {
	logger := klog.FromContext(ctx)
	logger.Info("Setting the default ServiceCIDR's condition Ready to True")
	apply := networkingv1apply.ServiceCIDR(DefaultServiceCIDRName).WithStatus(networkingv1apply.ServiceCIDRStatus().WithConditions(
		metav1apply.Condition().
			WithType(networkingv1.ServiceCIDRConditionReady).
			WithStatus(metav1.ConditionTrue).
			WithMessage(messageDefaultReady).
			WithLastTransitionTime(metav1.Now())))
	opts := metav1.ApplyOptions{FieldManager: DefaultControllerName, Force: true}
	if _, err := c.client.NetworkingV1().ServiceCIDRs().ApplyStatus(ctx, apply, opts); err != nil {
		// As kube-apiserver: reported, and tried again at the next pass.
		logger.Error(err, "Could not set the default ServiceCIDR's condition Ready to True")
		c.event(sc, EventReasonDefaultError, "SetReady", "The default ServiceCIDR Status can not be set to Ready=True")
	}
}

// event emits a Warning Event regarding sc, if there is a Recorder. An empty reason (a
// condition's) becomes EventReasonDefaultError, since an Event needs one.
func (c *DefaultController) event(sc *networkingv1.ServiceCIDR, reason, action, note string, args ...any) {
	if c.recorder == nil {
		return
	}
	if reason == "" {
		reason = EventReasonDefaultError
	}
	c.recorder.Eventf(sc, nil, corev1.EventTypeWarning, reason, action, note, args...)
}
