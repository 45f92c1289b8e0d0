package clusterip

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/ipaddress"
)

// catchUpTiming paces bootstrap's catch-up; see bootstrap.
type catchUpTiming struct {
	settle   time.Duration // how long after the bitmap is stored an allocation that found it missing may still create its object
	interval time.Duration // between the starts of two Lists
	max      time.Duration // after which the catch-up gives up and leaves the rest to repair
}

// defaultCatchUp is the catch-up of New. An allocation of kube-apiserver v1.33 that found the key
// missing creates its object within one IPAddress create after that, queued behind the others of
// its apiserver (they hold one lock): milliseconds, a few hundred under a burst of Service
// creates. Two seconds leave a wide margin at the cost of two seconds in New, paid only when the
// bitmap is missing.
var defaultCatchUp = catchUpTiming{settle: 2 * time.Second, interval: 250 * time.Millisecond, max: 30 * time.Second}

// bootstrap creates the DualWrite bitmap of cidr in store if it is missing, holding the address of
// every IPAddress object inside its window, and returns once it has caught up with the objects
// created while it was missing (see below). A bitmap that exists when bootstrap starts is left
// alone: keeping it in step is the job of dual writes and repair (its ipaddress-only finding).
//
// Why no allocation is left without its bit. While the key is missing, nothing dual-writing can
// set a bit, but not every allocator stops: kube-apiserver v1.33 in dual write (the v1.33
// default) fails its bitmap write ("cannot allocate resources of type serviceipallocations at this
// time"), logs "no IP address available on the old ClusterIP allocator" and allocates from its
// IPAddress allocators alone, creating an object with no bit (AllocateNextService in
// pkg/registry/core/service/ipallocator/cidrallocator.go; a chosen address fails instead). It also
// creates a missing bitmap empty when it starts. Ours (and v1.33's chosen addresses) fail while the
// key is missing. So the objects that need a bit are those in the first List, which are in the
// bitmap as created, and those whose allocation found the key missing, which may be created at
// any time up to about one IPAddress create after the bitmap is stored: the allocator read the key
// before, and creates the object after. Every allocation that reads the key after it is stored
// sets its bit first (compare-and-swap on the stored state), so no later object needs a bit from
// us. The catch-up therefore Lists the IPAddress objects again and again (a consistent read each
// time) and sets the bit of every object of the window that shows none, until a List finds nothing
// to set after the previous List started settle after the bitmap was stored: an object created
// by then is in that previous List, and its bit is set by now. An object created later than settle
// after the bitmap was stored by an allocation that read the key before is not covered: repair's
// ipaddress-only finding sets its bit.
//
// A bit is set only for an object seen without one in two consecutive Lists (the same UID), because
// kube-apiserver v1.33 releases in the other order, bit first and then the object: an object seen
// once without a bit may be on its way out, and setting its bit would leave a stale bit. A stale
// bit is still possible (a slow release, or an object released just before the merge lands); it
// is a leak that repair frees, never a duplicate.
//
// If another process creates the bitmap first, bootstrap catches up all the same, since the
// creator may be a kube-apiserver starting up, which creates it empty, or a Legacy allocator.
func bootstrap(ctx context.Context, client kubernetes.Interface, cidr netip.Prefix, store bitmap.Store) error {
	return bootstrapWith(ctx, client, cidr, store, defaultCatchUp)
}

// bootstrapWith is bootstrap with the catch-up paced by timing.
func bootstrapWith(ctx context.Context, client kubernetes.Interface, cidr netip.Prefix, store bitmap.Store, timing catchUpTiming) error {
	_, rev, err := store.Get(ctx)
	if err != nil {
		return err
	}
	if rev != 0 {
		return nil
	}
	logger := klog.FromContext(ctx).WithValues("range", cidr)
	a, err := bitmap.New(cidr)
	if err != nil {
		return err
	}
	listed, err := setListed(ctx, client, a)
	if err != nil {
		return err
	}
	if _, err := store.Update(ctx, 0, a.Snapshot()); err != nil {
		if !errors.Is(err, bitmap.ErrConflict) {
			return err
		}
		logger.Info("Another process created the missing bitmap first; catching up with the IPAddress objects")
	} else {
		logger.Info("Created the missing bitmap from IPAddress objects", "addresses", listed)
	}
	added, left, err := catchUp(ctx, client, cidr, store, time.Now(), timing)
	if err != nil {
		return fmt.Errorf("catch up with IPAddress objects created while the bitmap was missing: %w", err)
	}
	if added > 0 {
		logger.Info("Set the bits of IPAddress objects created while the bitmap was missing", "addresses", added)
	}
	if left > 0 {
		logger.Info("Gave up catching up with IPAddress objects that still have no bit; repair sets them", "addresses", left, "after", timing.max)
	}
	return nil
}

