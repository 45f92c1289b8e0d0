package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/kube-ipam/clusterip/allocator"
)

// The texts of kube-apiserver's ipallocator errors (the same in every supported release) (pkg/registry/core/service/ipallocator),
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

// chosenError is kube-apiserver's answer to a chosen address it could not allocate: a 422
// Invalid at spec.clusterIPs whose value is clusterIPs as requested (fresh addresses still "").
func (s *Allocator) chosenError(name string, requested []string, ip string, err error) *apierrors.StatusError {
	return s.newInvalid(name, field.ErrorList{field.Invalid(pathClusterIPs, requested,
		fmt.Sprintf("failed to allocate IP %s: %s", ip, chosenErrorText(err)))})
}

// nextError is kube-apiserver's answer to a family it could not give a fresh address, for the
// Service named name whose clusterIPs were requested as requested (fresh addresses "", as stock
// v1.37.2 shows them: [""] for a Service that asked for none). A full range (or, as in every
// release, no ready ServiceCIDR) is a 500, "failed to allocate a serviceIP: range is full", which
// names the Service from 1.36. Any other error is, from 1.35, a 422 Invalid at spec.clusterIPs,
// "failed to allocate IP: <error>", where an API server's refusal of the IPAddress object keeps
// the server's own text. Before 1.35 such a refusal was the 500's reason in DualWrite, and in
// IPAddressOnly kube-apiserver's IPAddress allocator went on to the next address after it, so the
// answer was the full range's (clusterip stops at the first refusal instead of trying every
// address, and answers the same).
func (s *Allocator) nextError(name string, requested []string, err error) *apierrors.StatusError {
	var status apierrors.APIStatus
	refused := errors.As(err, &status)
	full := errors.Is(err, allocator.ErrFull) || errors.Is(err, allocator.ErrNotReady)
	if !full && s.sem.InvalidOnAllocateNextError() {
		text := nextErrorText(err)
		if status != nil {
			text = status.Status().Message
		}
		return s.newInvalid(name, field.ErrorList{field.Invalid(pathClusterIPs, requested, "failed to allocate IP: "+text)})
	}
	text := nextErrorText(err)
	switch {
	case full || (refused && s.sem.RefusedAddressReadsAsFull()):
		text = textFull
	case refused:
		text = status.Status().Message
	}
	if s.sem.FullErrorNamesService() {
		return apierrors.NewInternalError(fmt.Errorf("failed to allocate a serviceIP for Service %q: %s", name, text))
	}
	return apierrors.NewInternalError(errors.New("failed to allocate a serviceIP: " + text))
}

// newInvalid returns the 422 Invalid error kube-apiserver returns for the Service named name and
// the errors el. It is apierrors.NewInvalid, except that each error's value is shown as the
// k8s.io/apimachinery of the release shows it (Go syntax before v0.34, JSON from v0.34), and as
// the release shows the internal API types its registry validates: before v0.34 a list of
// families reads []core.IPFamily{"IPv4"}, not []v1.IPFamily{"IPv4"}.
func (s *Allocator) newInvalid(name string, el field.ErrorList) *apierrors.StatusError {
	causes := make([]metav1.StatusCause, 0, len(el))
	var msgs []string
	seen := map[string]bool{}
	for _, e := range el {
		body := s.errorBody(e)
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

// errorBody is field.Error.ErrorBody as the release's k8s.io/apimachinery writes it.
func (s *Allocator) errorBody(e *field.Error) string {
	var body string
	switch e.Type {
	case field.ErrorTypeRequired, field.ErrorTypeForbidden, field.ErrorTypeTooLong, field.ErrorTypeInternal:
		body = e.Type.String()
	default:
		if s.sem.FieldValuesAsJSON() {
			body = e.Type.String() + ": " + jsonValue(e.BadValue)
		} else {
			body = e.Type.String() + ": " + v133Value(e.BadValue)
		}
	}
	if e.Detail != "" {
		body += ": " + e.Detail
	}
	return body
}

// jsonValue shows a bad value as k8s.io/apimachinery v0.34 and later show it: simple values as
// they are, strings quoted, anything else as JSON.
func jsonValue(v any) string {
	switch t := v.(type) {
	case int64, int32, float64, float32, bool:
		return fmt.Sprintf("%v", t)
	case string:
		return fmt.Sprintf("%q", t)
	}
	if b, err := json.Marshal(v); err == nil {
		return string(b)
	}
	if st, ok := v.(fmt.Stringer); ok {
		return st.String()
	}
	return fmt.Sprintf("%#v", v)
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

// OwnerRefusal returns err, an error of a's AllocateNext for a Service, as the API server's
// refusal of the IPAddress object kube-apiserver's allocator would have tried to create, when err
// refuses the owner (a Service without a name): clusterip refuses such an owner before it writes
// anything, where kube-apiserver creates the object and the server refuses it,
// "IPAddress.networking.k8s.io "<ip>" is invalid: spec.parentRef.name: Required value", naming
// the address it picked. The address named is the one a's dry run picks; if the dry run finds the
// range full, the answer is its error, as kube-apiserver's is. The result matches both the API
// server's refusal (errors.As with apierrors.APIStatus) and err. Any other err is returned as it
// is. Allocator uses it; a kube-apiserver fork whose Service registry calls an allocator.Interface
// directly uses it so that its answer is stock's.
func OwnerRefusal(ctx context.Context, a allocator.Interface, err error) error {
	var oe *allocator.OwnerError
	if !errors.As(err, &oe) {
		return err
	}
	stand := allocator.Owner{Resource: "services", Namespace: oe.Owner.Namespace, Name: "-"}
	ip, dryErr := a.DryRun().AllocateNext(ctx, stand)
	if dryErr != nil {
		if errors.Is(dryErr, allocator.ErrFull) {
			return dryErr
		}
		return err
	}
	var el field.ErrorList
	parent := field.NewPath("spec", "parentRef")
	if oe.Owner.Resource == "" {
		el = append(el, field.Required(parent.Child("resource"), ""))
	}
	if oe.Owner.Name == "" {
		el = append(el, field.Required(parent.Child("name"), ""))
	}
	refusal := apierrors.NewInvalid(schema.GroupKind{Group: "networking.k8s.io", Kind: "IPAddress"}, ip.String(), el)
	return fmt.Errorf("%w (%w)", refusal, oe)
}
