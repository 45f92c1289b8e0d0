package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"

	"github.com/kube-ipam/clusterip/reservation"
)

// Finalizer is the finalizer a Service whose release policy is Retain carries while the webhook
// is installed: the [Handler] adds it to the Service at its create or update, and the
// [Controller] removes it once it has queued the Service's addresses to be kept, so that a
// Retain Service deleted while the Controller is down keeps its addresses (see the package doc).
const Finalizer = "clusterip.kube-ipam.io/retain"

// hasFinalizer reports whether svc lists [Finalizer].
func hasFinalizer(svc *corev1.Service) bool {
	return slices.Contains(svc.Finalizers, Finalizer)
}

// wantsFinalizer reports whether svc, not being deleted, should carry [Finalizer]: its release
// policy parses and is Retain (with or without a duration), and its type has a ClusterIP (not
// ExternalName, not headless), so that its delete has addresses to keep.
func wantsFinalizer(svc *corev1.Service) bool {
	p, err := reservation.ReleasePolicyOf(svc.Annotations)
	if err != nil || !p.Retain || svc.Spec.Type == corev1.ServiceTypeExternalName {
		return false
	}
	return svc.Spec.ClusterIP != corev1.ClusterIPNone && (len(svc.Spec.ClusterIPs) == 0 || svc.Spec.ClusterIPs[0] != corev1.ClusterIPNone)
}

// finalizerPatch returns the JSONPatch operations that add [Finalizer] to svc, the object of a
// Service CREATE or UPDATE review: none when svc is being deleted (kube-apiserver refuses a new
// finalizer then), already has it or does not want it. An absent or empty list is set whole; a
// finalizer is appended to a list that has others.
func finalizerPatch(svc *corev1.Service) []map[string]any {
	if svc.DeletionTimestamp != nil || hasFinalizer(svc) || !wantsFinalizer(svc) {
		return nil
	}
	if len(svc.Finalizers) == 0 {
		return []map[string]any{{"op": "add", "path": "/metadata/finalizers", "value": []string{Finalizer}}}
	}
	return []map[string]any{{"op": "add", "path": "/metadata/finalizers/-", "value": Finalizer}}
}

// withPatch returns resp with ops as its JSONPatch, or resp unchanged when there are no ops (or,
// which cannot happen with the ops of this package, they do not encode).
func withPatch(resp *admissionv1.AdmissionResponse, ops []map[string]any) *admissionv1.AdmissionResponse {
	if len(ops) == 0 {
		return resp
	}
	patch, err := json.Marshal(ops)
	if err != nil {
		return resp
	}
	pt := admissionv1.PatchTypeJSONPatch
	resp.Patch, resp.PatchType = patch, &pt
	return resp
}

// finalizerAction is what the [Controller] does about [Finalizer] on one Service.
type finalizerAction int

const (
	// finalizerNone: nothing to do.
	finalizerNone finalizerAction = iota
	// finalizerAdd: a live Service that wants the finalizer lacks it (created before the webhook
	// was installed, or while it was down); added if the webhook is sent the Service's creates.
	finalizerAdd
	// finalizerRemove: a live Service that no longer wants the finalizer has it.
	finalizerRemove
	// finalizerRelease: a Service being deleted has the finalizer and no other: its addresses
	// are queued to be kept, and then the finalizer is removed.
	finalizerRelease
)

// String names a for test failures.
func (a finalizerAction) String() string {
	switch a {
	case finalizerAdd:
		return "add"
	case finalizerRemove:
		return "remove"
	case finalizerRelease:
		return "release"
	}
	return "none"
}

