package webhook

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	corev1informers "k8s.io/client-go/informers/core/v1"
	networkingv1informers "k8s.io/client-go/informers/networking/v1"
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	networkingv1client "k8s.io/client-go/kubernetes/typed/networking/v1"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/reservation"
)

// ControllerName names the Controller in its log lines and its workqueue.
const ControllerName = "clusterip-reservation-retain"

// ControllerOptions adjusts [NewController]. The zero ControllerOptions waits 10 seconds per
// address and counts into unregistered metrics.
type ControllerOptions struct {
	// Metrics receives clusterip_reservation_webhook_window_lost_total and
	// clusterip_reservation_controller_window_lost_total. Defaults to unregistered Metrics.
	Metrics *Metrics
	// Claims are the [Handler]'s hand-outs, checked against every Service seen holding an
	// address. Defaults to none: webhook windows lost are not counted. Leave it nil with
	// Handouts, whose records count them (once each, across replicas).
	Claims *Claims
	// ReleaseTimeout bounds how long the controller waits for kube-apiserver to delete a deleted
	// Service's IPAddress object before it gives the address up. Defaults to 10 seconds; a
	// negative value keeps the default.
	ReleaseTimeout time.Duration
	// PollInterval is how often it reads the object meanwhile. Defaults to 20 milliseconds.
	PollInterval time.Duration
	// Now is the clock reservations' ends are computed from. Defaults to time.Now.
	Now func() time.Time
	// ServiceCIDRs, if not nil, is the ServiceCIDR informer (the caller starts it) the release
	// cooldown of a deleted Service's addresses is read from
	// ([reservation.AnnotationReleaseCooldown], [reservation.ReleaseCooldownFor]). Defaults to
	// none: no address has a cooldown, and only a Retain policy keeps one.
	ServiceCIDRs networkingv1informers.ServiceCIDRInformer
	// Limits, the caps on reservations, decides whether an address a Retain policy or a release
	// cooldown would keep is kept ([reservation.Limits.KeptOnDelete]); a refusal is logged and
	// counted in clusterip_reservation_retain_refused_total. Defaults to nil Limits: no
	// namespace may retain (a release cooldown still keeps an address), no ServiceCIDR is capped.
	Limits *reservation.Limits
	// Sent, if not nil, decides which deleted Services' addresses are kept: only those of
	// Services whose creates kube-apiserver sends to the Handler, so that none is kept for a
	// name the webhook would never hand it back to. It decides too which live Retain Services
	// the Controller gives [Finalizer]. Defaults to every Service.
	Sent *Sent
	// Handouts, if not nil, are the [Handler]'s hand-out records, which the controller ends: it
	// deletes a record once its Service holds the address, counts a window lost when another
	// Service took it, and puts the reservation back after the bound when no object holds it
	// (clusterip_reservation_webhook_handouts_returned_total). The caller starts its informer.
	// Defaults to none.
	Handouts *Handouts
}

// retainItem is one address of a deleted Service that may be kept as a reservation: its release
// policy and when the delete was seen. Whether and until when it is kept ([reservation.KeptOnDelete])
// is decided by the worker, once the ServiceCIDR informer has synced, so that a delete seen
// before the ServiceCIDRs are loaded (just after a restart) still gets its release cooldown.
type retainItem struct {
	For     types.NamespacedName
	Labels  string // the Service's labels, as labels.Set.String writes them
	Addr    netip.Addr
	Policy  reservation.ReleasePolicy
	Deleted time.Time
}

// Controller turns the ClusterIPs of a deleted Service whose release policy is Retain, or whose
// ServiceCIDR has a release cooldown, into reservations, and counts the windows lost (see the
// package doc). It follows a Service informer, queues each address of a deleted Service in a
// typed workqueue and handles it in workers that poll the API server. It adds and removes
// [Finalizer] too, in workers of a second workqueue, of Service keys.
//
// The zero Controller is not usable; use [NewController]. A Controller is safe for concurrent
// use.
type Controller struct {
	client   networkingv1client.IPAddressInterface
	reg      cache.ResourceEventHandlerRegistration
	queue    workqueue.TypedRateLimitingInterface[retainItem]
	metrics  *Metrics
	claims   *Claims
	cidrs    networkingv1informers.ServiceCIDRInformer // nil: no release cooldown
	sent     *Sent                                     // nil: every Service
	limits   *reservation.Limits
	handouts *handoutController // nil: no hand-out records
	timeout  time.Duration
	interval time.Duration
	now      func() time.Time

	// Finalizer: the Services whose finalizer is to be added or removed (finalizer.go).
	finalizers    workqueue.TypedRateLimitingInterface[types.NamespacedName]
	services      corev1listers.ServiceLister
	serviceClient corev1client.ServicesGetter
	released      uidSet // Services whose addresses syncFinalizer queued: their delete event queues nothing
}

