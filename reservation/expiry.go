package reservation

import (
	"context"
	"fmt"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	networkingv1informers "k8s.io/client-go/informers/networking/v1"
	"k8s.io/client-go/kubernetes"
	networkingv1client "k8s.io/client-go/kubernetes/typed/networking/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/kube-ipam/clusterip/allocator"
)

// ExpiryControllerName names the ExpiryController in its log lines.
const ExpiryControllerName = "clusterip-reservation-expiry"

// ExpiryController deletes each reservation when it ends ([Reservation.Expires]): the end of a
// cooldown frees the address. It follows an IPAddress informer and keeps, in a typed delaying
// workqueue, each reservation with an end until then; at its end it reads the object from the
// API server and deletes it with UID and resourceVersion preconditions if it is still that
// reservation, ended (one claimed, renewed or released meanwhile is left alone). Several
// ExpiryControllers may run on one cluster: a delete that loses the race gets a Conflict or
// NotFound and is dropped.
type ExpiryController struct {
	client   networkingv1client.IPAddressInterface
	informer cache.SharedIndexInformer
	reg      cache.ResourceEventHandlerRegistration
	queue    workqueue.TypedRateLimitingInterface[string]
	now      func() time.Time
}

// NewExpiryController returns an ExpiryController that follows informer, which the caller
// starts, and deletes with client. A nil client or informer is an error matching
// allocator.ErrInvalid.
func NewExpiryController(client kubernetes.Interface, informer networkingv1informers.IPAddressInformer) (*ExpiryController, error) {
	if client == nil || informer == nil {
		return nil, fmt.Errorf("reservation: NewExpiryController needs a client and an IPAddress informer: %w", allocator.ErrInvalid)
	}
	c := &ExpiryController{
		client:   client.NetworkingV1().IPAddresses(),
		informer: informer.Informer(),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: ExpiryControllerName}),
		now: time.Now,
	}
	reg, err := c.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.enqueue,
		UpdateFunc: func(_, obj any) { c.enqueue(obj) },
	})
	if err != nil {
		return nil, fmt.Errorf("reservation: follow the IPAddress informer: %w", err)
	}
	c.reg = reg
	return c, nil
}

// enqueue queues a reservation with an end for then.
func (c *ExpiryController) enqueue(obj any) {
	ipa, ok := obj.(*networkingv1.IPAddress)
	if !ok {
		return
	}
	r, ok := FromObject(ipa)
	if !ok || r.Expires.IsZero() {
		return
	}
	c.queue.AddAfter(ipa.Name, r.Expires.Sub(c.now()))
}

// Run deletes ended reservations until ctx is done, after the informer's handler has synced.
func (c *ExpiryController) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithValues("controller", ExpiryControllerName)
	ctx = klog.NewContext(ctx, logger)
	defer c.queue.ShutDown()
	stop := context.AfterFunc(ctx, c.queue.ShutDown)
	defer stop()
	if !cache.WaitForCacheSync(ctx.Done(), c.reg.HasSynced) {
		return nil
	}
	for {
		name, shutdown := c.queue.Get()
		if shutdown {
			return nil
		}
		if err := c.expire(ctx, name); err != nil {
			logger.Error(err, "Deleting an ended reservation failed; retrying", "ip", name)
			c.queue.AddRateLimited(name)
		} else {
			c.queue.Forget(name)
		}
		c.queue.Done(name)
	}
}

// expire deletes the reservation named name if the API server still holds it and it has ended;
// one whose end is still ahead is queued again for then.
func (c *ExpiryController) expire(ctx context.Context, name string) error {
	obj, err := c.client.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	r, ok := FromObject(obj)
	if !ok || r.Expires.IsZero() {
		return nil // claimed, or no end any more
	}
	if left := r.Expires.Sub(c.now()); left > 0 {
		c.queue.AddAfter(name, left)
		return nil
	}
	err = c.client.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &obj.UID, ResourceVersion: &obj.ResourceVersion}})
	switch {
	case err == nil:
		klog.FromContext(ctx).V(2).Info("Deleted an ended reservation", "ip", name, "expires", r.Expires)
		return nil
	case apierrors.IsNotFound(err):
		return nil
	case apierrors.IsConflict(err):
		c.queue.Add(name) // changed meanwhile: judge it again
		return nil
	}
	return err
}
