package reservation

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	networkingv1listers "k8s.io/client-go/listers/networking/v1"

	"github.com/kube-ipam/clusterip/internal/ipmath"
)

// AnnotationReleaseCooldown is the ServiceCIDR annotation that holds every address of the
// ServiceCIDR released by a deleted Service for a while before any other Service can have it: a
// Go duration, such as "10m", of at least one second and at most ten years (see
// [ParseReleaseCooldown]). A ServiceCIDR without it frees a released address at once, as
// kube-apiserver does. A value that does not parse is reported and counts as no cooldown: it
// never stops a Service from being deleted. How the cooldown combines with a Service's own
// [AnnotationReleasePolicy] is [KeptOnDelete]'s rule.
const AnnotationReleaseCooldown = "clusterip.kube-ipam.io/release-cooldown"

// maxHold is the longest a release policy or a release cooldown keeps an address: ten years.
const maxHold = 10 * 365 * 24 * time.Hour

// ParseReleaseCooldown reads the value of a ServiceCIDR's [AnnotationReleaseCooldown]
// annotation: a Go duration of at least one second and at most ten years, the bounds of a
// "Retain/<duration>" release policy. Any other value returns 0 and an [*InvalidError] for the
// annotation's field, which matches allocator.ErrInvalid.
func ParseReleaseCooldown(value string) (time.Duration, error) {
	invalid := func(reason string) error {
		return &InvalidError{Field: "metadata.annotations[" + AnnotationReleaseCooldown + "]", Value: value, Reason: reason}
	}
	d, err := time.ParseDuration(value)
	if err != nil {
		return 0, invalid(fmt.Sprintf("must be a Go duration, such as \"10m\": %v", err))
	}
	if !validHold(d) {
		return 0, invalid(holdBounds)
	}
	return d, nil
}

// validHold reports whether d is a duration a release policy or a release cooldown may keep an
// address for: at least one second and at most ten years; holdBounds says so to a user.
func validHold(d time.Duration) bool { return d >= time.Second && d <= maxHold }

const holdBounds = "the duration must be between 1s and ten years"

// ReleaseCooldownOf returns the release cooldown the annotations of a ServiceCIDR choose: 0
// without [AnnotationReleaseCooldown], else [ParseReleaseCooldown]'s.
func ReleaseCooldownOf(annotations map[string]string) (time.Duration, error) {
	v, ok := annotations[AnnotationReleaseCooldown]
	if !ok {
		return 0, nil
	}
	return ParseReleaseCooldown(v)
}

// ReleaseCooldownFor returns the release cooldown of ip: the longest [AnnotationReleaseCooldown]
// of the ServiceCIDRs in cidrs that can hand ip out (overlapping ServiceCIDRs may share an
// address), or 0 when none of them has one. A ServiceCIDR whose annotation does not parse counts
// as having none, and its [*InvalidError], wrapped with the ServiceCIDR's name, is returned
// beside the cooldown of the others (joined with errors.Join when there are several): the caller
// reports it and goes on with the cooldown. Nil entries and CIDRs that do not parse are skipped.
// It costs one pass over cidrs.
func ReleaseCooldownFor(cidrs []*networkingv1.ServiceCIDR, ip netip.Addr) (time.Duration, error) {
	ip = ip.Unmap()
	var longest time.Duration
	var errs []error
	for _, sc := range cidrs {
		if sc == nil || !containsAddr(sc, ip) {
			continue
		}
		d, err := ReleaseCooldownOf(sc.Annotations)
		if err != nil {
			errs = append(errs, fmt.Errorf("ServiceCIDR %s: %w", sc.Name, err))
			continue
		}
		longest = max(longest, d)
	}
	return longest, errors.Join(errs...)
}

// containsAddr reports whether a prefix of sc's spec.cidrs can hand ip out: ip is in it and is
// neither its network address nor, for IPv4, its broadcast address.
func containsAddr(sc *networkingv1.ServiceCIDR, ip netip.Addr) bool {
	for _, s := range sc.Spec.CIDRs {
		if p, err := netip.ParsePrefix(s); err == nil && ipmath.Usable(p.Masked(), ip) {
			return true
		}
	}
	return false
}

// ReleaseCooldownIn returns [ReleaseCooldownFor] ip over every ServiceCIDR lister holds, such as
// a ServiceCIDR informer's: 0 and no error for a nil lister.
func ReleaseCooldownIn(lister networkingv1listers.ServiceCIDRLister, ip netip.Addr) (time.Duration, error) {
	if lister == nil {
		return 0, nil
	}
	cidrs, err := lister.List(labels.Everything())
	if err != nil {
		return 0, fmt.Errorf("reservation: list ServiceCIDRs: %w", err)
	}
	return ReleaseCooldownFor(cidrs, ip)
}

// KeptOnDelete returns the reservation ip, a ClusterIP of the Service svc deleted at now, becomes
// under svc's release policy and the release cooldown of ip's ServiceCIDR (see
// [ReleaseCooldownFor]), and whether it becomes one; false means ip is freed at once. A cooldown
// acts as a "Retain/<cooldown>" policy every Service of the ServiceCIDR has at least:
//   - "Retain": kept for svc, with no end; the cooldown changes nothing.
//   - "Retain/<d>": kept for svc until now + the longer of d and the cooldown.
//   - "Release" (or no annotation) with a cooldown: kept for svc until now + the cooldown, with
//     a reason that names svc and the cooldown.
//   - "Release" without a cooldown: none.
//
// So no other Service gets the address before the cooldown ends; svc created again under its
// namespace and name meanwhile gets it back, as with a Retain policy. The reservation is kept
// for svc, not anonymous, because kube-apiserver refuses to change an IPAddress object's
// spec.parentRef (it is immutable in v1.33 to v1.37): only a reservation with the Service's
// parentRef can be made of the Service's allocation in one update, with no instant in which the
// address is free. When the cooldown sets the end, the reason says so. The end is in UTC. An ip
// or svc that [Validate] refuses gives none.
func KeptOnDelete(svc types.NamespacedName, ip netip.Addr, policy ReleasePolicy, cooldown time.Duration, now time.Time) (Reservation, bool) {
	if !policy.Retain && cooldown <= 0 {
		return Reservation{}, false
	}
	r := Reservation{Addr: ip, For: svc}
	switch {
	case policy.Retain && policy.For == 0:
	case cooldown > policy.For:
		r.Expires = now.Add(cooldown).UTC()
		r.Reason = fmt.Sprintf("release cooldown of %v of its ServiceCIDR after Service %s was deleted", cooldown, svc)
	default:
		r.Expires = now.Add(policy.For).UTC()
	}
	if Validate(r) != nil {
		return Reservation{}, false
	}
	return r, true
}
