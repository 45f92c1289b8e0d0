package repair

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/metrics"
	"github.com/kube-ipam/clusterip/ipaddress"
)

// Event reasons and actions, as kube-apiserver's repair controllers emit them.
const (
	reasonNotValid         = "ClusterIPNotValid"
	reasonOutOfRange       = "ClusterIPOutOfRange"
	reasonNotAllocated     = "ClusterIPNotAllocated"
	reasonAlreadyAllocated = "ClusterIPAlreadyAllocated"
	reasonIPNotAllocated   = "IPAddressNotAllocated"
	reasonWrongReference   = "IPAddressWrongReference"

	actionClusterIP = "ClusterIPAllocation"
	actionIPAddress = "IPAddressAllocation"
)

// cause is one reason for an Event about one address of one object: what the Controller
// reports once. A recreated object (another UID) is another cause.
type cause struct {
	namespace, name string
	uid             types.UID
	ip              string // Finding.IP: the canonical address, or an invalid ClusterIP as stored
	reason          string
}

// causeOf returns the cause of an Event with reason regarding obj about ip (as Finding.IP).
func causeOf(obj runtime.Object, ip, reason string) cause {
	k := cause{ip: ip, reason: reason}
	if m, err := meta.Accessor(obj); err == nil {
		k.namespace, k.name, k.uid = m.GetNamespace(), m.GetName(), m.GetUID()
	}
	return k
}

// event emits a Warning Event regarding obj about ip (as Finding.IP), if there is a Recorder, unless the same
// cause (object, address and reason) got one already and every pass since has still found it:
// a finding repair cannot fix (an out-of-range ClusterIP, say) is reported once, not on every
// pass, and a repair retried after a failure is not reported again. A cause a pass no longer
// finds is forgotten, so its return is reported. obj must not be nil.
func (c *Controller) event(obj runtime.Object, ip, reason, action, note string, args ...any) {
	k := causeOf(obj, ip, reason)
	c.mu.Lock()
	if c.found != nil {
		c.found[k] = struct{}{}
	}
	_, already := c.reported[k]
	c.reported[k] = struct{}{}
	c.mu.Unlock()
	if !already && c.opts.Recorder != nil {
		c.opts.Recorder.Eventf(obj, nil, corev1.EventTypeWarning, reason, action, note, args...)
	}
}

// reportedUnfixable reports whether a pass has reported the address ip of svc as one repair
// cannot fix (invalid, held by another Service too, or out of range) and every pass since has
// still found it so: following svc would bring a pass forward for nothing.
func (c *Controller) reportedUnfixable(svc *corev1.Service, ip netip.Addr) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, reason := range []string{reasonOutOfRange, reasonNotValid, reasonAlreadyAllocated} {
		if _, ok := c.reported[causeOf(svc, ip.String(), reason)]; ok {
			return true
		}
	}
	return false
}

// startFindingCauses starts collecting the causes of the Events a pass emits, once its audit
// has succeeded; endFindingCauses ends it, keeping in reported only the causes the pass found.
func (c *Controller) startFindingCauses() {
	c.mu.Lock()
	c.found = map[cause]struct{}{}
	c.mu.Unlock()
}

// endFindingCauses: see startFindingCauses.
func (c *Controller) endFindingCauses() {
	c.mu.Lock()
	c.reported, c.found = c.found, nil
	c.mu.Unlock()
}

// reportOnly emits the Event of a finding repair does not act on, counts it, and reports whether
// f was one.
func (c *Controller) reportOnly(f *finding) bool {
	switch f.Class {
	case Invalid:
		c.metrics.IPErrors(metrics.RepairInvalid, max(f.holders, 1))
	case DuplicateOwner:
		c.metrics.IPErrors(metrics.RepairDuplicate, f.holders-1)
	case OutOfRange:
		c.metrics.IPErrors(metrics.RepairOutOfRange, 1)
	default:
		return false
	}
	if f.svc == nil {
		return true // an invalid IPAddress name: no Service to tell
	}
	switch f.Class {
	case Invalid:
		c.event(f.svc, f.IP, reasonNotValid, actionClusterIP, "Cluster IP %s is not a valid IP; please recreate Service", f.IP)
	case DuplicateOwner:
		c.event(f.svc, f.IP, reasonAlreadyAllocated, actionClusterIP, "Cluster IP %s was assigned to multiple Services; please recreate Service", f.IP)
	case OutOfRange:
		c.event(f.svc, f.IP, reasonOutOfRange, actionClusterIP, "Cluster IP %s is not within any configured Service CIDR; please recreate Service", f.IP)
	}
	return true
}

