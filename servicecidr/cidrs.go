package servicecidr

import (
	"net/netip"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-ipam/clusterip/allocator"
)

// Ready reports whether addresses may be allocated from sc: its Ready condition is True or
// absent, and it has no deletionTimestamp. This is the readiness kube-apiserver v1.33's
// allocator applies (a ServiceCIDR without the condition counts as ready, for clusters where
// kube-controller-manager does not run), and the one definition this module uses: the Allocator
// allocates only from ready ServiceCIDRs, and the LifecycleController lets a ServiceCIDR go only
// when every address in it is in another ready one. A nil sc is not ready.
//
// Whether an address is in range, for an audit or a repair, does not depend on readiness:
// kube-apiserver's repair counts every ServiceCIDR, terminating ones included (see [Prefixes]).
func Ready(sc *networkingv1.ServiceCIDR) bool {
	if sc == nil || sc.DeletionTimestamp != nil {
		return false
	}
	c := meta.FindStatusCondition(sc.Status.Conditions, networkingv1.ServiceCIDRConditionReady)
	return c == nil || c.Status == metav1.ConditionTrue
}

// Prefixes returns the prefixes of sc's spec.cidrs, masked, in their order; an entry that does not
// parse as a prefix is left out (the API server validates them, so none should). It includes
// prefixes an Allocator does not serve, such as one overlapping the IPv4-mapped block: another
// allocator (kube-apiserver's) may allocate from them. A nil sc has none.
func Prefixes(sc *networkingv1.ServiceCIDR) []netip.Prefix {
	if sc == nil {
		return nil
	}
	out := make([]netip.Prefix, 0, len(sc.Spec.CIDRs))
	for _, c := range specCIDRsOf(sc) {
		if c.prefix.IsValid() {
			out = append(out, c.prefix)
		}
	}
	return out
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
