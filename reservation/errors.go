package reservation

import (
	"fmt"
	"net/netip"

	"github.com/kube-ipam/clusterip/allocator"
)

// errNilClient is what New returns for a nil client, and what the methods of the zero Client
// return. It matches allocator.ErrInvalid.
var errNilClient = fmt.Errorf("%w: reservation: nil Kubernetes client", allocator.ErrInvalid)

// InvalidError reports a Reservation that [Validate] refuses, naming the first field found wrong
// and keeping its value. It matches allocator.ErrInvalid, so callers that only need to know
// "bad input" test errors.Is(err, allocator.ErrInvalid); errors.As gives the field.
type InvalidError struct {
	// Field is the Reservation field that is wrong, such as "Addr", "For.Namespace", "Name",
	// "Expires" or "Reason"; "For" when For and Name are both set, "Name" when neither is.
	Field string
	// Value is the field's value as text; "" when the field is empty.
	Value string
	// Reason says what is wrong, such as "zoned address" or "must be a DNS label".
	Reason string
}

// Error implements error.
func (e *InvalidError) Error() string {
	return fmt.Sprintf("reservation: invalid %s %q: %s", e.Field, e.Value, e.Reason)
}

// Is reports whether target is allocator.ErrInvalid.
func (e *InvalidError) Is(target error) bool { return target == allocator.ErrInvalid }

// HeldError reports an address that something other than the reservation asked for already holds:
// an IPAddress object of any manager (a Service's allocation, another reservation), or a Service
// whose spec.clusterIPs lists it. [Client.Reserve] returns it for an address it cannot reserve and
// [Client.Release] for an address whose IPAddress object is not a reservation, which it never
// deletes. It matches allocator.ErrAllocated.
type HeldError struct {
	// Addr is the address asked for.
	Addr netip.Addr
	// Holder is who holds it, as far as the API server says: the IPAddress object's parentRef,
	// or the Service that lists the address (with its UID). The zero Owner when the object names
	// none, or was gone by the time it was read.
	Holder allocator.Owner
	// ManagedBy is the ipaddress.kubernetes.io/managed-by label of the IPAddress object that
	// holds the address: ipallocator.k8s.io for kube-apiserver's own allocation, [ManagedBy] for
	// another reservation. It is "" when the object has none or when the holder was found in a
	// Service's spec.clusterIPs without an object.
	ManagedBy string
}

// Error implements error.
func (e *HeldError) Error() string {
	msg := fmt.Sprintf("reservation: %s is already allocated", e.Addr)
	if h := e.Holder.String(); h != "" {
		msg += " to " + h
	}
	if e.ManagedBy != "" {
		msg += " (managed by " + e.ManagedBy + ")"
	}
	return msg
}

// Is reports whether target is allocator.ErrAllocated.
func (e *HeldError) Is(target error) bool { return target == allocator.ErrAllocated }

// Reserved reports whether the holder is a reservation: the IPAddress object that holds the
// address is managed by [ManagedBy].
func (e *HeldError) Reserved() bool { return e.ManagedBy == ManagedBy }
