package service_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
)

// statusOf is the part of a failed call's Status that a client sees: code, reason, message and
// each cause's field, type and message.
type statusOf struct {
	Code    int32
	Reason  metav1.StatusReason
	Message string
	Causes  []metav1.StatusCause
}

func statusOfErr(t *testing.T, err error) statusOf {
	t.Helper()
	var se *apierrors.StatusError
	if !errors.As(err, &se) {
		t.Fatalf("error %v (%T) is not a *errors.StatusError", err, err)
	}
	st := se.Status()
	s := statusOf{Code: st.Code, Reason: st.Reason, Message: st.Message}
	if st.Details != nil {
		s.Causes = st.Details.Causes
	}
	return s
}

// refusing is an allocator of one family that refuses every allocation with err, as a
// multi-CIDR allocator does for an address in no ready ServiceCIDR or a storage outage would.
type refusing struct {
	allocator.Interface
	err error
}

func (r refusing) Allocate(context.Context, netip.Addr, allocator.Owner) error { return r.err }
func (r refusing) AllocateNext(context.Context, allocator.Owner) (netip.Addr, error) {
	return netip.Addr{}, r.err
}
func (r refusing) DryRun() allocator.Interface { return r }

func mustBitmap(t *testing.T, cidr string) *bitmap.Allocator {
	t.Helper()
	a, err := bitmap.New(netip.MustParsePrefix(cidr))
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// invalid is the cause of a FieldValueInvalid error at field.
func invalid(field, msg string) metav1.StatusCause {
	return metav1.StatusCause{Type: metav1.CauseTypeFieldValueInvalid, Field: field, Message: msg}
}

// TestServiceAllocatorErrorsAreKubeAPIServers checks that every error service.Allocator returns for
// a chosen or a fresh address carries kube-apiserver v1.33's status code, reason, field path and
// text, whichever of the allocator package's errors caused it. The texts are those of v1.33's
// Service registry (pkg/registry/core/service/storage/alloc.go: "failed to allocate IP %v: %v" as
// a 422 at spec.clusterIPs, "failed to allocate a serviceIP: %v" as a 500) around those of its
// ipallocator package (ErrAllocated, ErrFull, ErrMismatchedNetwork, ErrNotInRange).
// TestServiceMatrixKubeAPIServer checks the same texts against a real kube-apiserver.
func TestServiceAllocatorErrorsAreKubeAPIServers(t *testing.T) {
	ctx := context.Background()
	single := corev1.IPFamilyPolicySingleStack
	require := corev1.IPFamilyPolicyRequireDualStack
	tests := []struct {
		name       string
		v4Err      error    // the IPv4 allocator refuses everything with this error; nil: a bitmap of 10.0.0.0/24
		taken      []string // held in the IPv4 bitmap before the call
		policy     *corev1.IPFamilyPolicy
		families   []corev1.IPFamily
		clusterIPs []string
		want       statusOf
	}{
		{
			name:       "a chosen address that is taken",
			taken:      []string{"10.0.0.7"},
			clusterIPs: []string{"10.0.0.7"},
			want: statusOf{Code: 422, Reason: metav1.StatusReasonInvalid,
				Message: `Service "s" is invalid: spec.clusterIPs: Invalid value: []string{"10.0.0.7"}: failed to allocate IP 10.0.0.7: provided IP is already allocated`,
				Causes: []metav1.StatusCause{invalid("spec.clusterIPs",
					`Invalid value: []string{"10.0.0.7"}: failed to allocate IP 10.0.0.7: provided IP is already allocated`)}},
		},
		{
			name:       "a chosen address outside the range of a single-range allocator",
			clusterIPs: []string{"10.1.0.5"},
			want: statusOf{Code: 422, Reason: metav1.StatusReasonInvalid,
				Message: `Service "s" is invalid: spec.clusterIPs: Invalid value: []string{"10.1.0.5"}: failed to allocate IP 10.1.0.5: the provided IP (10.1.0.5) is not in the valid range. The range of valid IPs is 10.0.0.0/24`,
				Causes: []metav1.StatusCause{invalid("spec.clusterIPs",
					`Invalid value: []string{"10.1.0.5"}: failed to allocate IP 10.1.0.5: the provided IP (10.1.0.5) is not in the valid range. The range of valid IPs is 10.0.0.0/24`)}},
		},
		{
			name:       "the network address of a single-range allocator",
			clusterIPs: []string{"10.0.0.0"},
			want: statusOf{Code: 422, Reason: metav1.StatusReasonInvalid,
				Message: `Service "s" is invalid: spec.clusterIPs: Invalid value: []string{"10.0.0.0"}: failed to allocate IP 10.0.0.0: the provided IP (10.0.0.0) is not in the valid range. The range of valid IPs is 10.0.0.0/24`,
				Causes: []metav1.StatusCause{invalid("spec.clusterIPs",
					`Invalid value: []string{"10.0.0.0"}: failed to allocate IP 10.0.0.0: the provided IP (10.0.0.0) is not in the valid range. The range of valid IPs is 10.0.0.0/24`)}},
		},
		{
			name:       "a chosen address in no ServiceCIDR of a multi-CIDR allocator",
			v4Err:      fmt.Errorf("servicecidr: %w", &allocator.NotInRangeError{IP: netip.MustParseAddr("10.1.0.5")}),
			clusterIPs: []string{"10.1.0.5"},
			want: statusOf{Code: 422, Reason: metav1.StatusReasonInvalid,
				Message: `Service "s" is invalid: spec.clusterIPs: Invalid value: []string{"10.1.0.5"}: failed to allocate IP 10.1.0.5: the provided network does not match the current range`,
				Causes: []metav1.StatusCause{invalid("spec.clusterIPs",
					`Invalid value: []string{"10.1.0.5"}: failed to allocate IP 10.1.0.5: the provided network does not match the current range`)}},
		},
		{
			// v1.33's bitmap, restoring a stored snapshot of another range (the flag changed),
			// says "range" where its MetaAllocator says "network".
			name:       "a chosen address whose stored bitmap is of another range",
			v4Err:      fmt.Errorf("bitmap: restore: %w", allocator.ErrMismatchedNetwork),
			clusterIPs: []string{"10.0.0.9"},
			want: statusOf{Code: 422, Reason: metav1.StatusReasonInvalid,
				Message: `Service "s" is invalid: spec.clusterIPs: Invalid value: []string{"10.0.0.9"}: failed to allocate IP 10.0.0.9: the provided range does not match the current range`,
				Causes: []metav1.StatusCause{invalid("spec.clusterIPs",
					`Invalid value: []string{"10.0.0.9"}: failed to allocate IP 10.0.0.9: the provided range does not match the current range`)}},
		},
		{
			name:   "a fresh address whose stored bitmap is of another range",
			v4Err:  fmt.Errorf("bitmap: restore: %w", allocator.ErrMismatchedNetwork),
			policy: &single,
			want: statusOf{Code: 500, Reason: metav1.StatusReasonInternalError,
				Message: `Internal error occurred: failed to allocate a serviceIP: the provided range does not match the current range`,
				Causes:  []metav1.StatusCause{{Message: `failed to allocate a serviceIP: the provided range does not match the current range`}}},
		},
		{
			// v1.33's MetaAllocator looks only among ready ServiceCIDRs, so an address that only a
			// ServiceCIDR that is not ready contains is in none.
			name:       "a chosen address only in a ServiceCIDR that is not ready",
			v4Err:      fmt.Errorf("servicecidr: 10.0.0.9 is only in ServiceCIDRs that are not ready: %w", allocator.ErrNotReady),
			clusterIPs: []string{"10.0.0.9"},
			want: statusOf{Code: 422, Reason: metav1.StatusReasonInvalid,
				Message: `Service "s" is invalid: spec.clusterIPs: Invalid value: []string{"10.0.0.9"}: failed to allocate IP 10.0.0.9: the provided network does not match the current range`,
				Causes: []metav1.StatusCause{invalid("spec.clusterIPs",
					`Invalid value: []string{"10.0.0.9"}: failed to allocate IP 10.0.0.9: the provided network does not match the current range`)}},
		},
		{
			// v1.33 answers every error of a chosen address with a 422 and the error's text.
			name:       "a chosen address the storage fails to record",
			v4Err:      errors.New("etcdserver: request timed out"),
			clusterIPs: []string{"10.0.0.9"},
			want: statusOf{Code: 422, Reason: metav1.StatusReasonInvalid,
				Message: `Service "s" is invalid: spec.clusterIPs: Invalid value: []string{"10.0.0.9"}: failed to allocate IP 10.0.0.9: etcdserver: request timed out`,
				Causes: []metav1.StatusCause{invalid("spec.clusterIPs",
					`Invalid value: []string{"10.0.0.9"}: failed to allocate IP 10.0.0.9: etcdserver: request timed out`)}},
		},
		{
			// The value is clusterIPs as requested: the fresh IPv6 address is still "".
			name:       "a chosen IPv4 address taken while the IPv6 one is fresh",
			taken:      []string{"10.0.0.8"},
			policy:     &require,
			clusterIPs: []string{"10.0.0.8"},
			want: statusOf{Code: 422, Reason: metav1.StatusReasonInvalid,
				Message: `Service "s" is invalid: spec.clusterIPs: Invalid value: []string{"10.0.0.8", ""}: failed to allocate IP 10.0.0.8: provided IP is already allocated`,
				Causes: []metav1.StatusCause{invalid("spec.clusterIPs",
					`Invalid value: []string{"10.0.0.8", ""}: failed to allocate IP 10.0.0.8: provided IP is already allocated`)}},
		},
		{
			name:   "no free address",
			v4Err:  fmt.Errorf("bitmap: %w", allocator.ErrFull),
			policy: &single,
			want: statusOf{Code: 500, Reason: metav1.StatusReasonInternalError,
				Message: `Internal error occurred: failed to allocate a serviceIP: range is full`,
				Causes:  []metav1.StatusCause{{Message: `failed to allocate a serviceIP: range is full`}}},
		},
		{
			// v1.33's MetaAllocator skips ServiceCIDRs that are not ready and reports the rest full.
			name:   "no ready ServiceCIDR for a fresh address",
			v4Err:  fmt.Errorf("servicecidr: no ready IPv4 ServiceCIDR: %w", allocator.ErrNotReady),
			policy: &single,
			want: statusOf{Code: 500, Reason: metav1.StatusReasonInternalError,
				Message: `Internal error occurred: failed to allocate a serviceIP: range is full`,
				Causes:  []metav1.StatusCause{{Message: `failed to allocate a serviceIP: range is full`}}},
		},
		{
			name:   "a fresh address the storage fails to record",
			v4Err:  errors.New("etcdserver: request timed out"),
			policy: &single,
			want: statusOf{Code: 500, Reason: metav1.StatusReasonInternalError,
				Message: `Internal error occurred: failed to allocate a serviceIP: etcdserver: request timed out`,
				Causes:  []metav1.StatusCause{{Message: `failed to allocate a serviceIP: etcdserver: request timed out`}}},
		},
		{
			name:       "two chosen addresses with a SingleStack policy",
			policy:     &single,
			clusterIPs: []string{"10.0.0.5", "fd00::5"},
			want: statusOf{Code: 422, Reason: metav1.StatusReasonInvalid,
				Message: `Service "s" is invalid: spec.ipFamilyPolicy: Invalid value: "SingleStack": must be 'RequireDualStack' or 'PreferDualStack' when multiple cluster IPs are specified`,
				Causes: []metav1.StatusCause{invalid("spec.ipFamilyPolicy",
					`Invalid value: "SingleStack": must be 'RequireDualStack' or 'PreferDualStack' when multiple cluster IPs are specified`)}},
		},
		{
			name:       "two errors are listed in brackets",
			policy:     &single,
			families:   []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol},
			clusterIPs: []string{"10.0.0.5", "fd00::5"},
			want: statusOf{Code: 422, Reason: metav1.StatusReasonInvalid,
				Message: `Service "s" is invalid: [spec.ipFamilyPolicy: Invalid value: "SingleStack": must be 'RequireDualStack' or 'PreferDualStack' when multiple cluster IPs are specified, spec.ipFamilyPolicy: Invalid value: "SingleStack": must be 'RequireDualStack' or 'PreferDualStack' when multiple IP families are specified]`,
				Causes: []metav1.StatusCause{
					invalid("spec.ipFamilyPolicy", `Invalid value: "SingleStack": must be 'RequireDualStack' or 'PreferDualStack' when multiple cluster IPs are specified`),
					invalid("spec.ipFamilyPolicy", `Invalid value: "SingleStack": must be 'RequireDualStack' or 'PreferDualStack' when multiple IP families are specified`),
				}},
		},
		{
			// v1.33 asks only that three addresses hold both families (netutils.IsDualStackIPStrings).
			name:       "three addresses of both families",
			policy:     &require,
			clusterIPs: []string{"10.0.0.5", "10.0.0.6", "fd00::6"},
			want: statusOf{Code: 422, Reason: metav1.StatusReasonInvalid,
				Message: `Service "s" is invalid: spec.clusterIPs: Invalid value: []string{"10.0.0.5", "10.0.0.6", "fd00::6"}: may only hold up to 2 values`,
				Causes: []metav1.StatusCause{
					invalid("spec.clusterIPs", `Invalid value: []string{"10.0.0.5", "10.0.0.6", "fd00::6"}: may only hold up to 2 values`),
				}},
		},
		{
			// A list of families is shown as v1.33 shows its internal type.
			name:       "a chosen address of the other family than ipFamilies[0]",
			families:   []corev1.IPFamily{corev1.IPv6Protocol, corev1.IPv4Protocol},
			policy:     &require,
			clusterIPs: []string{"10.0.0.5"},
			want: statusOf{Code: 422, Reason: metav1.StatusReasonInvalid,
				Message: `Service "s" is invalid: spec.clusterIPs[0]: Invalid value: "10.0.0.5": expected an IPv6 value as indicated by ` + "`ipFamilies[0]`",
				Causes: []metav1.StatusCause{
					invalid("spec.clusterIPs[0]", `Invalid value: "10.0.0.5": expected an IPv6 value as indicated by `+"`ipFamilies[0]`"),
				}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v4 := mustBitmap(t, "10.0.0.0/24")
			for _, ip := range tt.taken {
				if err := v4.Allocate(ctx, netip.MustParseAddr(ip), allocator.Owner{}); err != nil {
					t.Fatal(err)
				}
			}
			var a4 allocator.Interface = v4
			if tt.v4Err != nil {
				a4 = refusing{Interface: v4, err: tt.v4Err}
			}
			sa := newV133(t, corev1.IPv4Protocol, map[corev1.IPFamily]allocator.Interface{
				corev1.IPv4Protocol: a4, corev1.IPv6Protocol: mustBitmap(t, "fd00::/112")})
			svc := matrixService("s", matrixSpec{})
			svc.Spec.IPFamilyPolicy = tt.policy
			svc.Spec.IPFamilies = tt.families
			if len(tt.clusterIPs) > 0 {
				svc.Spec.ClusterIP, svc.Spec.ClusterIPs = tt.clusterIPs[0], tt.clusterIPs
			}
			_, err := sa.Allocate(ctx, svc, false)
			if err == nil {
				t.Fatal("Allocate() succeeded")
			}
			if diff := cmp.Diff(tt.want, statusOfErr(t, err)); diff != "" {
				t.Errorf("Allocate() status (-want +got):\n%s", diff)
			}
			if _, ok := err.(*apierrors.StatusError); !ok {
				t.Errorf("Allocate() = %T, want a *errors.StatusError, which a registry passes on as it is", err)
			}
		})
	}
}