// repairIPAddresses acts on the IPAddress side of the findings of an IPAddressOnly or DualWrite
// audit. It returns how many leaks it held off, the IPs whose leaked IPAddress it deleted, and
// the repairs to retry one by one: those that failed (their errors joined in the error) and the
// leaks it held off.
func (c *Controller) repairIPAddresses(ctx context.Context, res result) (int, map[netip.Addr]bool, []retry, error) {
	var held int
	var errs []error
	var retries []retry
	deleted := map[netip.Addr]bool{}
	for i := range res.findings {
		f := &res.findings[i]
		if c.reportOnly(f) {
			continue
		}
		after, gone, err := c.repairOne(ctx, f)
		switch {
		case err != nil:
			errs = append(errs, err)
			retries = append(retries, retry{f: *f})
		case after > 0:
			held++
			retries = append(retries, retry{f: *f, after: after})
		case gone:
			deleted[f.addr] = true
		}
	}
	return held, deleted, retries, errors.Join(errs...)
}

// repairOne makes the IPAddress repair of one finding that is not report-only: it creates a
// missing IPAddress, fixes a wrong parent or wrong labels, or deletes a leaked IPAddress. It
// returns how long the hold-off keeps a leak still (0 if it does not), whether it deleted one,
// and the error of a write that failed. Every decision is confirmed against live state first.
func (c *Controller) repairOne(ctx context.Context, f *finding) (after time.Duration, deleted bool, err error) {
	switch {
	case f.Class == Missing:
		err = c.createMissing(ctx, f)
	case f.Class == WrongParent && f.labels:
		err = c.fixLabels(ctx, f)
	case f.Class == WrongParent:
		err = c.fixParent(ctx, f)
	case f.Class == Leaked:
		after, deleted, err = c.deleteLeaked(ctx, f)
	}
	if err != nil {
		err = fmt.Errorf("repair %s %s: %w", f.Class, f.IP, err)
	}
	return after, deleted, err
}

// liveHolder gets svc from the API server and returns it if it is still the same Service and still
// holds ip (in any spelling of its ClusterIPs), or nil.
func (c *Controller) liveHolder(ctx context.Context, svc *corev1.Service, ip netip.Addr) (*corev1.Service, error) {
	live, err := c.cfg.Client.CoreV1().Services(svc.Namespace).Get(ctx, svc.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, err
	case live.UID != svc.UID || !holds(live, ip):
		return nil, nil
	}
	return live, nil
}

// liveUnchanged gets ipa from the API server and reports whether it is still the object the audit
// read (same UID and resourceVersion).
func (c *Controller) liveUnchanged(ctx context.Context, ipa *networkingv1.IPAddress) (bool, error) {
	live, err := c.cfg.Client.NetworkingV1().IPAddresses().Get(ctx, ipa.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, err
	}
	return live.UID == ipa.UID && live.ResourceVersion == ipa.ResourceVersion, nil
}

// managedBy returns the managed-by label the Controller gives the IPAddress objects it creates or
// relabels: Config.ManagedBy, or ipaddress.DefaultManagedBy, kube-apiserver's, when that is empty.
func (c *Controller) managedBy() string { return managedByOrDefault(c.cfg.ManagedBy) }

// createMissing creates the IPAddress of a Service that has none, once a live Get confirms the
// Service still holds the IP.
func (c *Controller) createMissing(ctx context.Context, f *finding) error {
	svc, err := c.liveHolder(ctx, f.svc, f.addr)
	if err != nil || svc == nil {
		return err
	}
	c.event(svc, f.IP, reasonNotAllocated, actionClusterIP, "Cluster IP [%s]: %s is not allocated; repairing", allocator.FamilyOf(f.addr), f.IP)
	c.metrics.IPErrors(metrics.RepairRepair, 1)
	_, err = c.cfg.Client.NetworkingV1().IPAddresses().Create(ctx, ipaddress.ObjectFor(f.addr, allocator.ServiceOwner(svc), c.managedBy()), metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil // created meanwhile; the next pass judges it
	}
	if err == nil {
		klog.FromContext(ctx).V(2).Info("Created a missing IPAddress", "ip", f.IP, "service", f.Service)
	}
	return err
}

