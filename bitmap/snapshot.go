package bitmap

import (
	"fmt"
	"net/netip"

	"github.com/kube-ipam/clusterip/allocator"
)

// Snapshot returns the allocator's state in kube-apiserver's RangeAllocation encoding: rangeSpec is
// the CIDR string and data the big-endian bytes of the bit set (bit i = offset i), without leading
// zero bytes, as math/big's Int.Bytes gives them. An empty bitmap has empty data.
func (a *Allocator) Snapshot() (rangeSpec string, data []byte) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cidr.String(), a.set.AppendBigEndian(nil)
}

// Restore replaces the allocations with those of a snapshot. It returns an error wrapping
// allocator.ErrMismatchedNetwork if rangeSpec names another range, and one wrapping ErrCorrupt if
// rangeSpec does not parse or data has bits beyond the bitmap; in both cases nothing changes.
func (a *Allocator) Restore(rangeSpec string, data []byte) error {
	if err := a.checkRange(rangeSpec); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.set.SetBigEndian(data); err != nil { // checks before it changes anything
		return fmt.Errorf("%w: %s: %v", ErrCorrupt, rangeSpec, err)
	}
	return nil
}

// checkRange returns an error unless rangeSpec names a's range.
func (a *Allocator) checkRange(rangeSpec string) error {
	p, err := netip.ParsePrefix(rangeSpec)
	if err != nil {
		return fmt.Errorf("%w: range %q: %v", ErrCorrupt, rangeSpec, err)
	}
	if p.Masked() != a.cidr {
		return fmt.Errorf("%w: snapshot of %s restored into %s", allocator.ErrMismatchedNetwork, rangeSpec, a.cidr)
	}
	return nil
}
