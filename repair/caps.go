package repair

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kube-ipam/clusterip/reservation"
)

// The states of a CapUsage.
const (
	// CapOK is a namespace or prefix below its cap.
	CapOK = "ok"
	// CapAtCap is one at its cap: no more is kept.
	CapAtCap = "at cap"
	// CapOver is one over its cap (deletes in flight can overshoot it): nothing more is kept
	// until it is back within it.
	CapOver = "over"
	// CapMayNotRetain is a namespace without a cap, or with a cap of 0: its Services may not use
	// a Retain policy (a release cooldown still keeps their addresses).
	CapMayNotRetain = "may not retain"
	// CapInvalidMayNotRetain is a namespace whose cap does not parse: it may not retain.
	CapInvalidMayNotRetain = "invalid (may not retain)"
	// CapInvalidNoCap is a ServiceCIDR whose cap does not parse: its prefixes are not capped.
	CapInvalidNoCap = "invalid (no cap)"
)

// CapUsage is where a namespace, or a prefix of a ServiceCIDR, stands against its cap on
// reservations (package reservation's Limits), counting the reservations that have not ended.
type CapUsage struct {
	// Namespace is the namespace, for a row of Report.Caps.Namespaces.
	Namespace string `json:"namespace,omitempty"`
	// ServiceCIDR and Prefix are the ServiceCIDR and one of its prefixes, for a row of
	// Report.Caps.ServiceCIDRs.
	ServiceCIDR string `json:"serviceCIDR,omitempty"`
	Prefix      string `json:"prefix,omitempty"`
	// Reserved is how many reservations it keeps: for a namespace, those kept for its Services;
	// for a prefix, those of any owner in it.
	Reserved int `json:"reserved"`
	// Cap is the cap: a number of addresses, with the annotation's percentage in parentheses
	// for a prefix capped by one ("25 (10%)"); "none" for a namespace without the annotation;
	// the annotation's value quoted when it does not parse.
	Cap string `json:"cap"`
	// State is one of CapOK, CapAtCap, CapOver, CapMayNotRetain, CapInvalidMayNotRetain and
	// CapInvalidNoCap.
	State string `json:"state"`
}

// Caps is what an audit says of the caps on reservations: each Namespace that has a
// max-retained annotation or keeps reservations, and each prefix of a ServiceCIDR that has a
// max-reserved annotation, sorted by name (and prefix).
type Caps struct {
	Namespaces   []CapUsage `json:"namespaces,omitempty"`
	ServiceCIDRs []CapUsage `json:"serviceCIDRs,omitempty"`
}

// capsOf returns the caps report of w at now, or nil when there is nothing to say of them.
func capsOf(w *world, now time.Time) *Caps {
	var live []reservation.Reservation
	for _, ipa := range w.ipAddresses {
		if r, ok := reservation.FromObject(ipa); ok && !r.Expired(now) {
			live = append(live, r)
		}
	}
	perNS := map[string]int{}
	for _, r := range live {
		if r.For.Name != "" {
			perNS[r.For.Namespace]++
		}
	}
	c := &Caps{}
	seen := map[string]bool{}
	for _, ns := range w.namespaces {
		seen[ns.Name] = true
		value, ok := ns.Annotations[reservation.AnnotationMaxRetained]
		if !ok && perNS[ns.Name] == 0 {
			continue
		}
		c.Namespaces = append(c.Namespaces, namespaceUsage(ns.Name, perNS[ns.Name], value, ok))
	}
	for ns, n := range perNS {
		if !seen[ns] {
			c.Namespaces = append(c.Namespaces, namespaceUsage(ns, n, "", false))
		}
	}
	slices.SortFunc(c.Namespaces, func(a, b CapUsage) int { return strings.Compare(a.Namespace, b.Namespace) })
	for _, sc := range w.cidrs {
		value, ok := sc.Annotations[reservation.AnnotationMaxReserved]
		if !ok {
			continue
		}
		m, perr := reservation.ParseMaxReserved(value)
		for _, s := range sc.Spec.CIDRs {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				continue
			}
			p = p.Masked()
			u := CapUsage{ServiceCIDR: sc.Name, Prefix: p.String()}
			for _, r := range live {
				if p.Contains(r.Addr) {
					u.Reserved++
				}
			}
			if perr != nil {
				u.Cap, u.State = strconv.Quote(value), CapInvalidNoCap
			} else {
				limit := m.Of(p)
				u.Cap = strconv.Itoa(limit)
				if m.Percent {
					u.Cap += " (" + m.String() + ")"
				}
				u.State = capState(u.Reserved, limit)
			}
			c.ServiceCIDRs = append(c.ServiceCIDRs, u)
		}
	}
	slices.SortStableFunc(c.ServiceCIDRs, func(a, b CapUsage) int { return strings.Compare(a.ServiceCIDR, b.ServiceCIDR) })
	if len(c.Namespaces) == 0 && len(c.ServiceCIDRs) == 0 {
		return nil
	}
	return c
}

// namespaceUsage is the row of namespace ns keeping kept reservations, whose max-retained is
// value (ok: it has the annotation).
func namespaceUsage(ns string, kept int, value string, ok bool) CapUsage {
	u := CapUsage{Namespace: ns, Reserved: kept}
	n, err := reservation.ParseMaxRetained(value)
	switch {
	case !ok:
		u.Cap, u.State = "none", CapMayNotRetain
	case err != nil:
		u.Cap, u.State = strconv.Quote(value), CapInvalidMayNotRetain
	case n == 0:
		u.Cap, u.State = "0", CapMayNotRetain
	default:
		u.Cap, u.State = strconv.Itoa(n), capState(kept, n)
	}
	return u
}

// capState says where kept stands against limit.
func capState(kept, limit int) string {
	switch {
	case kept > limit:
		return CapOver
	case kept == limit:
		return CapAtCap
	}
	return CapOK
}
