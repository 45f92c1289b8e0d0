package service

import (
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/kube-ipam/clusterip/allocator"
)

// The checks below are the part of kube-apiserver's Service validation that concerns the
// ClusterIP fields; they give the same field paths and error types.

// validateClusterIPsRelatedFields checks clusterIP, clusterIPs, ipFamilies and ipFamilyPolicy on
// their own and against each other. old is nil on create. With strict (StrictIPCIDRValidation),
// a ClusterIP the Service did not have already must not be an ambiguous spelling.
func validateClusterIPsRelatedFields(svc, old *corev1.Service, strict bool) field.ErrorList {
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		return nil
	}
	var el field.ErrorList
	ips := svc.Spec.ClusterIPs
	if svc.Spec.ClusterIP != "" {
		if len(ips) == 0 {
			el = append(el, field.Required(pathClusterIPs, ""))
		} else if ips[0] != svc.Spec.ClusterIP {
			el = append(el, field.Invalid(pathClusterIPs, ips, "first value must match `clusterIP`"))
		}
	} else if len(ips) != 0 {
		el = append(el, field.Invalid(pathClusterIPs, ips, "must be empty when `clusterIP` is not specified"))
	}

	seen := map[corev1.IPFamily]bool{}
	for i, f := range svc.Spec.IPFamilies {
		if f != corev1.IPv4Protocol && f != corev1.IPv6Protocol {
			el = append(el, field.NotSupported(pathIPFamilies.Index(i), f, []string{string(corev1.IPv4Protocol), string(corev1.IPv6Protocol)}))
		}
		if seen[f] {
			el = append(el, field.Duplicate(pathIPFamilies.Index(i), f))
		}
		seen[f] = true
	}
	if p := svc.Spec.IPFamilyPolicy; p != nil {
		switch *p {
		case corev1.IPFamilyPolicySingleStack, corev1.IPFamilyPolicyPreferDualStack, corev1.IPFamilyPolicyRequireDualStack:
		default:
			el = append(el, field.NotSupported(pathIPFamilyPolicy, p, []string{
				string(corev1.IPFamilyPolicyPreferDualStack), string(corev1.IPFamilyPolicyRequireDualStack), string(corev1.IPFamilyPolicySingleStack)}))
		}
	}

	badIPs := false
	for i, ip := range ips {
		if i == 0 && ip == corev1.ClusterIPNone {
			if len(ips) > 1 {
				badIPs = true
				el = append(el, field.Invalid(pathClusterIPs, ips, "'None' must be the first and only value"))
			}
			continue
		}
		if errs := validateClusterIPText(pathClusterIPs.Index(i), ip, old, strict); len(errs) > 0 {
			badIPs = true
			el = append(el, errs...)
		}
	}
	if len(ips) > 2 {
		el = append(el, field.Invalid(pathClusterIPs, ips, "may only hold up to 2 values"))
	}
	if badIPs {
		return el
	}
	if len(ips) > 1 && !holdsBothFamilies(ips) {
		el = append(el, field.Invalid(pathClusterIPs, ips, "may specify no more than one IP for each IP family"))
	}
	if !isHeadless(svc) {
		for i, ip := range ips {
			if i >= len(svc.Spec.IPFamilies) {
				break
			}
			want := svc.Spec.IPFamilies[i]
			if got := familyOfString(ip); want != got && (want == corev1.IPv4Protocol || want == corev1.IPv6Protocol) {
				el = append(el, field.Invalid(pathClusterIPs.Index(i), ip,
					fmt.Sprintf("expected an %s value as indicated by `ipFamilies[%d]`", want, i)))
			}
		}
	}
	return el
}

// holdsBothFamilies reports whether ips, which all parse, hold an address of each family, as
// kube-apiserver v1.33 asks of two or more clusterIPs (netutils.IsDualStackIPStrings).
func holdsBothFamilies(ips []string) bool {
	var v4, v6 bool
	for _, ip := range ips {
		if familyOfString(ip) == corev1.IPv6Protocol {
			v6 = true
		} else {
			v4 = true
		}
	}
	return v4 && v6
}

// validateClusterIPText checks s, the clusterIPs entry at path, as kube-apiserver does: an
// address allocator.ParseClusterIP reads, or one the Service already had. With strict
// (StrictIPCIDRValidation) a new one must also not have leading zeros in an IPv4 octet nor be an
// IPv4-mapped IPv6 address.
func validateClusterIPText(path *field.Path, s string, old *corev1.Service, strict bool) field.ErrorList {
	if old != nil && s != "" && s != corev1.ClusterIPNone && slices.Contains(old.Spec.ClusterIPs, s) {
		return nil
	}
	if _, err := allocator.ParseClusterIP(s); err != nil {
		return field.ErrorList{field.Invalid(path, s, "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)")}
	}
	if !strict {
		return nil
	}
	var el field.ErrorList
	addr, err := netip.ParseAddr(s)
	if err != nil {
		// ParseClusterIP reads it, netip does not: an IPv4 octet with leading zeros.
		el = append(el, field.Invalid(path, s, "must not have leading 0s"))
	}
	if addr.Is4In6() {
		el = append(el, field.Invalid(path, s, "must not be an IPv4-mapped IPv6 address"))
	}
	return el
}

