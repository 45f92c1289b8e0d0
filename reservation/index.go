package reservation

import (
	"fmt"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/kube-ipam/clusterip/allocator"
)

// forServiceIndex is the name of the informer index an Index adds: the namespace/name of the
// Service a reservation is kept for.
const forServiceIndex = "clusterip.kube-ipam.io/reserved-for-service"

// Index finds, in an IPAddress informer's cache, the reservations kept for a Service. A
// [Claimer] and package reservation/webhook read reservations through one.
type Index struct {
	informer cache.SharedIndexInformer
}

// NewIndex returns an Index over informer, adding its index to the informer unless an Index
// added it already; adding fails once the informer has started, so create it before.
func NewIndex(informer cache.SharedIndexInformer) (*Index, error) {
	if _, ok := informer.GetIndexer().GetIndexers()[forServiceIndex]; !ok {
		err := informer.AddIndexers(cache.Indexers{
			forServiceIndex: indexReservations(func(r Reservation) string {
				if r.For.Name == "" {
					return ""
				}
				return r.For.String()
			}),
			forNamespaceIndex: indexReservations(func(r Reservation) string {
				if r.For.Name == "" {
					return ""
				}
				return r.For.Namespace
			}),
			familyIndex: indexReservations(func(r Reservation) string { return string(allocator.FamilyOf(r.Addr)) }),
		})
		if err != nil {
			return nil, fmt.Errorf("reservation: index the IPAddress informer: %w", err)
		}
	}
	return &Index{informer: informer}, nil
}

// indexReservations returns an informer index function that files each well-formed reservation
// under key(r), and nothing else (nor a reservation key gives "" for).
func indexReservations(key func(Reservation) string) cache.IndexFunc {
	return func(obj any) ([]string, error) {
		ipa, ok := obj.(*networkingv1.IPAddress)
		if !ok {
			return nil, nil
		}
		r, ok := FromObject(ipa)
		if !ok || key(r) == "" {
			return nil, nil
		}
		return []string{key(r)}, nil
	}
}

// HasSynced reports whether the informer has delivered its initial list.
func (x *Index) HasSynced() bool { return x.informer.HasSynced() }

// Lowest returns the reservation kept for the Service owner in family that has not ended at
// now, with its object, and whether there is one; of several, the one of the lowest address.
func (x *Index) Lowest(owner types.NamespacedName, family corev1.IPFamily, now time.Time) (Reservation, *networkingv1.IPAddress, bool) {
	return x.lowest(owner, family, now, nil)
}

// LowestServed returns what [Index.Lowest] does among the reservations whose address a live
// ServiceCIDR of cidrs serves ([Served]): the one a claim may give.
func (x *Index) LowestServed(owner types.NamespacedName, family corev1.IPFamily, now time.Time, cidrs []*networkingv1.ServiceCIDR) (Reservation, *networkingv1.IPAddress, bool) {
	return x.lowest(owner, family, now, func(ip netip.Addr) bool { return Served(cidrs, ip) })
}

// lowest is Lowest among the reservations whose address keep accepts (all for a nil keep).
func (x *Index) lowest(owner types.NamespacedName, family corev1.IPFamily, now time.Time, keep func(netip.Addr) bool) (Reservation, *networkingv1.IPAddress, bool) {
	objs, err := x.informer.GetIndexer().ByIndex(forServiceIndex, owner.String())
	if err != nil {
		return Reservation{}, nil, false
	}
	var best Reservation
	var bestObj *networkingv1.IPAddress
	for _, o := range objs {
		ipa, ok := o.(*networkingv1.IPAddress)
		if !ok {
			continue
		}
		r, ok := FromObject(ipa)
		if !ok || r.For != owner || r.Expired(now) || allocator.FamilyOf(r.Addr) != family || (keep != nil && !keep(r.Addr)) {
			continue
		}
		if bestObj == nil || r.Addr.Less(best.Addr) {
			best, bestObj = r, ipa
		}
	}
	return best, bestObj, bestObj != nil
}
