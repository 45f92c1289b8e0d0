package reservation

import (
	"net/netip"

	networkingv1 "k8s.io/api/networking/v1"
)

// Served reports whether a live ServiceCIDR among cidrs can hand ip out: one that is not being
// deleted (no deletionTimestamp) with a prefix that holds ip as neither its network address nor,
// for IPv4, its broadcast address. Only such an address may be reserved, claimed or handed out:
// a reservation of any other address (its ServiceCIDR was deleted, or someone created the
// object by hand) keeps nothing an allocator would give, and a Service that claimed it would
// hold an address no ServiceCIDR serves. Nil entries are skipped.
func Served(cidrs []*networkingv1.ServiceCIDR, ip netip.Addr) bool {
	ip = ip.Unmap()
	for _, sc := range cidrs {
		if sc != nil && sc.DeletionTimestamp == nil && containsAddr(sc, ip) {
			return true
		}
	}
	return false
}
