package repair

import (
	"net/netip"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/reservation"
)

// The problems a check reports of a reservation (package reservation), in ReservationFinding.
const (
	// ReservationExpired is a reservation whose end has passed and whose object is still there:
	// nothing deleted it (no clusterip allocators with Config.Reservations run), so the address
	// stays out of allocation.
	ReservationExpired = "expired"
	// ReservationOutsideServiceCIDRs is a reservation of an address no live ServiceCIDR serves
	// (reservation.Served: its ServiceCIDR was deleted, is being deleted or changed, or the
	// object was made by hand): it holds nothing any allocator would give, and no claim gives it.
	ReservationOutsideServiceCIDRs = "outside every ServiceCIDR"
	// ReservationNamespaceGone is a reservation kept for a Service of a namespace that does not
	// exist: no Service can claim it until the namespace is created again.
	ReservationNamespaceGone = "its namespace does not exist"
	// ReservationServiceHoldsAnother is a reservation kept for a Service that exists and holds
	// another address of the family: the Service will not claim it.
	ReservationServiceHoldsAnother = "its Service holds another address"
)

// ReservationFinding is a reservation an audit reports (Report.Reservations). It is not a
// finding of allocation: it leaves Consistent as it is, and repair changes nothing for it.
type ReservationFinding struct {
	// IP is the reserved address.
	IP string `json:"ip"`
	// For is the Service it is kept for, "namespace/name"; empty for an anonymous one.
	For string `json:"for,omitempty"`
	// Name is an anonymous reservation's name.
	Name string `json:"name,omitempty"`
	// Problem is one of ReservationExpired, ReservationOutsideServiceCIDRs,
	// ReservationNamespaceGone and ReservationServiceHoldsAnother.
	Problem string `json:"problem"`
}

// reservationFindings returns what is wrong with the reservations among w's IPAddress objects at
// now, sorted by address: each reservation gets the first problem that applies, in the order of
// the constants.
func reservationFindings(w *world, now time.Time) []ReservationFinding {
	var out []ReservationFinding
	namespaces := make(map[string]bool, len(w.namespaces))
	for _, ns := range w.namespaces {
		namespaces[ns.Name] = true
	}
	for _, ipa := range w.ipAddresses {
		r, ok := reservation.FromObject(ipa)
		if !ok {
			continue
		}
		problem := ""
		switch {
		case r.Expired(now):
			problem = ReservationExpired
		case !reservation.Served(w.cidrs, r.Addr):
			problem = ReservationOutsideServiceCIDRs
		case r.For.Name != "" && !namespaces[r.For.Namespace]:
			problem = ReservationNamespaceGone
		case r.For.Name != "" && w.holdsAnother(r):
			problem = ReservationServiceHoldsAnother
		default:
			continue
		}
		f := ReservationFinding{IP: r.Addr.String(), Name: r.Name, Problem: problem}
		if r.For.Name != "" {
			f.For = r.For.String()
		}
		out = append(out, f)
	}
	slices.SortFunc(out, func(a, b ReservationFinding) int {
		return netip.MustParseAddr(a.IP).Compare(netip.MustParseAddr(b.IP))
	})
	return out
}

// holdsAnother reports whether the Service r is kept for exists and holds an address of r's
// family other than r.Addr.
func (w *world) holdsAnother(r reservation.Reservation) bool {
	family := allocator.FamilyOf(r.Addr)
	for _, svc := range w.services {
		if svc.Namespace != r.For.Namespace || svc.Name != r.For.Name || svc.Spec.Type == corev1.ServiceTypeExternalName {
			continue
		}
		ips := svc.Spec.ClusterIPs
		if len(ips) == 0 && svc.Spec.ClusterIP != "" {
			ips = []string{svc.Spec.ClusterIP}
		}
		for _, s := range ips {
			ip, err := allocator.ParseClusterIP(s)
			if err == nil && allocator.FamilyOf(ip) == family && ip != r.Addr {
				return true
			}
		}
	}
	return false
}
