package ipaddress

import (
	"errors"
	"net/netip"
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
