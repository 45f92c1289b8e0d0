package allocator_test

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"

	"github.com/kube-ipam/clusterip/allocator"
)

// TestZeroArgumentsAreErrorsNotPanics calls every exported function of the package with zero or
// nil arguments: the checks and parsers return an error matching ErrInvalid, the others a defined
// zero result, and none panics.
func TestZeroArgumentsAreErrorsNotPanics(t *testing.T) {
	tests := []struct {
		name string
		call func() (string, error)
		want string // the result when no error is wanted
		err  bool   // an error matching ErrInvalid is wanted
	}{
		{"CheckAddr", func() (string, error) { return "", allocator.CheckAddr(netip.Addr{}) }, "", true},
		{"CheckPrefix", func() (string, error) { return "", allocator.CheckPrefix(netip.Prefix{}) }, "", true},
		{"CheckOwner", func() (string, error) { return "", allocator.CheckOwner(allocator.Owner{}) }, "", true},
		{"ParseAddr", func() (string, error) { ip, err := allocator.ParseAddr(""); return ip.String(), err }, "", true},
		{"ParsePrefix", func() (string, error) { p, err := allocator.ParsePrefix(""); return p.String(), err }, "", true},
		{"FamilyOf", func() (string, error) { return string(allocator.FamilyOf(netip.Addr{})), nil }, "", false},
		{"ServiceOwner", func() (string, error) { return fmt.Sprintf("%#v", allocator.ServiceOwner(nil)), nil }, fmt.Sprintf("%#v", allocator.Owner{}), false},
		{"Owner.String", func() (string, error) { return allocator.Owner{}.String(), nil }, "", false},
		{"NotInRangeError.Error", func() (string, error) { return (&allocator.NotInRangeError{}).Error(), nil }, "allocator: invalid IP is not in any allocatable range", false},
		{"AddrError.Error", func() (string, error) { return (&allocator.AddrError{}).Error(), nil }, `allocator: invalid address "invalid IP": `, false},
		{"PrefixError.Error", func() (string, error) { return (&allocator.PrefixError{}).Error(), nil }, `allocator: invalid range "invalid Prefix": `, false},
		{"OwnerError.Error", func() (string, error) { return (&allocator.OwnerError{}).Error(), nil }, `allocator: invalid owner "": `, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var (
				got string
				err error
			)
			func() {
				defer func() {
					if r := recover(); r != nil {
						t.Fatalf("%s panicked: %v", tt.name, r)
					}
				}()
				got, err = tt.call()
			}()
			if tt.err {
				if !errors.Is(err, allocator.ErrInvalid) {
					t.Errorf("%s(zero) error = %v, want one matching ErrInvalid", tt.name, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("%s(zero) = %q, %v; want %q, nil", tt.name, got, err, tt.want)
			}
		})
	}
}
