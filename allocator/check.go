package allocator

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	netutils "k8s.io/utils/net"

	"github.com/kube-ipam/clusterip/internal/ipmath"
)

// CheckAddr returns nil if ip is an address an allocator can be asked about: valid, without a
// zone, and not an IPv4-mapped IPv6 address (use ip.Unmap() first if that is what you mean).
// Otherwise it returns an *AddrError.
func CheckAddr(ip netip.Addr) error {
	switch {
	case !ip.IsValid():
		return &AddrError{Addr: ip, Reason: "invalid address"}
	case ip.Zone() != "":
		return &AddrError{Addr: ip, Reason: "zoned address"}
	case ip.Is4In6():
		return &AddrError{Addr: ip, Reason: "IPv4-mapped IPv6 address"}
	}
	return nil
}

// CheckOwner returns nil if o can be recorded as the parentRef of an IPAddress object: it names a
// Resource and a Name, which kube-apiserver requires (it rejects the object with 422 Unprocessable
// Entity otherwise). Otherwise it returns an *OwnerError. Allocators that record owners call it
// before any API call; the other values of a parentRef (the characters allowed in a name, say) are
// left to the API server's validation. Allocators that record no owner (package bitmap) accept any
// Owner, the zero one included, and do not call it.
func CheckOwner(o Owner) error {
	switch {
	case o.Resource == "" && o.Name == "":
		return &OwnerError{Owner: o, Reason: "resource and name are required"}
	case o.Resource == "":
		return &OwnerError{Owner: o, Reason: "resource is required"}
	case o.Name == "":
		return &OwnerError{Owner: o, Reason: "name is required"}
	}
	return nil
}

// ipv4MappedBlock holds the IPv4-mapped IPv6 addresses (RFC 4291 §2.5.5.2).
var ipv4MappedBlock = netip.PrefixFrom(netip.AddrFrom16([16]byte{10: 0xff, 11: 0xff}), 96)

// CheckPrefix returns nil if p is a range an allocator can serve: valid, masked (no host bits
// set), and with at least one usable address (so not an IPv4 /31 or /32, nor an IPv6 /128).
// An IPv6 prefix must not overlap the IPv4-mapped block ::ffff:0:0/96, neither lying inside it
// nor containing it (as ::/80 or ::/0 do): such a range could hand out an IPv4-mapped address,
// which no allocator accepts back. Otherwise it returns a *PrefixError.
func CheckPrefix(p netip.Prefix) error {
	switch {
	case !p.IsValid():
		return &PrefixError{Prefix: p, Reason: "invalid prefix"}
	case p.Overlaps(ipv4MappedBlock):
		return &PrefixError{Prefix: p, Reason: "overlaps the IPv4-mapped IPv6 block ::ffff:0:0/96"}
	case p.Masked() != p:
		return &PrefixError{Prefix: p, Reason: "host bits set, the range is " + p.Masked().String()}
	case ipmath.Size(p) == 0:
		return &PrefixError{Prefix: p, Reason: "no usable addresses"}
	}
	return nil
}

// ParseAddr parses s as an address and checks it with CheckAddr. Errors are *AddrError and keep s.
func ParseAddr(s string) (netip.Addr, error) {
	ip, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, &AddrError{Input: s, Reason: err.Error()}
	}
	if err := CheckAddr(ip); err != nil {
		e := err.(*AddrError)
		e.Input = s
		return netip.Addr{}, e
	}
	return ip, nil
}

// ParseClusterIP parses a Service's ClusterIP (an element of spec.clusterIPs) as kube-apiserver
// v1.33 reads it with its StrictIPCIDRValidation gate off, the default, and returns the unmapped
// address that the API server allocates for it, names its IPAddress object after and sets the bit
// of. Besides the canonical forms it accepts what Go's net.ParseIP accepted before Go 1.17: IPv4
// octets with leading zeros, read as decimal ("10.96.0.010" is 10.96.0.10), an IPv4-mapped IPv6
// spelling, which is the IPv4 address ("::ffff:10.96.0.11" is 10.96.0.11), and any IPv6 spelling
// ("FD00:10:96::A", "fd00:10:96:0:0:0:0:b"). kube-apiserver stores such a ClusterIP as written,
// so every comparison of a stored ClusterIP with an address goes through ParseClusterIP. A zone,
// a CIDR or anything else that is not an address gives an *AddrError that keeps s.
func ParseClusterIP(s string) (netip.Addr, error) {
	ip, ok := netip.AddrFromSlice(netutils.ParseIPSloppy(s))
	if !ok {
		return netip.Addr{}, &AddrError{Input: s, Reason: "not an IP address"}
	}
	return ip.Unmap(), nil
}

// ParsePrefix parses s as a CIDR such as "10.96.0.0/12" or "fd00::/108" and checks it with
// CheckPrefix. Errors are *PrefixError and keep s.
func ParsePrefix(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, &PrefixError{Input: s, Reason: err.Error()}
	}
	if err := CheckPrefix(p); err != nil {
		e := err.(*PrefixError)
		e.Input = s
		return netip.Prefix{}, e
	}
	return p, nil
}

// FamilyOf returns the IP family of ip: IPv4Protocol for an IPv4 address, IPv6Protocol for an
// IPv6 one (including IPv4-mapped ones), and "" for the zero Addr.
func FamilyOf(ip netip.Addr) corev1.IPFamily {
	switch {
	case ip.Is4():
		return corev1.IPv4Protocol
	case ip.Is6():
		return corev1.IPv6Protocol
	}
	return ""
}
