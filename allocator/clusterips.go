package allocator

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"
)

// RawClusterIPs returns the ClusterIPs svc holds, as written: spec.clusterIPs, or spec.clusterIP
// when spec.clusterIPs is empty (a Service the API server has not defaulted). A headless Service
// (ClusterIP "None"), one whose first ClusterIP is empty, and a nil svc hold none. The result
// shares svc's slice; the caller must not change it.
func RawClusterIPs(svc *corev1.Service) []string {
	if svc == nil {
		return nil
	}
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	if len(ips) == 0 || ips[0] == corev1.ClusterIPNone || ips[0] == "" {
		return nil
	}
	return ips
}

// ClusterIPs returns the addresses svc holds: its RawClusterIPs, each read with ParseClusterIP,
// in order. A ClusterIP that does not parse is left out. Every comparison of a Service's
// ClusterIPs with an allocated address goes through it, or through ParseClusterIP.
func ClusterIPs(svc *corev1.Service) []netip.Addr {
	raw := RawClusterIPs(svc)
	if len(raw) == 0 {
		return nil
	}
	out := make([]netip.Addr, 0, len(raw))
	for _, s := range raw {
		if ip, err := ParseClusterIP(s); err == nil {
			out = append(out, ip)
		}
	}
	return out
}
