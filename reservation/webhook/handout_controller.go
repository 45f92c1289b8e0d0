package webhook

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1informers "k8s.io/client-go/informers/core/v1"
	networkingv1client "k8s.io/client-go/kubernetes/typed/networking/v1"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/kube-ipam/clusterip/reservation"
)

// HandoutControllerName names the part of the [Controller] that ends hand-outs, in its log lines
// and its workqueue.
const HandoutControllerName = "clusterip-reservation-handouts"

// handoutController ends the hand-outs of [Handouts] (see there): it follows the Lease informer
// and the Controller's Service informer, and syncs each record by name in a typed workqueue.
type handoutController struct {
	records  *Handouts
	ipas     networkingv1client.IPAddressInterface
	services corev1listers.ServiceLister
	metrics  *Metrics
	now      func() time.Time
	queue    workqueue.TypedRateLimitingInterface[string]
	synced   []cache.InformerSynced
}

// newHandoutController returns the handoutController of records, or nil for nil records.
func newHandoutController(records *Handouts, ipas networkingv1client.IPAddressInterface, services corev1informers.ServiceInformer, metrics *Metrics, now func() time.Time) (*handoutController, error) {
	if records == nil {
		return nil, nil
	}
	hc := &handoutController{
		records:  records,
		ipas:     ipas,
		services: services.Lister(),
		metrics:  metrics,
		now:      now,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: HandoutControllerName}),
	}
	leaseReg, err := records.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    hc.enqueueLease,
		UpdateFunc: func(_, obj any) { hc.enqueueLease(obj) },
	})
	if err != nil {
		return nil, fmt.Errorf("webhook: follow the Lease informer: %w", err)
	}
	svcReg, err := services.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    hc.enqueueHolder,
		UpdateFunc: func(_, obj any) { hc.enqueueHolder(obj) },
	})
	if err != nil {
		return nil, fmt.Errorf("webhook: follow the Service informer: %w", err)
	}
	hc.synced = []cache.InformerSynced{leaseReg.HasSynced, svcReg.HasSynced}
	return hc, nil
}

// enqueueLease queues a record by name.
func (hc *handoutController) enqueueLease(obj any) {
	if l, ok := obj.(*coordinationv1.Lease); ok && l.Labels[LabelHandout] == "true" && l.Namespace == hc.records.namespace {
		hc.queue.Add(l.Name)
	}
}

// enqueueHolder queues the record of each address a Service holds, if there is one: the Service
// may be the one it was handed to, or another that took it in the window.
func (hc *handoutController) enqueueHolder(obj any) {
	svc, ok := obj.(*corev1.Service)
	if !ok {
		return
	}
	for _, ip := range clusterIPs(svc) {
		if _, l, ok := hc.records.lookup(ip); ok {
			hc.queue.Add(l.Name)
		}
	}
}

// run syncs records until ctx is done; the caller has waited for hc.synced.
func (hc *handoutController) run(ctx context.Context) {
	logger := klog.FromContext(ctx).WithValues("controller", HandoutControllerName)
	ctx = klog.NewContext(ctx, logger)
	defer hc.queue.ShutDown()
	stop := context.AfterFunc(ctx, hc.queue.ShutDown)
	defer stop()
	for hc.processNext(ctx) {
	}
}

// processNext syncs one queued record and reports whether the queue is still open.
func (hc *handoutController) processNext(ctx context.Context) bool {
	name, shutdown := hc.queue.Get()
	if shutdown {
		return false
	}
	defer hc.queue.Done(name)
	after, err := hc.sync(ctx, name)
	switch {
	case err != nil && ctx.Err() == nil:
		klog.FromContext(ctx).Error(err, "Ending a hand-out failed; retrying", "record", name)
		hc.queue.AddRateLimited(name)
	case after > 0:
		hc.queue.Forget(name)
		hc.queue.AddAfter(name, after)
	default:
		hc.queue.Forget(name)
	}
	return true
}

