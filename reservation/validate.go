package reservation

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
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

// minExpires is the earliest [Reservation.Expires] that [Validate] accepts, the Unix epoch; the
// latest is ten years from now, the longest a release policy or a release cooldown keeps an
// address, so that every way a reservation is made has one bound.
var minExpires = time.Unix(0, 0)

// Validate returns nil if r can be recorded as a reservation, and otherwise an [*InvalidError]
// (matching allocator.ErrInvalid) for the first field found wrong, in this order:
//   - Addr must pass allocator.CheckAddr: valid, unzoned and not IPv4-mapped;
//   - exactly one of For and Name is set;
//   - For, if set: Namespace and Name are both DNS-1123 labels (lower-case alphanumerics and
//     '-', at most 63), the names kube-apiserver accepts for a namespace, and for a Service from
//     v1.36 (RelaxedServiceNameValidation; earlier releases also want a Service name to start
//     with a letter, which Validate does not ask);
//   - Name, if set: a DNS-1123 label;
//   - Expires, if not zero: not before the Unix epoch and at most ten years after now (the
//     bound of a release policy's or a release cooldown's duration);
//   - Reason: valid UTF-8 of at most [MaxReasonLen] bytes, without a control character (Cc), a
//     format character (Cf: bidirectional overrides and isolates, zero-width characters, which
//     make text display otherwise than it reads) or a line or paragraph separator (Zl, Zp), so
//     that it shows on one line as it is.
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
		case r.Expires.After(time.Now().Add(maxHold)):
			return &InvalidError{Field: "Expires", Value: r.Expires.UTC().String(), Reason: "more than ten years from now"}
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

// hiddenCharacters are what a reason may not contain: control and format characters, and line
// and paragraph separators.
var hiddenCharacters = []*unicode.RangeTable{unicode.Cc, unicode.Cf, unicode.Zl, unicode.Zp}

// checkReason returns an *InvalidError if reason is not valid UTF-8 text of at most MaxReasonLen
// bytes that shows on one line as it reads.
func checkReason(reason string) error {
	switch {
	case len(reason) > MaxReasonLen:
		return &InvalidError{Field: "Reason", Value: reason[:32] + "…", Reason: fmt.Sprintf("longer than %d bytes", MaxReasonLen)}
	case !utf8.ValidString(reason):
		return &InvalidError{Field: "Reason", Value: reason, Reason: "not valid UTF-8"}
	}
	if i := strings.IndexFunc(reason, func(r rune) bool { return unicode.IsOneOf(hiddenCharacters, r) }); i >= 0 {
		r, _ := utf8.DecodeRuneInString(reason[i:])
		return &InvalidError{Field: "Reason", Value: strconv.QuoteToASCII(reason), Reason: fmt.Sprintf("contains %U, a control, format or separator character", r)}
	}
	return nil
}
