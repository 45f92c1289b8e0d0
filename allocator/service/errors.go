package service

import (
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/kube-ipam/clusterip/allocator"
)

// The texts of kube-apiserver v1.33's ipallocator errors (pkg/registry/core/service/ipallocator),
// which its Service registry puts in the errors a client sees and which tools parse. Our
// sentinels keep their own, package-prefixed, texts; Allocator maps them to these.
const (
	textFull              = "range is full"
	textAllocated         = "provided IP is already allocated"
	textMismatchedNetwork = "the provided network does not match the current range"
	// textMismatchedRange is the text of v1.33's bitmap (pkg/registry/core/service/allocator)
	// when the snapshot it restores from etcd is of another range.
	textMismatchedRange = "the provided range does not match the current range"
)

// chosenErrorText returns the text kube-apiserver v1.33 gives for err, the failure to allocate a
// chosen address. An address outside the range of a single-range allocator is ipallocator's
// ErrNotInRange, with the range; one outside every range of a multi-CIDR allocator (a range-less
// *allocator.NotInRangeError), or only in ServiceCIDRs that are not ready, is
// allocator.ErrMismatchedNetwork, as v1.33's MetaAllocator looks for the address among ready
// ServiceCIDRs only; any other allocator.ErrMismatchedNetwork is a stored bitmap of another range.
// Any other error keeps its own text.
func chosenErrorText(err error) string {
	var nir *allocator.NotInRangeError
	switch {
	case errors.Is(err, allocator.ErrAllocated):
		return textAllocated
	case errors.As(err, &nir):
		if nir.Range.IsValid() {
			return fmt.Sprintf("the provided IP (%s) is not in the valid range. The range of valid IPs is %s", nir.IP, nir.Range)
		}
		return textMismatchedNetwork
	case errors.Is(err, allocator.ErrNotReady):
		return textMismatchedNetwork
	case errors.Is(err, allocator.ErrMismatchedNetwork):
		return textMismatchedRange
	case errors.Is(err, allocator.ErrFull):
		return textFull
	}
	return err.Error()
}

// nextErrorText returns the text kube-apiserver v1.33 gives for err, the failure to allocate a
// fresh address. v1.33's MetaAllocator skips ServiceCIDRs that are not ready and reports the range
// full when none served, so allocator.ErrNotReady reads as allocator.ErrFull;
// allocator.ErrMismatchedNetwork is a stored bitmap of another range. Any other error keeps its own
// text.
func nextErrorText(err error) string {
	var nir *allocator.NotInRangeError
	switch {
	case errors.Is(err, allocator.ErrFull), errors.Is(err, allocator.ErrNotReady):
		return textFull
	case errors.As(err, &nir):
		return textMismatchedNetwork
	case errors.Is(err, allocator.ErrMismatchedNetwork):
		return textMismatchedRange
	case errors.Is(err, allocator.ErrAllocated):
		return textAllocated
	}
	return err.Error()
}

// chosenError is kube-apiserver v1.33's answer to a chosen address it could not allocate: a 422
// Invalid at spec.clusterIPs whose value is clusterIPs as requested (fresh addresses still "").
func chosenError(name string, requested []string, ip string, err error) *apierrors.StatusError {
	return newInvalid(name, field.ErrorList{field.Invalid(pathClusterIPs, requested,
		fmt.Sprintf("failed to allocate IP %s: %s", ip, chosenErrorText(err)))})
}

// nextError is kube-apiserver v1.33's answer to a family with no fresh address to give: a 500.
func nextError(err error) *apierrors.StatusError {
	return apierrors.NewInternalError(errors.New("failed to allocate a serviceIP: " + nextErrorText(err)))
}

// newInvalid returns the 422 Invalid error kube-apiserver v1.33 returns for the Service named
// name and the errors el. It is apierrors.NewInvalid, except that each error's value is shown as
// k8s.io/apimachinery v0.33 shows it (later releases show values as JSON), and as v1.33 shows
// the internal API types its registry validates: a list of families reads
// []core.IPFamily{"IPv4"}, not []v1.IPFamily{"IPv4"}.
func newInvalid(name string, el field.ErrorList) *apierrors.StatusError {
	causes := make([]metav1.StatusCause, 0, len(el))
	var msgs []string
	seen := map[string]bool{}
	for _, e := range el {
		body := errorBody(e)
		causes = append(causes, metav1.StatusCause{Type: metav1.CauseType(e.Type), Message: body, Field: e.Field})
		if msg := e.Field + ": " + body; !seen[msg] {
			seen[msg] = true
			msgs = append(msgs, msg)
		}
	}
	msg := fmt.Sprintf("%s %q is invalid", serviceKind.String(), name)
	switch len(msgs) {
	case 0:
	case 1:
		msg += ": " + msgs[0]
	default:
		msg += ": [" + strings.Join(msgs, ", ") + "]"
	}
	return &apierrors.StatusError{ErrStatus: metav1.Status{
		Status:  metav1.StatusFailure,
		Code:    http.StatusUnprocessableEntity,
		Reason:  metav1.StatusReasonInvalid,
		Message: msg,
		Details: &metav1.StatusDetails{Group: serviceKind.Group, Kind: serviceKind.Kind, Name: name, Causes: causes},
	}}
}

// errorBody is field.Error.ErrorBody as k8s.io/apimachinery v0.33 writes it.
func errorBody(e *field.Error) string {
	var s string
	switch e.Type {
	case field.ErrorTypeRequired, field.ErrorTypeForbidden, field.ErrorTypeTooLong, field.ErrorTypeInternal:
		s = e.Type.String()
	default:
		s = e.Type.String() + ": " + v133Value(e.BadValue)
	}
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// v133Value shows a bad value as kube-apiserver v1.33 shows the internal type that stands for
// it.
func v133Value(v any) string {
	if v == nil {
		return "null"
	}
	if rv := reflect.ValueOf(v); rv.Kind() == reflect.Pointer {
		if rv.IsNil() {
			return "null"
		}
		v = rv.Elem().Interface()
	}
	switch t := v.(type) {
	case int64, int32, float64, float32, bool:
		return fmt.Sprintf("%v", t)
	case string:
		return fmt.Sprintf("%q", t)
	case []corev1.IPFamily:
		// The registry validates core.Service, whose IPFamily lives in package core.
		return strings.Replace(fmt.Sprintf("%#v", t), "[]v1.IPFamily", "[]core.IPFamily", 1)
	case fmt.Stringer:
		return t.String()
	}
	return fmt.Sprintf("%#v", v)
}
