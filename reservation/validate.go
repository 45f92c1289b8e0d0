package reservation

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kube-ipam/clusterip/allocator"
)

// MaxReasonLen is the longest [Reservation.Reason] [Validate] accepts, in bytes.
const MaxReasonLen = 1024

// The range of [Reservation.Expires] that [Validate] accepts: from the Unix epoch, and no later
// than RFC 3339 can write (a four-digit year).
var (
	minExpires = time.Unix(0, 0)
	maxExpires = time.Date(9999, time.December, 31, 23, 59, 59, 999999999, time.UTC)
)

// Validate returns nil if r can be recorded as a reservation, and otherwise an [*InvalidError]
// (matching allocator.ErrInvalid) for the first field found wrong, in this order:
//   - Addr must pass allocator.CheckAddr: valid, unzoned and not IPv4-mapped;
//   - exactly one of For and Name is set;
//   - For, if set: Namespace and Name are both DNS-1123 labels (lower-case alphanumerics and
//     '-', at most 63), the names kube-apiserver accepts for a namespace, and for a Service from
//     v1.36 (RelaxedServiceNameValidation; earlier releases also want a Service name to start
//     with a letter, which Validate does not ask);
//   - Name, if set: a DNS-1123 label;
//   - Expires, if not zero: not before the Unix epoch and not after the year 9999;
//   - Reason: valid UTF-8 of at most [MaxReasonLen] bytes, without control characters (so on
//     one line).
//
// Validate does not ask the API server anything: whether the address lies in a ServiceCIDR, or is
// free, is [Client.Reserve]'s to find out.
func Validate(r Reservation) error {
	if err := checkAddr(r.Addr); err != nil {
		return err
	}
	hasFor := r.For != (types.NamespacedName{})
	switch {
	case hasFor && r.Name != "":
		return &InvalidError{Field: "For", Value: r.For.String(), Reason: "a reservation is kept for a Service or named, not both (Name is " + r.Name + ")"}
	case !hasFor && r.Name == "":
		return &InvalidError{Field: "Name", Reason: "a reservation needs a name, or a Service in For to be kept for"}
	case hasFor:
		if err := checkLabel("For.Namespace", r.For.Namespace); err != nil {
			return err
		}
		if err := checkLabel("For.Name", r.For.Name); err != nil {
			return err
		}
	default:
		if err := checkLabel("Name", r.Name); err != nil {
			return err
		}
	}
	if !r.Expires.IsZero() {
		switch {
		case r.Expires.Before(minExpires):
			return &InvalidError{Field: "Expires", Value: r.Expires.UTC().String(), Reason: "before the Unix epoch"}
		case r.Expires.After(maxExpires):
			return &InvalidError{Field: "Expires", Value: r.Expires.UTC().String(), Reason: "after the year 9999, which RFC 3339 cannot write"}
		}
	}
	return checkReason(r.Reason)
}

// checkAddr returns an *InvalidError for field Addr if allocator.CheckAddr refuses addr.
func checkAddr(addr netip.Addr) error {
	err := allocator.CheckAddr(addr)
	if err == nil {
		return nil
	}
	reason := err.Error()
	var ae *allocator.AddrError
	if errors.As(err, &ae) {
		reason = ae.Reason
	}
	value := ""
	if addr.IsValid() {
		value = addr.String()
	}
	return &InvalidError{Field: "Addr", Value: value, Reason: reason}
}

// checkLabel returns an *InvalidError for field if value is not a DNS-1123 label.
func checkLabel(field, value string) error {
	if value == "" {
		return &InvalidError{Field: field, Reason: "required"}
	}
	if msgs := validation.IsDNS1123Label(value); len(msgs) > 0 {
		return &InvalidError{Field: field, Value: value, Reason: strings.Join(msgs, "; ")}
	}
	return nil
}

// checkReason returns an *InvalidError if reason is not valid UTF-8 text of at most MaxReasonLen
// bytes on one line.
func checkReason(reason string) error {
	switch {
	case len(reason) > MaxReasonLen:
		return &InvalidError{Field: "Reason", Value: reason[:32] + "…", Reason: fmt.Sprintf("longer than %d bytes", MaxReasonLen)}
	case !utf8.ValidString(reason):
		return &InvalidError{Field: "Reason", Value: reason, Reason: "not valid UTF-8"}
	case strings.IndexFunc(reason, unicode.IsControl) >= 0:
		return &InvalidError{Field: "Reason", Value: reason, Reason: "contains a control character"}
	}
	return nil
}