// deleteLeaked deletes an IPAddress no Service holds once it is older than the hold-off and a live
// Get confirms it is unchanged and its parent does not hold it; the delete carries a UID and
// resourceVersion precondition. It returns how long the hold-off keeps it still (0 once over) and
// whether it deleted it.
//
// An IPAddress whose parent exists, does not hold it and is older than it is held off for at
// least newerThanParentGrace from its creation (kubernetes#132321): kube-apiserver deletes that
// one itself once the create of the existing Service fails. One whose parent is still of type
// ExternalName is held off for at least externalNameParentGrace (kubernetes#135503). Past that, it is deleted with
// kube-apiserver's IPAddressWrongReference Event; one whose parent is gone, with
// IPAddressNotAllocated.
func (c *Controller) deleteLeaked(ctx context.Context, f *finding) (after time.Duration, deleted bool, err error) {
	age := c.now().Sub(f.ipa.CreationTimestamp.Time)
	if grace := c.opts.leakGrace(); age < grace {
		return grace - age, false, nil
	}
	same, err := c.liveUnchanged(ctx, f.ipa)
	if err != nil || !same {
		return 0, false, err
	}
	reason, note, args := reasonIPNotAllocated, "IPAddress %s appears to have leaked, cleaning up", []any{f.IP}
	if p := f.ipa.Spec.ParentRef; p != nil && p.Group == "" && p.Resource == "services" {
		parent := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}}
		live, err := c.cfg.Client.CoreV1().Services(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		switch {
		case err == nil && holds(live, f.addr):
			return 0, false, nil // its parent holds it now
		case err == nil && live.CreationTimestamp.Before(&f.ipa.CreationTimestamp) && age < newerThanParentGrace:
			return newerThanParentGrace - age, false, nil // a create of an existing Service, being undone
		case err == nil && live.Spec.Type == corev1.ServiceTypeExternalName && age < externalNameParentGrace:
			return externalNameParentGrace - age, false, nil // an update from ExternalName, in flight
		case err == nil:
			reason, note, args = reasonWrongReference, "IPAddress %s for Service %s has a wrong reference; cleaning up", []any{f.IP, serviceKey(parent)}
		case !apierrors.IsNotFound(err):
			return 0, false, fmt.Errorf("get parent %s: %w", serviceKey(parent), err)
		}
	}
	c.event(f.ipa, f.IP, reason, actionIPAddress, note, args...)
	c.metrics.IPErrors(metrics.RepairLeak, 1)
	err = c.cfg.Client.NetworkingV1().IPAddresses().Delete(ctx, f.ipa.Name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{UID: &f.ipa.UID, ResourceVersion: &f.ipa.ResourceVersion},
	})
	switch {
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
		return 0, false, nil // gone or changed meanwhile; the next pass judges it
	case err != nil:
		return 0, false, err
	}
	klog.FromContext(ctx).V(2).Info("Deleted a leaked IPAddress", "ip", f.IP)
	return 0, true, nil
}

// fixLabels gives an IPAddress whose parentRef is right the labels a Service IP allocator gives
// it, once a live Get confirms its Service still holds the IP. The update carries the
// resourceVersion the audit read, so it fails with a Conflict (and waits for the next pass) if
// the object changed meanwhile; the address is never free.
func (c *Controller) fixLabels(ctx context.Context, f *finding) error {
	svc, err := c.liveHolder(ctx, f.svc, f.addr)
	if err != nil || svc == nil {
		return err
	}
	upd := f.ipa.DeepCopy()
	if upd.Labels == nil {
		upd.Labels = map[string]string{}
	}
	upd.Labels[networkingv1.LabelIPAddressFamily] = string(allocator.FamilyOf(f.addr))
	if !isAllocatorManagedBy(upd.Labels[networkingv1.LabelManagedBy], c.cfg.ManagedBy) {
		upd.Labels[networkingv1.LabelManagedBy] = c.managedBy()
	}
	c.metrics.IPErrors(metrics.RepairRepair, 1)
	_, err = c.cfg.Client.NetworkingV1().IPAddresses().Update(ctx, upd, metav1.UpdateOptions{})
	switch {
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
		return nil // gone or changed meanwhile; the next pass judges it
	case err != nil:
		return err
	}
	klog.FromContext(ctx).V(2).Info("Fixed the labels of an IPAddress", "ip", f.IP, "service", f.Service)
	return nil
}