// sync ends the hand-out the record name records, if it can be ended now, and otherwise returns
// how long until the bound, when it can:
//   - the Service informer shows the Service holding the address: the hand-out is done;
//   - the address's IPAddress object is another reservation than the one handed out: that
//     hand-out has ended (the address was reserved again); after the bound, the very one handed
//     out too (it was not deleted);
//   - another Service's allocation, that Service shown holding the address by the informer (its
//     create succeeded): another Service took the address in the window, counted in
//     clusterip_reservation_webhook_window_lost_total at once;
//   - before the bound nothing else is decided: an allocation's IPAddress object is deleted again
//     when its Service's create fails after the webhook;
//   - after the bound, the Service's allocation: done; another object, written within the bound:
//     another Service took the address in the window, counted in
//     clusterip_reservation_webhook_window_lost_total;
//   - no object, after the bound, and the Service holds another address of the family: another
//     Service took the address in the window and let it go, and the Service was created again
//     with another; counted as a lost window, and not put back (a second reservation for a
//     Service that has an address);
//   - no object, after the bound: the Service was never created with it, and the reservation is
//     put back as it was, unless it has ended; counted in
//     clusterip_reservation_webhook_handouts_returned_total.
//
// Every end deletes the record with its resourceVersion as precondition, and is counted only by
// the controller whose delete succeeds, so that two controllers do not count one end twice.
func (hc *handoutController) sync(ctx context.Context, name string) (time.Duration, error) {
	lease, err := hc.records.leases.Get(name)
	if apierrors.IsNotFound(err) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	logger := klog.FromContext(ctx).WithValues("record", name)
	rec, _, ok := handoutOf(lease)
	if !ok {
		logger.Info("Deleting a hand-out record that is not well formed")
		_, err := hc.finish(ctx, lease)
		return 0, err
	}
	logger = logger.WithValues("ip", rec.Addr, "service", rec.For)
	now := hc.now()
	bound := rec.At.Add(hc.records.bound)
	obj, err := hc.ipas.Get(ctx, rec.Addr.String(), metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return 0, fmt.Errorf("webhook: read IPAddress %s: %w", rec.Addr, err)
	}
	switch {
	case hc.holds(rec.For, rec):
		logger.V(2).Info("A hand-out is done: its Service holds the address")
		_, err := hc.finish(ctx, lease)
		return 0, err
	case err == nil && reservation.IsReservation(obj):
		if obj.UID == rec.UID && now.Before(bound) {
			return bound.Sub(now), nil // the hand-out may still delete it
		}
		_, err := hc.finish(ctx, lease)
		return 0, err
	case err == nil && hc.heldByAnother(obj, rec):
		// Another Service's create succeeded with the address: the window is lost, whatever the
		// bound (waiting for it could see a later object, or a new hand-out of the address).
		return 0, hc.lost(ctx, lease, obj)
	case now.Before(bound):
		// A Service's allocation is rolled back when its create fails after the webhook (a
		// later admission check): only the Service's object, or the bound, decides.
		return bound.Sub(now), nil
	case err == nil && isServiceAllocation(obj, rec.For):
		_, err := hc.finish(ctx, lease) // the Service's, and the informer has not shown it yet
		return 0, err
	case err == nil:
		if obj.CreationTimestamp.After(bound) {
			_, err := hc.finish(ctx, lease) // taken after the window, not in it
			return 0, err
		}
		return 0, hc.lost(ctx, lease, obj)
	case rec.Reservation.Expired(now):
		logger.Info("Dropping a hand-out whose Service never held the address: its reservation has ended", "expired", rec.Reservation.Expires)
		_, err := hc.finish(ctx, lease)
		return 0, err
	case hc.holdsAnother(rec.For, rec.Addr):
		// Another Service took the address in the window and let it go within the bound, and
		// the Service, created again, got another: the reservation is lost, and put back it
		// would be a second one for a Service that holds an address of its family.
		deleted, err := hc.finish(ctx, lease)
		if deleted {
			hc.metrics.webhookWindowLost.Inc()
			logger.Info("A reserved address the webhook handed out was not held by its Service, which holds another; the reservation is lost")
		}
		return 0, err
	}
	want, err := reservation.ObjectFor(rec.Reservation)
	if err != nil {
		_, ferr := hc.finish(ctx, lease) // cannot be: it was read with FromObject
		return 0, ferr
	}
	if _, err := hc.ipas.Create(ctx, want, metav1.CreateOptions{}); err != nil {
		// AlreadyExists: another controller put it back, or a Service took it; read it again.
		return 0, fmt.Errorf("webhook: put back the reservation of %s: %w", rec.Addr, err)
	}
	hc.metrics.handoutsReturned.Inc()
	logger.Info("Put back a reservation handed out to a Service that did not hold the address within the bound", "bound", hc.records.bound)
	_, err = hc.finish(ctx, lease)
	return 0, err
}