// NewController returns a Controller that follows services, which the caller starts, and
// creates reservations with client. A nil client or informer is an error matching
// allocator.ErrInvalid. It starts no goroutine: [Controller.Run] does the work.
func NewController(client kubernetes.Interface, services corev1informers.ServiceInformer, opts ControllerOptions) (*Controller, error) {
	if client == nil || services == nil {
		return nil, fmt.Errorf("webhook: NewController needs a client and a Service informer: %w", allocator.ErrInvalid)
	}
	c := &Controller{
		client: client.NetworkingV1().IPAddresses(),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[retainItem](),
			workqueue.TypedRateLimitingQueueConfig[retainItem]{Name: ControllerName}),
		metrics:  opts.Metrics.orNew(),
		claims:   opts.Claims,
		cidrs:    opts.ServiceCIDRs,
		sent:     opts.Sent,
		limits:   opts.Limits,
		timeout:  opts.ReleaseTimeout,
		interval: opts.PollInterval,
		now:      opts.Now,

		finalizers: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[types.NamespacedName](),
			workqueue.TypedRateLimitingQueueConfig[types.NamespacedName]{Name: ControllerName + "-finalizer"}),
		services:      services.Lister(),
		serviceClient: client.CoreV1(),
	}
	if c.timeout <= 0 {
		c.timeout = 10 * time.Second
	}
	if c.interval <= 0 {
		c.interval = 20 * time.Millisecond
	}
	if c.now == nil {
		c.now = time.Now
	}
	reg, err := services.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.observe(nil, obj); c.enqueueFinalizer(obj) },
		UpdateFunc: func(old, obj any) { c.observe(old, obj); c.enqueueFinalizer(obj) },
		DeleteFunc: c.deleted,
	})
	if err != nil {
		return nil, fmt.Errorf("webhook: follow the Service informer: %w", err)
	}
	c.reg = reg
	if c.handouts, err = newHandoutController(opts.Handouts, c.client, services, c.metrics, c.now); err != nil {
		return nil, err
	}
	if c.cidrs != nil {
		c.cidrs.Informer() // registers the informer with its factory, so that the caller's Start starts it
	}
	return c, nil
}

// Run handles deleted Services with workers goroutines (at least one) until ctx is done, after
// the Service informer's handler and the ServiceCIDR informer, if any, have synced; it returns
// nil then.
func (c *Controller) Run(ctx context.Context, workers int) error {
	logger := klog.FromContext(ctx).WithValues("controller", ControllerName)
	ctx = klog.NewContext(ctx, logger)
	defer c.queue.ShutDown()
	defer c.finalizers.ShutDown()
	stop := context.AfterFunc(ctx, func() { c.queue.ShutDown(); c.finalizers.ShutDown() })
	defer stop()
	synced := []cache.InformerSynced{c.reg.HasSynced}
	if c.cidrs != nil {
		synced = append(synced, c.cidrs.Informer().HasSynced)
	}
	if c.sent != nil {
		synced = append(synced, c.sent.HasSynced)
	}
	synced = append(synced, c.limits.HasSynced)
	if c.handouts != nil {
		synced = append(synced, c.handouts.synced...)
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return nil
	}
	done := make(chan struct{})
	for range max(workers, 1) {
		go func() {
			defer func() { done <- struct{}{} }()
			for c.processNext(ctx) {
			}
		}()
		go func() {
			defer func() { done <- struct{}{} }()
			for c.processNextFinalizer(ctx) {
			}
		}()
	}
	n := 2 * max(workers, 1)
	if c.handouts != nil {
		n++
		go func() {
			defer func() { done <- struct{}{} }()
			c.handouts.run(ctx)
		}()
	}
	for range n {
		<-done
	}
	return nil
}

// processNext handles one queued address and reports whether the queue is still open.
func (c *Controller) processNext(ctx context.Context) bool {
	item, shutdown := c.queue.Get()
	if shutdown {
		return false
	}
	defer c.queue.Done(item)
	if err := c.retain(ctx, item); err != nil {
		var perm *permanentError
		if errors.As(err, &perm) || ctx.Err() != nil {
			klog.FromContext(ctx).Error(err, "Not retaining an address", "ip", item.Addr, "service", item.For)
			c.queue.Forget(item)
			return true
		}
		klog.FromContext(ctx).Error(err, "Retaining an address failed; retrying", "ip", item.Addr, "service", item.For)
		c.queue.AddRateLimited(item)
		return true
	}
	c.queue.Forget(item)
	return true
}

// permanentError is an error after which an address is not tried again.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// observe checks each ClusterIP a Service holds that it did not hold before (old, nil for a
// Service added) against the Handler's hand-outs, and counts a hand-out another Service took.
func (c *Controller) observe(old, obj any) {
	svc, ok := obj.(*corev1.Service)
	if !ok {
		return
	}
	var had []netip.Addr
	if o, ok := old.(*corev1.Service); ok {
		had = clusterIPs(o)
	}
	owner := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	rv, _ := strconv.ParseUint(svc.ResourceVersion, 10, 64)
	now := c.now()
	for _, ip := range clusterIPs(svc) {
		if slices.Contains(had, ip) {
			continue
		}
		if c.claims.observe(ip, owner, rv, now) {
			c.metrics.webhookWindowLost.Inc()
			klog.Background().Info("A reserved address the webhook handed out was taken by another Service in the window; the reservation is lost",
				"controller", ControllerName, "ip", ip, "takenBy", owner)
		}
	}
}