// fixParent recreates an IPAddress whose parentRef names another Service than the one holding
// its IP, once live Gets confirm both; the delete carries a UID and resourceVersion precondition.
func (c *Controller) fixParent(ctx context.Context, f *finding) error {
	same, err := c.liveUnchanged(ctx, f.ipa)
	if err != nil || !same {
		return err
	}
	svc, err := c.liveHolder(ctx, f.svc, f.addr)
	if err != nil || svc == nil {
		return err
	}
	c.event(f.ipa, f.IP, reasonWrongReference, actionIPAddress, "IPAddress %s for Service %s has a wrong reference %s; cleaning up", f.IP, f.Service, parentString(f.ipa))
	c.metrics.IPErrors(metrics.RepairRepair, 1)
	err = c.cfg.Client.NetworkingV1().IPAddresses().Delete(ctx, f.ipa.Name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{UID: &f.ipa.UID, ResourceVersion: &f.ipa.ResourceVersion},
	})
	switch {
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
		return nil
	case err != nil:
		return err
	}
	_, err = c.cfg.Client.NetworkingV1().IPAddresses().Create(ctx, ipaddress.ObjectFor(f.addr, allocator.ServiceOwner(svc), c.managedBy()), metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// repairBitmaps acts on the bitmap side of the findings of a Legacy or DualWrite audit and writes
// each changed (or missing) bitmap back with a compare-and-swap on the revision the audit read, so
// a concurrent allocation fails the write instead of being undone. It sets the bit of every IP a
// Service holds whose bit is clear. It clears a leaked bit once the Controller has seen it leaked
// for the hold-off, and in Legacy mode on 3 passes as kube-apiserver does; in DualWrite mode a
// bit with no IPAddress object (bitmap-only) only after a live Get finds none, and the bit of a
// leaked IPAddress only once repairIPAddresses has deleted it (deleted). It returns how many
// leaked bits it held off.
func (c *Controller) repairBitmaps(ctx context.Context, w *world, res result, deleted map[netip.Addr]bool) (int, error) {
	legacy := c.cfg.Mode == featuregate.Legacy
	now := c.now()
	targets := make([]*bitmapTarget, len(w.bitmaps))
	for i, b := range w.bitmaps {
		targets[i] = &bitmapTarget{b: b.Clone(), changed: w.revs[i] == 0}
	}
	seen := map[netip.Addr]bool{}
	var held int
	var errs []error
	for i := range res.findings {
		f := &res.findings[i]
		if legacy {
			c.reportOnly(f)
		}
		if f.bm < 0 {
			continue
		}
		t := targets[f.bm]
		switch {
		case f.svc != nil && f.Class != Invalid && f.Class != OutOfRange: // a Service holds it: its bit must be set
			if f.bit || !f.inBitmap {
				continue // set, or no bit to set: outside the flag range, or beyond its slots
			}
			if err := t.b.Allocate(ctx, f.addr, allocator.Owner{}); err != nil {
				c.metrics.IPErrors(metrics.RepairUnknown, 1)
				klog.FromContext(ctx).Error(err, "Cannot set the bit of a Service's IP", "ip", f.IP, "service", f.Service)
				continue
			}
			t.changed = true
			switch {
			case legacy && f.Class == Missing:
				c.event(f.svc, f.IP, reasonNotAllocated, actionClusterIP, "Cluster IP [%s]: %s is not allocated; repairing", allocator.FamilyOf(f.addr), f.IP)
				c.metrics.IPErrors(metrics.RepairRepair, 1)
			case f.Class == IPAddressOnly:
				c.metrics.IPErrors(metrics.RepairRepair, 1)
			}
		case f.Class == Leaked && !legacy:
			if f.bit && deleted[f.addr] {
				_ = t.b.Release(ctx, f.addr)
				t.changed = true
			}
		case f.Class == Leaked || f.Class == BitmapOnly:
			seen[f.addr] = true
			if !c.leakedLongEnough(f.addr, now, legacy) {
				held++
				continue
			}
			if !legacy {
				_, err := c.cfg.Client.NetworkingV1().IPAddresses().Get(ctx, f.IP, metav1.GetOptions{})
				if !apierrors.IsNotFound(err) {
					if err != nil {
						errs = append(errs, fmt.Errorf("repair: confirm stale bit %s: %w", f.IP, err))
					}
					continue // an IPAddress appeared: an allocation in flight, not a stale bit
				}
			}
			if err := t.b.Release(ctx, f.addr); err == nil {
				t.changed = true
				t.freed = append(t.freed, f.addr)
				c.metrics.IPErrors(metrics.RepairLeak, 1)
			}
		}
	}
	c.mu.Lock()
	for ip := range c.leaks {
		if !seen[ip] {
			delete(c.leaks, ip) // held again, or freed: start over if it leaks again
		}
	}
	c.mu.Unlock()

	for i, t := range targets {
		if !t.changed {
			continue
		}
		store := c.cfg.Bitmaps.Store(i)
		// The bitmap stored at the audit's revision is the one the audit read, so t, worked out
		// from that read, is what to store; if the revision moved on, the write fails.
		err := bitmap.Modify(ctx, store, c.cfg.Ranges[i], func(a *bitmap.Allocator) (bool, error) {
			return true, a.Restore(t.b.Snapshot())
		}, bitmap.WithRevision(w.revs[i]), bitmap.WithProjection())
		if err != nil {
			errs = append(errs, fmt.Errorf("repair: write the bitmap of %s at %s: %w", t.b.CIDR(), storeName(store), err))
			continue
		}
		c.mu.Lock()
		for _, ip := range t.freed {
			delete(c.leaks, ip)
		}
		c.mu.Unlock()
		klog.FromContext(ctx).V(2).Info("Repaired a bitmap", "range", t.b.CIDR(), "freed", len(t.freed))
	}
	return held, errors.Join(errs...)
}

// leakedLongEnough records one more sighting of a leaked bit at now and reports whether it may be
// freed: seen leaked for the hold-off and, in Legacy mode, on 3 passes.
func (c *Controller) leakedLongEnough(ip netip.Addr, now time.Time, legacy bool) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.leaks[ip]
	if !ok {
		l.since = now
	}
	l.passes++
	c.leaks[ip] = l
	if legacy && l.passes < legacyLeakPasses {
		return false
	}
	return now.Sub(l.since) >= c.opts.leakGrace()
}

