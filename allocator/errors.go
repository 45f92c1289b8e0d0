package allocator

import (
	"errors"
	"fmt"
	"net/netip"
)

// Outcomes callers branch on. Implementations return them unwrapped or wrapped with %w; test them
// with errors.Is.
var (
	// ErrFull means no address is free.
	ErrFull = errors.New("allocator: range is full")
	// ErrAllocated means the requested address is already taken.
	ErrAllocated = errors.New("allocator: address already allocated")
	// ErrNotReady means the allocator cannot serve yet: its informer has not synced, or its
	// ServiceCIDR is not ready or is being deleted.
	ErrNotReady = errors.New("allocator: not ready")
	// ErrMismatchedNetwork means a snapshot or stored state belongs to another range, or that no
	// range of a multi-CIDR allocator contains an address.
	ErrMismatchedNetwork = errors.New("allocator: mismatched network")
	// ErrInvalid is matched (with errors.Is) by every *AddrError, *PrefixError and *OwnerError,
	// and by the errors constructors return for nil or zero arguments.
	ErrInvalid = errors.New("allocator: invalid input")
)

// NotInRangeError reports an address that the range does not serve: outside the prefix, of
// another family, or the network or IPv4 broadcast address of the prefix.
type NotInRangeError struct {
	// IP is the address that was asked for.
	IP netip.Addr
	// Range is the prefix of the allocator that refused it; zero for a multi-CIDR allocator.
	Range netip.Prefix
}

// Error implements error.
func (e *NotInRangeError) Error() string {
	if !e.Range.IsValid() {
		return fmt.Sprintf("allocator: %s is not in any allocatable range", e.IP)
	}
	return fmt.Sprintf("allocator: %s is not in the allocatable range %s", e.IP, e.Range)
}

// Is reports whether target is ErrMismatchedNetwork and e has no Range: a multi-CIDR allocator
// returns such an error when no range it serves contains the address.
func (e *NotInRangeError) Is(target error) bool {
	return target == ErrMismatchedNetwork && !e.Range.IsValid()
}

// AddrError reports an address no allocator accepts. It keeps the input.
type AddrError struct {
	// Addr is the rejected address; the zero Addr when the input did not parse.
	Addr netip.Addr
	// Input is the text that was parsed, if the address came from text.
	Input string
	// Reason says what is wrong, such as "zoned address" or "IPv4-mapped IPv6 address".
	Reason string
}

// Error implements error.
func (e *AddrError) Error() string {
	in := e.Input
	if in == "" {
		in = e.Addr.String()
	}
	return fmt.Sprintf("allocator: invalid address %q: %s", in, e.Reason)
}

// Is reports whether target is ErrInvalid.
func (e *AddrError) Is(target error) bool { return target == ErrInvalid }

// PrefixError reports a prefix no allocator can serve. It keeps the input.
type PrefixError struct {
	// Prefix is the rejected prefix; the zero Prefix when the input did not parse.
	Prefix netip.Prefix
	// Input is the text that was parsed, if the prefix came from text.
	Input string
	// Reason says what is wrong, such as "no usable addresses".
	Reason string
}

// Error implements error.
func (e *PrefixError) Error() string {
	in := e.Input
	if in == "" {
		in = e.Prefix.String()
	}
	return fmt.Sprintf("allocator: invalid range %q: %s", in, e.Reason)
}

// Is reports whether target is ErrInvalid.
func (e *PrefixError) Is(target error) bool { return target == ErrInvalid }

// OwnerError reports an Owner that an allocator recording owners cannot record, because
// kube-apiserver would refuse it as an IPAddress parentRef. It keeps the Owner.
type OwnerError struct {
	// Owner is the rejected owner.
	Owner Owner
	// Reason says what is wrong, such as "resource and name are required".
	Reason string
}

// Error implements error.
func (e *OwnerError) Error() string {
	return fmt.Sprintf("allocator: invalid owner %q: %s", e.Owner.String(), e.Reason)
}

// Is reports whether target is ErrInvalid.
func (e *OwnerError) Is(target error) bool { return target == ErrInvalid }
