package servicecidr

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/klog/v2"

	"github.com/kube-ipam/clusterip/internal/ipmath"
)

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
	wrote, err := c.setReadyCondition(ctx, sc, metav1.ConditionTrue, ReasonReady, messageReady)
	if wrote {
		logger.V(2).Info("Set Ready=True", "serviceCIDR", sc.Name)
	}
	if err != nil && !apierrors.IsConflict(err) {
		// A conflict only means the cache was behind; the retry reads the new version.
		c.event(sc, EventReasonReadyError, "SetReady", "The ServiceCIDR Status can not be set to Ready=True")
	}
	return err
}

// event emits a Warning Event regarding sc, if there is a Recorder.
func (c *LifecycleController) event(sc *networkingv1.ServiceCIDR, reason, action, note string, args ...any) {
	if c.opts.Recorder != nil {
		c.opts.Recorder.Eventf(sc, nil, corev1.EventTypeWarning, reason, action, note, args...)
	}
}

// setReadyCondition sets sc's Ready condition to status with reason and message through the
// status subresource, and reports whether it wrote. A ServiceCIDR that is gone is no error.
func (c *LifecycleController) setReadyCondition(ctx context.Context, sc *networkingv1.ServiceCIDR, status metav1.ConditionStatus, reason, message string) (bool, error) {
	cp := sc.DeepCopy()
	meta.SetStatusCondition(&cp.Status.Conditions, metav1.Condition{
		Type:               networkingv1.ServiceCIDRConditionReady,
		Status:             status,
		Reason:             reason,
		Message:            message,
		ObservedGeneration: sc.Generation,
	})
	_, err := c.client.NetworkingV1().ServiceCIDRs().UpdateStatus(ctx, cp, metav1.UpdateOptions{})
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsNotFound(err):
		return false, nil
	}
	return false, fmt.Errorf("servicecidr: set Ready=%s (%s) on %s: %w", status, reason, sc.Name, err)
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

// setTerminating sets Ready=False, reason Terminating, on sc unless it has it already, and emits
// an EventReasonTerminating Event when it sets it.
func (c *LifecycleController) setTerminating(ctx context.Context, sc *networkingv1.ServiceCIDR, orphans []netip.Addr) error {
	cond := meta.FindStatusCondition(sc.Status.Conditions, networkingv1.ServiceCIDRConditionReady)
	if cond != nil && cond.Status == metav1.ConditionFalse && cond.Reason == ReasonTerminating {
		return nil
	}
	wrote, err := c.setReadyCondition(ctx, sc, metav1.ConditionFalse, ReasonTerminating,
		fmt.Sprintf("%s (%d IPAddresses, such as %s, are in no other ready ServiceCIDR)", messageTerminating, len(orphans), orphans[0]))
	if wrote {
		c.event(sc, EventReasonTerminating, "Delete", "Deletion blocked: %d IPAddresses, such as %s, are in no other ready ServiceCIDR", len(orphans), orphans[0])
	}
	return err
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
		if o.Name == sc.Name || !Ready(o) {
			continue
		}
		others = append(others, Prefixes(o)...)
	}
	var out []netip.Addr
	for _, ipa := range ips {
		ip, err := netip.ParseAddr(ipa.Name)
		if err != nil || !containsAddr(sc, ip) {
			continue
		}
		if !slices.ContainsFunc(others, func(p netip.Prefix) bool { return ipmath.Usable(p, ip) }) {
			out = append(out, ip)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// containsAddr reports whether some prefix of sc can allocate ip. Every prefix of spec.cidrs
// counts, also one the Allocator does not serve: another allocator (kube-apiserver's) may.
func containsAddr(sc *networkingv1.ServiceCIDR, ip netip.Addr) bool {
	return slices.ContainsFunc(Prefixes(sc), func(p netip.Prefix) bool { return ipmath.Usable(p, ip) })
}