// bitmapTarget is the bitmap repair wants one family to have.
type bitmapTarget struct {
	b       *bitmap.Allocator
	changed bool
	freed   []netip.Addr
}

// rewriteBitmapsOfOtherRanges rewrites, in Legacy and DualWrite mode, each stored bitmap whose
// range is not its flag range (--service-cluster-ip-range changed) to the flag range, as
// kube-apiserver's Legacy repair does on its first pass after such a change; until then every
// Legacy allocation fails, and DualWrite writes no bits. (kube-apiserver's DualWrite repair leaves
// bitmaps alone; this one heals the mirror, as it heals its bits.) It keeps
// the bits of the old bitmap whose addresses the flag range serves, so that a Service's stays set
// and a leaked one is held off like any other, and drops the rest. The write is a
// compare-and-swap on the revision read; a bitmap that is missing, of the flag range, or
// unreadable is left for read to judge.
func (c *Controller) rewriteBitmapsOfOtherRanges(ctx context.Context) error {
	for i, r := range c.cfg.Ranges {
		store := c.cfg.Bitmaps.Store(i)
		snap, rev, err := store.Get(ctx)
		if err != nil {
			return fmt.Errorf("repair: read the bitmap of %s at %s: %w", r, storeName(store), err)
		}
		if rev == 0 {
			continue
		}
		b, other, err := bitmap.Project(snap, r)
		if err != nil || !other {
			continue // a bitmap that does not decode is the audit's to report
		}
		// The projection is the change: Modify writes it back at rev, once.
		err = bitmap.Modify(ctx, store, r, func(*bitmap.Allocator) (bool, error) { return false, nil },
			bitmap.WithRevision(rev), bitmap.WithProjection())
		if err != nil {
			return fmt.Errorf("repair: rewrite the bitmap of %s at %s to %s: %w", snap.Range, storeName(store), r, err)
		}
		klog.FromContext(ctx).Info("Rewrote a bitmap of another range to the flag range", "key", storeName(store), "stored", snap.Range, "range", r, "kept", b.Used())
	}
	return nil
}