// holds reports whether the Service informer shows svc holding rec's address.
func (hc *handoutController) holds(svc types.NamespacedName, rec handout) bool {
	s, err := hc.services.Services(svc.Namespace).Get(svc.Name)
	return err == nil && containsAddr(clusterIPs(s), rec.Addr)
}

// lost ends the record lease of a hand-out whose address obj, another Service's allocation, took
// in the window, and counts the window lost if this call ended it.
func (hc *handoutController) lost(ctx context.Context, lease *coordinationv1.Lease, obj *networkingv1.IPAddress) error {
	deleted, err := hc.finish(ctx, lease)
	if deleted {
		hc.metrics.webhookWindowLost.Inc()
		klog.FromContext(ctx).Info("A reserved address the webhook handed out was taken by another Service in the window; the reservation is lost",
			"record", lease.Name, "ip", obj.Name, "takenBy", describeParent(obj.Spec.ParentRef))
	}
	return err
}

// heldByAnother reports whether obj, the IPAddress object of rec's address, is the allocation of
// a Service other than rec's that the Service informer shows holding the address: one whose
// create succeeded.
func (hc *handoutController) heldByAnother(obj *networkingv1.IPAddress, rec handout) bool {
	owner, ok := serviceParent(obj)
	if !ok || owner == rec.For {
		return false
	}
	s, err := hc.services.Services(owner.Namespace).Get(owner.Name)
	return err == nil && containsAddr(clusterIPs(s), rec.Addr)
}

// holdsAnother reports whether the Service informer shows svc holding an address of addr's family
// other than addr.
func (hc *handoutController) holdsAnother(svc types.NamespacedName, addr netip.Addr) bool {
	s, err := hc.services.Services(svc.Namespace).Get(svc.Name)
	if err != nil {
		return false
	}
	return slices.ContainsFunc(clusterIPs(s), func(ip netip.Addr) bool { return ip.Is4() == addr.Is4() && ip != addr })
}

// isServiceAllocation reports whether obj is an allocation of the address to the Service svc.
func isServiceAllocation(obj *networkingv1.IPAddress, svc types.NamespacedName) bool {
	owner, ok := serviceParent(obj)
	return ok && owner == svc
}

// serviceParent returns the Service whose allocation obj is, from its parentRef, and reports
// whether obj is a Service's allocation at all.
func serviceParent(obj *networkingv1.IPAddress) (types.NamespacedName, bool) {
	p := obj.Spec.ParentRef
	if p == nil || p.Group != "" || p.Resource != "services" {
		return types.NamespacedName{}, false
	}
	return types.NamespacedName{Namespace: p.Namespace, Name: p.Name}, true
}

// finish deletes the record lease, with its UID and resourceVersion as preconditions, and reports
// whether this call deleted it. A record already gone is not an error; one changed since (a new
// hand-out of the address) is, so that it is synced again.
func (hc *handoutController) finish(ctx context.Context, lease *coordinationv1.Lease) (bool, error) {
	uid, rv := lease.UID, lease.ResourceVersion
	err := hc.records.client.Delete(ctx, lease.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsNotFound(err):
		return false, nil
	}
	return false, fmt.Errorf("webhook: delete the hand-out record %s: %w", lease.Name, err)
}
