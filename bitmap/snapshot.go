package bitmap

import (
	"fmt"
	"net/netip"
)

// Snapshot is the persisted state of a bitmap, as kube-apiserver's RangeAllocation holds it:
// Range is the CIDR string and Data the big-endian bytes of the bit set (bit i = offset i), without
// leading zero bytes. The zero Snapshot means "nothing stored".
type Snapshot struct {
	Range string
	Data  []byte
}

// Snapshot returns the allocator's state in kube-apiserver's RangeAllocation encoding: Range is
// the CIDR string and Data the big-endian bytes of the bit set (bit i = offset i), without leading
// zero bytes, as math/big's Int.Bytes gives them. An empty bitmap has empty Data. It is the shape a
// Store keeps.
func (a *Allocator) Snapshot() Snapshot {
	a.mu.Lock()
	defer a.mu.Unlock()
	return Snapshot{Range: a.cidr.String(), Data: a.set.AppendBigEndian(nil)}
}

// Restore replaces the allocations with those of s. It returns a *RangeMismatchError (matching
// allocator.ErrMismatchedNetwork) if s.Range names another range, and one wrapping ErrCorrupt if
// s.Range does not parse or s.Data has bits beyond the bitmap; in both cases nothing changes.
func (a *Allocator) Restore(s Snapshot) error {
	if err := a.checkRange(s.Range); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.set.SetBigEndian(s.Data); err != nil { // checks before it changes anything
		return fmt.Errorf("%w: %s: %v", ErrCorrupt, s.Range, err)
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
		return &RangeMismatchError{Stored: rangeSpec, Range: a.cidr}
	}
	return nil
}
