// Package allocbase holds the small pieces every allocator of this module shares below the
// [allocator.Interface] contract: the read-only half of a dry-run view ([DryRunView]) and the rule
// that releasing an address outside the range does nothing ([ReleaseNotServed]). Each backend
// embeds or calls them instead of writing them again.
package allocbase

import (
	"context"
	"errors"
	"iter"
	"net/netip"

	corev1 "k8s.io/api/core/v1"

	"github.com/kube-ipam/clusterip/allocator"
)

// DryRunView is the part of a dry-run view that does not depend on the backend: it answers the
// read methods from the allocator it was made from, Release only validates its input (a dry run
// frees nothing), and Close does nothing (the view holds nothing of its own). A backend's view
// embeds it and adds Allocate, AllocateNext and DryRun.
//
// The zero DryRunView is not usable: R must be set. A DryRunView is as safe for concurrent use as
// R is.
type DryRunView struct {
	R allocator.Interface // only its read methods are called
}

// Has reports whether ip is allocated in the underlying allocator.
func (v DryRunView) Has(ip netip.Addr) bool { return v.R.Has(ip) }

// All yields the addresses allocated in the underlying allocator.
func (v DryRunView) All() iter.Seq[netip.Addr] { return v.R.All() }

// CIDR returns the range of the underlying allocator.
func (v DryRunView) CIDR() netip.Prefix { return v.R.CIDR() }

// Family returns the IP family of the underlying allocator.
func (v DryRunView) Family() corev1.IPFamily { return v.R.Family() }

// Used returns the number of addresses allocated in the underlying allocator.
func (v DryRunView) Used() uint64 { return v.R.Used() }

// Free returns the number of addresses free in the underlying allocator.
func (v DryRunView) Free() uint64 { return v.R.Free() }

// Release returns what [allocator.CheckAddr] returns for ip and frees nothing.
func (v DryRunView) Release(_ context.Context, ip netip.Addr) error { return allocator.CheckAddr(ip) }

// Close does nothing and returns nil.
func (v DryRunView) Close() error { return nil }

// ReleaseNotServed returns what Release returns for an address its allocator could not look up,
// given the lookup's error: the error itself when the address is bad input (an
// [*allocator.AddrError]), and nil otherwise, because releasing an address that is outside the
// range (or not one of its usable addresses) does nothing.
func ReleaseNotServed(lookupErr error) error {
	var ae *allocator.AddrError
	if errors.As(lookupErr, &ae) {
		return lookupErr
	}
	return nil
}
