package bitmap

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/kube-ipam/clusterip/allocator"
)

// The errors of the Store contract: what a Store returns (implementations wrap them with %w; test
// them with errors.Is), and what Persistent reports when a write to it fails.
var (
	// ErrConflict means the stored snapshot changed since the revision passed to Update.
	ErrConflict = errors.New("bitmap: stored snapshot changed (revision conflict)")
	// ErrCorrupt means a stored or given snapshot cannot be decoded, or has bits beyond its range.
	ErrCorrupt = errors.New("bitmap: corrupt snapshot")
)

// ErrOutcomeUnknown means a write to the Store failed in a way that leaves it unknown whether it
// was stored, for example because etcd went away before it answered. The operations of that write
// report failure, but their addresses may be held in the store without an owner: a leak, which a
// repair pass finds, never a duplicate. A caller that gives up while its write is in flight gets it
// too (wrapping its context's error as well); the package documentation says how that write is undone.
var ErrOutcomeUnknown = errors.New("bitmap: outcome of the write is unknown")

// ConflictError is the error a Store may return from Update when the stored revision has moved
// on: it matches ErrConflict with errors.Is and carries what is stored now, so that the caller can
// retry without another Get. Stores that cannot tell return a plain error wrapping ErrConflict
// instead.
type ConflictError struct {
	// Current is the snapshot stored now; the zero Snapshot if Rev is 0.
	Current Snapshot
	// Rev is the revision of Current; 0 means nothing is stored.
	Rev int64
}

// Error implements error.
func (e *ConflictError) Error() string {
	return fmt.Sprintf("%v: now at revision %d", ErrConflict, e.Rev)
}

// Is reports whether target is ErrConflict.
func (e *ConflictError) Is(target error) bool { return target == ErrConflict }

// RangeMismatchError reports a snapshot of another range than the allocator's: restored into an
// Allocator, or found in the Store of a Persistent, which happens when kube-apiserver's
// --service-cluster-ip-range changes under a stored bitmap. Its text begins with
// kube-apiserver's own for the case, "the provided range does not match the current range", and
// it matches allocator.ErrMismatchedNetwork with errors.Is.
type RangeMismatchError struct {
	// Stored is the Range of the snapshot, as it was stored.
	Stored string
	// Range is the allocator's range.
	Range netip.Prefix
}

// Error implements error.
func (e *RangeMismatchError) Error() string {
	return fmt.Sprintf("the provided range does not match the current range: the bitmap is of %s, the allocator's range is %s", e.Stored, e.Range)
}

// Is reports whether target is allocator.ErrMismatchedNetwork.
func (e *RangeMismatchError) Is(target error) bool { return target == allocator.ErrMismatchedNetwork }