// decideFinalizer returns what the Controller does about [Finalizer] on svc. A Service being
// deleted that has other finalizers too waits: ours goes last, once kube-apiserver deletes the
// Service as soon as it goes, so that the addresses are released while their retention waits
// (a bounded time) for them. The update that removes the last other finalizer decides again.
func decideFinalizer(svc *corev1.Service) finalizerAction {
	has := hasFinalizer(svc)
	switch {
	case svc.DeletionTimestamp != nil:
		if has && len(svc.Finalizers) == 1 {
			return finalizerRelease
		}
		return finalizerNone
	case !has && wantsFinalizer(svc):
		return finalizerAdd
	case has && !wantsFinalizer(svc):
		return finalizerRemove
	}
	return finalizerNone
}

// enqueueFinalizer queues the key of a Service an informer event shows, when something is to be
// done about its [Finalizer].
func (c *Controller) enqueueFinalizer(obj any) {
	svc, ok := obj.(*corev1.Service)
	if !ok || decideFinalizer(svc) == finalizerNone {
		return
	}
	c.finalizers.Add(types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name})
}

// deletedAt returns when svc's delete began: its deletionTimestamp, or now for a Service deleted
// without one (no finalizer held it).
func deletedAt(svc *corev1.Service, now func() time.Time) time.Time {
	if svc.DeletionTimestamp != nil {
		return svc.DeletionTimestamp.Time
	}
	return now()
}

// processNextFinalizer handles one queued Service key and reports whether the queue is still
// open.
func (c *Controller) processNextFinalizer(ctx context.Context) bool {
	key, shutdown := c.finalizers.Get()
	if shutdown {
		return false
	}
	defer c.finalizers.Done(key)
	if err := c.syncFinalizer(ctx, key); err != nil {
		if ctx.Err() != nil {
			c.finalizers.Forget(key)
			return true
		}
		klog.FromContext(ctx).Error(err, "Updating the finalizer of a Service failed; retrying", "service", key, "finalizer", Finalizer)
		c.finalizers.AddRateLimited(key)
		return true
	}
	c.finalizers.Forget(key)
	return true
}

// syncFinalizer does what [decideFinalizer] says for the Service key as the informer holds it. A
// Service being deleted has each of its addresses queued to be kept (from its deletionTimestamp)
// before the finalizer is removed: once it is, kube-apiserver deletes the Service and releases
// the addresses, and the queued items wait for that. Each write is a merge patch of the whole
// finalizer list with the resourceVersion it was computed from as a precondition, so that it
// removes or adds only ours; a conflict (the informer was behind) is tried again from the
// informer, with client-go's retry backoff.
func (c *Controller) syncFinalizer(ctx context.Context, key types.NamespacedName) error {
	logger := klog.FromContext(ctx).WithValues("service", key, "finalizer", Finalizer)
	return retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		svc, err := c.services.Services(key.Namespace).Get(key.Name)
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		others := slices.DeleteFunc(slices.Clone(svc.Finalizers), func(f string) bool { return f == Finalizer })
		var list []string
		switch decideFinalizer(svc) {
		case finalizerNone:
			return nil
		case finalizerAdd:
			if c.sent != nil {
				sent, err := c.sent.Selects(svc)
				if err != nil {
					return err
				}
				if !sent {
					return nil // the webhook would never hand its addresses back
				}
			}
			list = append(others, Finalizer)
		case finalizerRemove:
			list = others
		case finalizerRelease:
			rest := clusterIPs(svc)
			if c.sent != nil && c.sent.GuardsReleases() {
				if rest, err = c.keepInPlace(ctx, svc); err != nil {
					return err
				}
			}
			c.queueRetain(svc, rest) // in memory before the finalizer goes; see the package doc
			c.released.add(svc.UID)
			list = others
		}
		if list == nil {
			list = []string{}
		}
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": svc.ResourceVersion, "finalizers": list}})
		if err != nil {
			return err
		}
		_, err = c.serviceClient.Services(key.Namespace).Patch(ctx, key.Name, types.MergePatchType, patch, metav1.PatchOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case err != nil:
			if apierrors.IsConflict(err) {
				return err // as it is, for RetryOnConflict
			}
			return fmt.Errorf("webhook: patch the finalizers of Service %s: %w", key, err)
		}
		logger.V(2).Info("Updated the finalizer of a Service", "has", slices.Contains(list, Finalizer))
		return nil
	})
}

