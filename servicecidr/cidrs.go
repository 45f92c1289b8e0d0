package servicecidr

import (
	"net/netip"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-ipam/clusterip/allocator"
)

// isReady reports whether sc may be allocated from: its Ready condition is True or absent, and it
// is not being deleted.
func isReady(sc *networkingv1.ServiceCIDR) bool {
	if sc.DeletionTimestamp != nil {
		return false
	}
	c := meta.FindStatusCondition(sc.Status.Conditions, networkingv1.ServiceCIDRConditionReady)
	return c == nil || c.Status == metav1.ConditionTrue
}

// specCIDR is one entry of a ServiceCIDR's spec.cidrs, parsed.
type specCIDR struct {
	text   string
	prefix netip.Prefix // masked; invalid if text does not parse
	err    error        // why an allocator cannot serve it (allocator.ParsePrefix), nil if it can
}

// specCIDRsOf parses sc's spec.cidrs: the one place they are parsed. The apiserver validates
// them (at most one per family, masked), but not all it accepts can be served: a prefix that
// overlaps the IPv4-mapped block ::ffff:0:0/96, for one.
func specCIDRsOf(sc *networkingv1.ServiceCIDR) []specCIDR {
	out := make([]specCIDR, 0, len(sc.Spec.CIDRs))
	for _, s := range sc.Spec.CIDRs {
		c := specCIDR{text: s}
		if p, err := netip.ParsePrefix(s); err == nil {
			c.prefix = p.Masked()
		}
		_, c.err = allocator.ParsePrefix(s)
		out = append(out, c)
	}
	return out
}
