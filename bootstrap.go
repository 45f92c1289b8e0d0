package clusterip

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/pager"
	"k8s.io/klog/v2"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
)

// maxMergeAttempts bounds the compare-and-swaps of bootstrap's catch-up against concurrent writers.
const maxMergeAttempts = 100

// bootstrap creates the DualWrite bitmap of cidr in store if it is missing, holding every address
// of an IPAddress object inside it. A bitmap that exists is left alone: keeping it in step is the
// job of dual writes and repair.
//
// Why no concurrent allocation is missed. The bitmap is created from a List of the IPAddress
// objects (a consistent read of the API server). An IPAddress object created after that List
// either comes from a dual-writing allocator or from one that writes no bits (IPAddress-only). A
// dual-writing allocator sets the bit before it creates the object, and it cannot do so before the
// bitmap exists: ours build it here before New returns, and kube-apiserver's fails allocations
// while the key is missing. So its bits land in the bitmap once created (they are compare-and-swap
// writes on the stored state, never on a state older than the create). What remains are objects
// created by others between the List and the create: a second List, started after the create has
// been stored, shows every one of them that still exists, and their bits are merged in with
// compare-and-swap before New returns, that is, before this process serves anything. The only cost
// of the merge is a possible stale bit, when an object of the second List is released (object
// deleted, then bit cleared) just before the merge lands; a stale bit is a leak that repair frees,
// never a duplicate.
//
// If another process created the bitmap first, its own bootstrap does the catch-up for it.
func bootstrap(ctx context.Context, client kubernetes.Interface, cidr netip.Prefix, store bitmap.Store) error {
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
	if _, err := store.Update(ctx, 0, snapshotOf(a)); err != nil {
		if errors.Is(err, bitmap.ErrConflict) {
			logger.V(2).Info("Another process created the bitmap first")
			return nil
		}
		return err
	}
	logger.Info("Created the missing bitmap from IPAddress objects", "addresses", listed)
	added, err := mergeListed(ctx, client, cidr, store)
	if err != nil {
		return fmt.Errorf("catch up with IPAddress objects created while the bitmap was built: %w", err)
	}
	if added > 0 {
		logger.Info("Set the bits of IPAddress objects created while the bitmap was built", "addresses", added)
	}
	return nil
}

// listIPAddresses calls fn for the address of every IPAddress object, paging through a consistent
// List. Objects whose name is not a valid address are skipped.
func listIPAddresses(ctx context.Context, client kubernetes.Interface, fn func(netip.Addr)) error {
	p := pager.New(func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		return client.NetworkingV1().IPAddresses().List(ctx, opts)
	})
	return p.EachListItem(ctx, metav1.ListOptions{}, func(obj runtime.Object) error {
		ipa, ok := obj.(*networkingv1.IPAddress)
		if !ok {
			return nil
		}
		if ip, err := allocator.ParseAddr(ipa.Name); err == nil {
			fn(ip)
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

// mergeListed sets, with compare-and-swap on the stored bitmap, the bit of every IPAddress object
// of a fresh List inside cidr's window, and returns how many bits it set.
func mergeListed(ctx context.Context, client kubernetes.Interface, cidr netip.Prefix, store bitmap.Store) (int, error) {
	var ips []netip.Addr
	if err := listIPAddresses(ctx, client, func(ip netip.Addr) { ips = append(ips, ip) }); err != nil {
		return 0, fmt.Errorf("list IPAddress objects: %w", err)
	}
	for range maxMergeAttempts {
		s, rev, err := store.Get(ctx)
		if err != nil {
			return 0, err
		}
		a, err := bitmap.New(cidr)
		if err != nil {
			return 0, err
		}
		if err := restore(a, s); err != nil {
			return 0, err
		}
		added := 0
		for _, ip := range ips {
			if a.Allocate(ctx, ip, allocator.Owner{}) == nil {
				added++
			}
		}
		if added == 0 {
			return 0, nil
		}
		if _, err := store.Update(ctx, rev, snapshotOf(a)); err != nil {
			if errors.Is(err, bitmap.ErrConflict) {
				continue
			}
			return 0, err
		}
		return added, nil
	}
	return 0, fmt.Errorf("gave up after %d attempts: %w", maxMergeAttempts, bitmap.ErrConflict)
}

// snapshotOf returns a's state as a Store holds it.
func snapshotOf(a *bitmap.Allocator) bitmap.Snapshot { return a.Snapshot() }

// restore replaces a's state with s.
func restore(a *bitmap.Allocator, s bitmap.Snapshot) error { return a.Restore(s) }
