package servicecidr

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/klog/v2"

	"github.com/kube-ipam/clusterip/allocator"
)

// prefixesOf returns the prefixes of sc of the Allocator's family that an allocator can serve.
// Those it cannot serve are skipped, and logged once per ServiceCIDR and CIDR.
func (a *Allocator) prefixesOf(logger klog.Logger, sc *networkingv1.ServiceCIDR) []netip.Prefix {
	var ps []netip.Prefix
	for _, c := range specCIDRsOf(sc) {
		if c.prefix.IsValid() && allocator.FamilyOf(c.prefix.Addr()) != a.family {
			continue
		}
		if c.err != nil {
			if _, logged := a.skipped.LoadOrStore(string(sc.UID)+"/"+sc.Name+"/"+c.text, true); !logged {
				logger.Error(c.err, "Not allocating from a CIDR of a ServiceCIDR", "serviceCIDR", sc.Name, "cidr", c.text)
			}
			continue
		}
		ps = append(ps, c.prefix)
	}
	return ps
}

// desired returns, for every prefix of the family in the informer's cache, the ServiceCIDRs that
// hold it and whether each is ready.
func (a *Allocator) desired(logger klog.Logger) (map[netip.Prefix]map[string]bool, error) {
	list, err := a.lister.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	want := map[netip.Prefix]map[string]bool{}
	for _, sc := range list {
		for _, p := range a.prefixesOf(logger, sc) {
			if want[p] == nil {
				want[p] = map[string]bool{}
			}
			want[p][sc.Name] = Ready(sc)
		}
	}
	return want, nil
}

func anyReady(refs map[string]bool) bool {
	for _, r := range refs {
		if r {
			return true
		}
	}
	return false
}

// syncAll reconciles the per-CIDR allocators with every ServiceCIDR of the family in the cache:
// it creates allocators for new prefixes, sets the readiness of each, and closes those of prefixes
// no ServiceCIDR holds any more. It is level-based: one pass brings any state up to date.
func (a *Allocator) syncAll(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	want, err := a.desired(logger)
	if err != nil {
		return err
	}

	// Build allocators for new prefixes without holding mu: callers keep allocating meanwhile.
	a.mu.RLock()
	closed := a.closed
	var missing []netip.Prefix
	for p := range want {
		if a.entries[p] == nil {
			missing = append(missing, p)
		}
	}
	a.mu.RUnlock()
	if closed {
		return nil
	}
	var errs []error
	created := map[netip.Prefix]cidrAllocator{}
	for _, p := range missing {
		al, err := a.factory(logger, p)
		if err != nil {
			if errors.Is(err, allocator.ErrInvalid) {
				// Retrying cannot help (an IPv6 prefix shorter than /64, say).
				logger.Error(err, "Cannot allocate from a ServiceCIDR prefix", "cidr", p)
				continue
			}
			errs = append(errs, fmt.Errorf("servicecidr: allocator for %s: %w", p, err))
			continue
		}
		created[p] = al
	}

	// Apply the cache as it is now rather than as it was: a ServiceCIDR deleted meanwhile is gone
	// from it, so its reference, dropped by the delete handler, is not brought back.
	if want, err = a.desired(logger); err != nil {
		errs = append(errs, err)
		want = nil
	}
	var drop []*entry
	a.mu.Lock()
	if a.closed {
		want = nil
	}
	for p, refs := range want {
		e := a.entries[p]
		if e == nil {
			al, ok := created[p]
			if !ok {
				continue // added after the first pass; its event queued another sync
			}
			delete(created, p)
			e = &entry{prefix: p, alloc: al}
			a.entries[p] = e
			logger.V(2).Info("Allocating from a new ServiceCIDR prefix", "cidr", p, "serviceCIDRs", refs)
		}
		e.refs = refs
		ready := anyReady(refs)
		if ready != e.ready {
			logger.V(2).Info("ServiceCIDR prefix readiness changed", "cidr", p, "ready", ready)
		}
		e.ready = ready
		e.alloc.SetReady(ready)
	}
	if want != nil {
		for p, e := range a.entries {
			if _, ok := want[p]; !ok {
				delete(a.entries, p)
				e.ready = false
				e.alloc.SetReady(false)
				drop = append(drop, e)
			}
		}
	}
	if want != nil {
		// Under mu, so that whoever sees the entries of this pass also sees synced.
		a.synced.Store(true)
	}
	a.mu.Unlock()

	for _, e := range drop {
		logger.V(2).Info("No ServiceCIDR holds the prefix any more", "cidr", e.prefix)
		if err := e.alloc.Close(); err != nil {
			logger.Error(err, "Closing the allocator of a removed ServiceCIDR prefix", "cidr", e.prefix)
		}
	}
	for p, al := range created { // not needed after all
		if err := al.Close(); err != nil {
			logger.Error(err, "Closing an unused allocator", "cidr", p)
		}
	}
	return errors.Join(errs...)
}

// removeServiceCIDR drops sc's hold on its prefixes at once, without waiting for a sync, and
// closes the allocators of prefixes no other ServiceCIDR holds.
func (a *Allocator) removeServiceCIDR(logger klog.Logger, sc *networkingv1.ServiceCIDR) {
	var drop []*entry
	a.mu.Lock()
	for _, p := range a.prefixesOf(logger, sc) {
		e := a.entries[p]
		if e == nil {
			continue
		}
		delete(e.refs, sc.Name)
		e.ready = anyReady(e.refs)
		e.alloc.SetReady(e.ready)
		if len(e.refs) == 0 {
			delete(a.entries, p)
			drop = append(drop, e)
		}
	}
	a.mu.Unlock()
	for _, e := range drop {
		logger.V(2).Info("Last ServiceCIDR of the prefix deleted", "cidr", e.prefix, "serviceCIDR", sc.Name)
		if err := e.alloc.Close(); err != nil {
			logger.Error(err, "Closing the allocator of a deleted ServiceCIDR prefix", "cidr", e.prefix)
		}
	}
}
