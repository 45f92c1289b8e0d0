package ipaddress

import (
	"errors"
	"net/netip"

	"github.com/kube-ipam/clusterip/internal/ipmath"
)

var errNotCanonical = errors.New("not a canonical IP address")

// parseCanonical parses an IPAddress name: an unzoned address in its canonical form.
func parseCanonical(name string) (netip.Addr, error) {
	ip, err := netip.ParseAddr(name)
	if err != nil {
		return netip.Addr{}, err
	}
	if ip.String() != name {
		return netip.Addr{}, errNotCanonical
	}
	return ip, nil
}

// ipOffset returns the offset of ip in cidr if it is one of its usable addresses.
func ipOffset(cidr netip.Prefix, ip netip.Addr) (uint64, bool) {
	if ip.Is4In6() {
		return 0, false
	}
	return ipmath.Offset(cidr, ip)
}