// validateCreate checks the ClusterIP fields of a Service after its families are defaulted and
// its addresses allocated, in kube-apiserver's order.
func validateCreate(svc *corev1.Service, strict bool) field.ErrorList {
	el := validateTypeFields(svc)
	return append(el, validateClusterIPsRelatedFields(svc, nil, strict)...)
}

// validateTypeFields checks the ClusterIP fields against the Service's type.
func validateTypeFields(svc *corev1.Service) field.ErrorList {
	var el field.ErrorList
	switch svc.Spec.Type {
	case corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer:
		if isHeadless(svc) {
			el = append(el, field.Invalid(pathClusterIPs.Index(0), svc.Spec.ClusterIPs[0],
				fmt.Sprintf("may not be set to 'None' for %s services", svc.Spec.Type)))
		}
	case corev1.ServiceTypeExternalName:
		if len(svc.Spec.ClusterIPs) > 0 {
			el = append(el, field.Forbidden(pathClusterIPs, "may not be set for ExternalName services"))
		}
		if len(svc.Spec.IPFamilies) > 0 {
			el = append(el, field.Forbidden(pathIPFamilies, "may not be set for ExternalName services"))
		}
		if svc.Spec.IPFamilyPolicy != nil {
			el = append(el, field.Forbidden(pathIPFamilyPolicy, "may not be set for ExternalName services"))
		}
	}
	return el
}

// validateUpdate checks the ClusterIP fields of an updated Service after allocation, in
// kube-apiserver's order: set addresses and families may not change, then the checks of a create.
func validateUpdate(svc, old *corev1.Service, strict bool) field.ErrorList {
	el := validateClusterIPsChange(svc, old)
	el = append(el, validateIPFamiliesChange(svc, old)...)
	el = append(el, validateTypeFields(svc)...)
	return append(el, validateClusterIPsRelatedFields(svc, old, strict)...)
}

// validateClusterIPsChange allows adding a secondary address and, with SingleStack, dropping it;
// any other change of a set address is an error.
func validateClusterIPsChange(svc, old *corev1.Service) field.ErrorList {
	if svc.Spec.Type == corev1.ServiceTypeExternalName || old.Spec.Type == corev1.ServiceTypeExternalName {
		return nil
	}
	if isHeadless(svc) && isHeadless(old) {
		return nil
	}
	var el field.ErrorList
	oldIPs, ips := old.Spec.ClusterIPs, svc.Spec.ClusterIPs
	switch {
	case len(oldIPs) == len(ips):
		for i := range oldIPs {
			if oldIPs[i] != ips[i] {
				el = append(el, field.Invalid(pathClusterIPs.Index(i), ips, "may not change once set"))
			}
		}
	case len(oldIPs) > len(ips):
		if len(ips) == 0 {
			el = append(el, field.Invalid(pathClusterIPs.Index(0), ips, "primary clusterIP can not be unset"))
		}
		if len(ips) > 0 && ips[0] != oldIPs[0] {
			el = append(el, field.Invalid(pathClusterIPs.Index(0), ips, "may not change once set"))
		}
		if len(ips) == 1 && policyOf(svc) != corev1.IPFamilyPolicySingleStack {
			el = append(el, field.Invalid(pathIPFamilyPolicy, svc.Spec.IPFamilyPolicy,
				"must be set to 'SingleStack' when releasing the secondary clusterIP"))
		}
	default:
		if len(oldIPs) > 0 && ips[0] != oldIPs[0] {
			el = append(el, field.Invalid(pathClusterIPs.Index(0), ips, "may not change once set"))
		}
	}
	return el
}

// validateIPFamiliesChange is validateClusterIPsChange for ipFamilies. Like kube-apiserver it
// reports a changed family of equal-length lists at index 0, whatever its index, and calls an
// update that drops a family and every address "primary ipFamily can not be unset".
func validateIPFamiliesChange(svc, old *corev1.Service) field.ErrorList {
	if svc.Spec.Type == corev1.ServiceTypeExternalName || old.Spec.Type == corev1.ServiceTypeExternalName {
		return nil
	}
	if isHeadless(svc) || isHeadless(old) {
		return nil
	}
	var el field.ErrorList
	oldFams, fams := old.Spec.IPFamilies, svc.Spec.IPFamilies
	switch {
	case len(oldFams) == len(fams):
		for i := range oldFams {
			if oldFams[i] != fams[i] {
				el = append(el, field.Invalid(pathIPFamilies.Index(0), fams, "may not change once set"))
			}
		}
	case len(oldFams) > len(fams):
		if len(svc.Spec.ClusterIPs) == 0 {
			el = append(el, field.Invalid(pathIPFamilies.Index(0), fams, "primary ipFamily can not be unset"))
		}
		if len(fams) > 0 && fams[0] != oldFams[0] {
			el = append(el, field.Invalid(pathIPFamilies.Index(0), svc.Spec.ClusterIPs, "may not change once set"))
		}
		if len(fams) == 1 && policyOf(svc) != corev1.IPFamilyPolicySingleStack {
			el = append(el, field.Invalid(pathIPFamilyPolicy, svc.Spec.IPFamilyPolicy,
				"must be set to 'SingleStack' when releasing the secondary ipFamily"))
		}
	default:
		if len(oldFams) > 0 && len(fams) > 0 && fams[0] != oldFams[0] {
			el = append(el, field.Invalid(pathIPFamilies.Index(0), svc.Spec.ClusterIPs, "may not change once set"))
		}
	}
	return el
}