// deleted queues each ClusterIP of a deleted Service whose release-policy annotation parses, with
// the time of the delete, from which the end of what it keeps is counted.
func (c *Controller) deleted(obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	svc, ok := obj.(*corev1.Service)
	if !ok || c.released.take(svc.UID) {
		return
	}
	policy, err := reservation.ReleasePolicyOf(svc.Annotations)
	if err != nil {
		return
	}
	for _, ip := range clusterIPs(svc) {
		c.queue.Add(retainItemOf(svc, ip, policy, c.now)) // a Service a finalizer held: from its deletionTimestamp
	}
}

// cooldown returns the release cooldown of ip from the ServiceCIDR informer (0 without one),
// logging the annotations that do not parse.
func (c *Controller) cooldown(ip netip.Addr) time.Duration {
	if c.cidrs == nil {
		return 0
	}
	d, err := reservation.ReleaseCooldownIn(c.cidrs.Lister(), ip)
	if err != nil {
		klog.Background().Error(err, "Ignoring a release cooldown that does not parse", "controller", ControllerName, "ip", ip)
	}
	return d
}

// clusterIPs returns the addresses svc holds: spec.clusterIPs, or spec.clusterIP for a Service
// written before clusterIPs existed; none for a headless Service.
func clusterIPs(svc *corev1.Service) []netip.Addr {
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	var out []netip.Addr
	for _, s := range ips {
		if ip, err := allocator.ParseClusterIP(s); err == nil {
			out = append(out, ip)
		}
	}
	return out
}

// retain waits until the IPAddress object of item.Addr is no longer the deleted Service's, and
// then creates the reservation. Another holder (of another parent) is a lost window: counted,
// logged and not retried.
func (c *Controller) retain(ctx context.Context, item retainItem) error {
	r, ok := c.keptOnDelete(item)
	if !ok {
		return nil // released: neither Retain nor a release cooldown
	}
	logger := klog.FromContext(ctx).WithValues("ip", item.Addr, "service", item.For)
	if c.sent != nil {
		lbls, err := labels.ConvertSelectorToLabelsMap(item.Labels)
		if err != nil {
			return &permanentError{fmt.Errorf("webhook: the labels of %s: %w", item.For, err)}
		}
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: item.For.Namespace, Name: item.For.Name, Labels: lbls}}
		sent, err := c.sent.Selects(svc)
		if err != nil {
			return err
		}
		if !sent {
			logger.V(2).Info("Not keeping the address of a deleted Service whose creates the webhook is not sent")
			return nil
		}
	}
	want, err := reservation.ObjectFor(r)
	if err != nil {
		return &permanentError{err}
	}
	lost := func(holder *networkingv1.IPAddress) error {
		c.metrics.controllerWindowLost.Inc()
		logger.Info("Another Service took the address of a deleted Service before its reservation was made; not retained",
			"holder", describeParent(holder.Spec.ParentRef))
		return nil
	}
	ctx2, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	var gone bool
	err = wait.PollUntilContextCancel(ctx2, c.interval, true, func(ctx context.Context) (bool, error) {
		obj, err := c.client.Get(ctx, want.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			gone = true
			return true, nil
		case err != nil:
			return false, nil // transient: poll again
		}
		if r2, ok := reservation.FromObject(obj); ok && r2.For == item.For {
			return true, nil // already kept (another controller, or a registry's Retain)
		}
		if p := obj.Spec.ParentRef; p != nil && p.Group == "" && p.Resource == "services" && p.Namespace == item.For.Namespace && p.Name == item.For.Name {
			return false, nil // still the deleted Service's allocation
		}
		return true, lost(obj)
	})
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return &permanentError{fmt.Errorf("webhook: %s of %s was not released within %v", item.Addr, item.For, c.timeout)}
	}
	if !gone {
		return nil
	}
	_, err = c.client.Create(ctx, want, metav1.CreateOptions{})
	switch {
	case err == nil:
		logger.V(2).Info("Retained the address of a deleted Service", "expires", r.Expires)
		return nil
	case apierrors.IsAlreadyExists(err):
		obj, getErr := c.client.Get(ctx, want.Name, metav1.GetOptions{})
		if getErr != nil {
			return fmt.Errorf("webhook: read %s after its create was refused: %w", item.Addr, getErr)
		}
		if r2, ok := reservation.FromObject(obj); ok && r2.For == item.For {
			return nil
		}
		return lost(obj)
	}
	return fmt.Errorf("webhook: create the reservation of %s for %s: %w", item.Addr, item.For, err)
}

// describeParent names a parentRef for a log line.
func describeParent(p *networkingv1.ParentReference) string {
	if p == nil {
		return "(none)"
	}
	return fmt.Sprintf("%s/%s %s/%s", p.Group, p.Resource, p.Namespace, p.Name)
}