// queueRetain queues ips, ClusterIPs of svc, which is being deleted, to be kept as its release
// policy says, counted from its deletionTimestamp, once kube-apiserver has released them. The
// caller marks svc's UID released, so that [Controller.deleted] queues nothing more at the
// Service's delete event: an address handled twice would count one lost window twice.
func (c *Controller) queueRetain(svc *corev1.Service, ips []netip.Addr) {
	policy, err := reservation.ReleasePolicyOf(svc.Annotations)
	if err != nil {
		return
	}
	for _, ip := range ips {
		c.queue.Add(retainItemOf(svc, ip, policy, c.now))
	}
}

// retainItemOf is the item of ip, a ClusterIP of svc, which is being deleted, under policy.
func retainItemOf(svc *corev1.Service, ip netip.Addr, policy reservation.ReleasePolicy, now func() time.Time) retainItem {
	return retainItem{
		For:     types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name},
		Labels:  labels.Set(svc.Labels).String(),
		Addr:    ip,
		Policy:  policy,
		Deleted: deletedAt(svc, now),
	}
}

// keepInPlace turns each allocation of svc, which is being deleted and still holds its
// addresses, that its release policy keeps (within the caps, [Controller.keptOnDelete]) into the
// reservation kept for it, in one update of the IPAddress object guarded by its resourceVersion,
// as a registry's Retain does: the address is never free. It is called only while the webhook's
// configuration makes kube-apiserver's release of such a reservation, at the Service's delete, go
// through the [Handler], which refuses it ([Sent.GuardsReleases]). It returns the addresses it
// could not keep so, for the usual path after the release: those whose object is gone or is not
// svc's allocation. Addresses the policy does not keep are in neither: they are released. A
// Service the webhook is not sent keeps nothing.
func (c *Controller) keepInPlace(ctx context.Context, svc *corev1.Service) ([]netip.Addr, error) {
	policy, err := reservation.ReleasePolicyOf(svc.Annotations)
	if err != nil {
		return nil, nil
	}
	if sent, err := c.sent.Selects(svc); err != nil || !sent {
		return nil, err
	}
	var rest []netip.Addr
	for _, ip := range clusterIPs(svc) {
		item := retainItemOf(svc, ip, policy, c.now)
		r, ok := c.keptOnDelete(item)
		if !ok {
			continue
		}
		want, err := reservation.ObjectFor(r)
		if err != nil {
			continue
		}
		kept, err := reservation.Keep(ctx, c.client, want, func(obj *networkingv1.IPAddress) bool { return isServiceAllocation(obj, item.For) })
		if err != nil {
			return nil, fmt.Errorf("webhook: keep %s for %s: %w", want.Name, item.For, err)
		}
		if !kept {
			rest = append(rest, ip)
			continue
		}
		c.metrics.keptInPlace.Inc()
		klog.FromContext(ctx).V(2).Info("Kept the address of a Service being deleted as its reservation", "ip", ip, "service", item.For, "expires", r.Expires)
	}
	return rest, nil
}

// uidSet is a set of Service UIDs. The zero uidSet is empty and ready; it is safe for concurrent
// use.
type uidSet struct {
	mu  sync.Mutex
	set map[types.UID]struct{} // guarded by mu
}

// add puts uid in s; not an empty one (an object that has none is no one's).
func (s *uidSet) add(uid types.UID) {
	if uid == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.set == nil {
		s.set = map[types.UID]struct{}{}
	}
	s.set[uid] = struct{}{}
}

// take removes uid from s and reports whether it was there.
func (s *uidSet) take(uid types.UID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.set[uid]
	delete(s.set, uid)
	return ok
}