// catchUp Lists the IPAddress objects of cidr's window every timing.interval and sets the bit of
// each one seen without its bit in two Lists in a row, until a List sets nothing after the previous
// one started timing.settle after stored (see bootstrap), or timing.max after stored. It returns
// how many bits it set and how many objects were still without a bit when it gave up.
func catchUp(ctx context.Context, client kubernetes.Interface, cidr netip.Prefix, store bitmap.Store, stored time.Time, timing catchUpTiming) (added, left int, err error) {
	var prev map[netip.Addr]types.UID // objects without a bit in the previous List
	var prevStart time.Time
	for {
		start := time.Now()
		bitless, err := withoutBits(ctx, client, cidr, store)
		if err != nil {
			return added, 0, err
		}
		var confirmed []netip.Addr
		for ip, uid := range bitless {
			if puid, ok := prev[ip]; ok && puid == uid {
				confirmed = append(confirmed, ip)
			}
		}
		if len(confirmed) > 0 {
			n, err := mergeBits(ctx, cidr, store, confirmed)
			if err != nil {
				return added, 0, err
			}
			added += n
		} else if !prevStart.IsZero() && prevStart.Sub(stored) >= timing.settle {
			return added, 0, nil
		}
		if time.Since(stored) >= timing.max {
			return added, len(bitless) - len(confirmed), nil
		}
		prev, prevStart = bitless, start
		select {
		case <-ctx.Done():
			return added, 0, ctx.Err()
		case <-time.After(time.Until(start.Add(timing.interval))):
		}
	}
}

// withoutBits Lists the IPAddress objects and returns those inside cidr's window whose bit the
// stored bitmap, read after the List, does not have, with their UIDs.
func withoutBits(ctx context.Context, client kubernetes.Interface, cidr netip.Prefix, store bitmap.Store) (map[netip.Addr]types.UID, error) {
	a, err := bitmap.New(cidr)
	if err != nil {
		return nil, err
	}
	objs := map[netip.Addr]types.UID{}
	err = listIPAddressObjects(ctx, client, func(ip netip.Addr, uid types.UID) {
		if a.Allocate(ctx, ip, allocator.Owner{}) == nil { // inside the window
			objs[ip] = uid
		}
	})
	if err != nil {
		return nil, fmt.Errorf("list IPAddress objects: %w", err)
	}
	stored, rev, err := bitmap.Load(ctx, store, cidr)
	if err != nil {
		return nil, err
	}
	if rev == 0 {
		return nil, errors.New("the bitmap was deleted meanwhile")
	}
	for ip := range objs {
		if stored.Has(ip) {
			delete(objs, ip)
		}
	}
	return objs, nil
}

// listIPAddresses calls fn for the address of every IPAddress object, paging through a consistent
// List. Objects whose name is not a valid address are skipped.
func listIPAddresses(ctx context.Context, client kubernetes.Interface, fn func(netip.Addr)) error {
	return listIPAddressObjects(ctx, client, func(ip netip.Addr, _ types.UID) { fn(ip) })
}

// listIPAddressObjects is listIPAddresses, passing each object's UID too.
func listIPAddressObjects(ctx context.Context, client kubernetes.Interface, fn func(netip.Addr, types.UID)) error {
	return ipaddress.List(ctx, client, func(ipa *networkingv1.IPAddress) error {
		if ip, err := allocator.ParseAddr(ipa.Name); err == nil {
			fn(ip, ipa.UID)
		}
		return nil
	})
}

// setListed sets in a the bit of every listed IPAddress inside its window and returns how many.
func setListed(ctx context.Context, client kubernetes.Interface, a *bitmap.Allocator) (int, error) {
	n := 0
	err := listIPAddresses(ctx, client, func(ip netip.Addr) {
		if a.Allocate(ctx, ip, allocator.Owner{}) == nil {
			n++
		}
	})
	if err != nil {
		return 0, fmt.Errorf("list IPAddress objects: %w", err)
	}
	return n, nil
}

// mergeBits sets the bits of ips (those inside cidr's window) in the stored bitmap with
// compare-and-swap, retried on conflicts, and returns how many it set.
func mergeBits(ctx context.Context, cidr netip.Prefix, store bitmap.Store, ips []netip.Addr) (int, error) {
	var added int
	err := bitmap.Modify(ctx, store, cidr, func(a *bitmap.Allocator) (bool, error) {
		added = 0
		for _, ip := range ips {
			if a.Allocate(ctx, ip, allocator.Owner{}) == nil {
				added++
			}
		}
		return added > 0, nil
	}, bitmap.WithoutCreate()) // a bitmap deleted meanwhile is not recreated with these bits alone
	if err != nil {
		return 0, err
	}
	return added, nil
}
