package service_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/allocator/service"
	"github.com/kube-ipam/clusterip/featuregate"
)

// optionsOf returns the Options of kube-apiserver binary emulating its own minor, failing t if
// featuregate.KubeVersion refuses it.
func optionsOf(t testing.TB, binary string) service.Options {
	t.Helper()
	v, err := featuregate.KubeVersion(binary, "")
	if err != nil {
		t.Fatal(err)
	}
	return service.Options{Version: v}
}

// newV133 returns an Allocator with kube-apiserver v1.33.13's answers, which the tests written
// against that release's texts check.
func newV133(t testing.TB, primary corev1.IPFamily, families map[corev1.IPFamily]allocator.Interface) *service.Allocator {
	t.Helper()
	return service.NewWithOptions(primary, families, optionsOf(t, "1.33.13"))
}

// TestServiceAnswersFollowTheRelease checks each answer that changed between the supported
// kube-apiserver releases, against the release the Allocator is configured as. The texts are
// those real kube-apiservers of each release gave (testdata/services*.yaml records them for the
// whole matrix).
func TestServiceAnswersFollowTheRelease(t *testing.T) {
	ctx := context.Background()
	// An API server's refusal of an IPAddress object, as a Service without a name gets it.
	refusal := apierrors.NewInvalid(schema.GroupKind{Group: "networking.k8s.io", Kind: "IPAddress"}, "10.96.0.20",
		field.ErrorList{field.Required(field.NewPath("spec", "parentRef", "name"), "")})
	refusalText := `IPAddress.networking.k8s.io "10.96.0.20" is invalid: spec.parentRef.name: Required value`

	tests := []struct {
		name    string
		release string
		gates   map[string]bool     // --feature-gates; nil: the release's defaults
		alloc   allocator.Interface // nil: a bitmap of 10.96.0.0/24
		ips     []string            // clusterIPs asked for
		want    statusOf            // Code 0: success
	}{
		{name: "leading zeros are kept", release: "1.35.4", ips: []string{"10.96.0.010"}},
		{name: "leading zeros are refused", release: "1.36.3", ips: []string{"10.96.0.010"}, want: statusOf{
			Code: 422, Reason: metav1.StatusReasonInvalid,
			Message: `Service "svc" is invalid: spec.clusterIPs[0]: Invalid value: "10.96.0.010": must not have leading 0s`,
			Causes:  []metav1.StatusCause{invalid("spec.clusterIPs[0]", `Invalid value: "10.96.0.010": must not have leading 0s`)}}},
		{name: "IPv4-mapped IPv6 is kept", release: "1.33.13", ips: []string{"::ffff:10.96.0.11"}},
		{name: "IPv4-mapped IPv6 is refused", release: "1.37.2", ips: []string{"::ffff:10.96.0.11"}, want: statusOf{
			Code: 422, Reason: metav1.StatusReasonInvalid,
			Message: `Service "svc" is invalid: spec.clusterIPs[0]: Invalid value: "::ffff:10.96.0.11": must not be an IPv4-mapped IPv6 address`,
			Causes:  []metav1.StatusCause{invalid("spec.clusterIPs[0]", `Invalid value: "::ffff:10.96.0.11": must not be an IPv4-mapped IPv6 address`)}}},
		{name: "a value in Go syntax", release: "1.33.13", ips: []string{"10.96.0.0"}, want: statusOf{
			Code: 422, Reason: metav1.StatusReasonInvalid,
			Message: `Service "svc" is invalid: spec.clusterIPs: Invalid value: []string{"10.96.0.0"}: failed to allocate IP 10.96.0.0: the provided IP (10.96.0.0) is not in the valid range. The range of valid IPs is 10.96.0.0/24`,
			Causes: []metav1.StatusCause{invalid("spec.clusterIPs",
				`Invalid value: []string{"10.96.0.0"}: failed to allocate IP 10.96.0.0: the provided IP (10.96.0.0) is not in the valid range. The range of valid IPs is 10.96.0.0/24`)}}},
		{name: "a value as JSON", release: "1.35.4", ips: []string{"10.96.0.0"}, want: statusOf{
			Code: 422, Reason: metav1.StatusReasonInvalid,
			Message: `Service "svc" is invalid: spec.clusterIPs: Invalid value: ["10.96.0.0"]: failed to allocate IP 10.96.0.0: the provided IP (10.96.0.0) is not in the valid range. The range of valid IPs is 10.96.0.0/24`,
			Causes: []metav1.StatusCause{invalid("spec.clusterIPs",
				`Invalid value: ["10.96.0.0"]: failed to allocate IP 10.96.0.0: the provided IP (10.96.0.0) is not in the valid range. The range of valid IPs is 10.96.0.0/24`)}}},
		{name: "a refused IPAddress is the reason in DualWrite", release: "1.33.13", alloc: refusing{err: refusal}, want: statusOf{
			Code: 500, Reason: metav1.StatusReasonInternalError,
			Message: "Internal error occurred: failed to allocate a serviceIP: " + refusalText,
			Causes:  []metav1.StatusCause{{Message: "failed to allocate a serviceIP: " + refusalText}}}},
		{name: "a refused IPAddress reads as a full range in IPAddressOnly", release: "1.33.13", gates: map[string]bool{"DisableAllocatorDualWrite": true}, alloc: refusing{err: refusal}, want: statusOf{
			Code: 500, Reason: metav1.StatusReasonInternalError,
			Message: "Internal error occurred: failed to allocate a serviceIP: range is full",
			Causes:  []metav1.StatusCause{{Message: "failed to allocate a serviceIP: range is full"}}}},
		{name: "a refused IPAddress is Invalid", release: "1.35.4", alloc: refusing{err: fmt.Errorf("ipaddress: create IPAddress 10.96.0.20: %w", refusal)}, want: statusOf{
			Code: 422, Reason: metav1.StatusReasonInvalid,
			Message: `Service "svc" is invalid: spec.clusterIPs: Invalid value: [""]: failed to allocate IP: ` + refusalText,
			Causes:  []metav1.StatusCause{invalid("spec.clusterIPs", "Invalid value: [\"\"]: failed to allocate IP: "+refusalText)}}},
		{name: "a full range", release: "1.35.4", alloc: refusing{err: allocator.ErrFull}, want: statusOf{
			Code: 500, Reason: metav1.StatusReasonInternalError,
			Message: "Internal error occurred: failed to allocate a serviceIP: range is full",
			Causes:  []metav1.StatusCause{{Message: "failed to allocate a serviceIP: range is full"}}}},
		{name: "a full range names the Service", release: "1.36.3", alloc: refusing{err: allocator.ErrFull}, want: statusOf{
			Code: 500, Reason: metav1.StatusReasonInternalError,
			Message: `Internal error occurred: failed to allocate a serviceIP for Service "svc": range is full`,
			Causes:  []metav1.StatusCause{{Message: `failed to allocate a serviceIP for Service "svc": range is full`}}}},
		{name: "no ready ServiceCIDR is a full range", release: "1.37.2", alloc: refusing{err: allocator.ErrNotReady}, want: statusOf{
			Code: 500, Reason: metav1.StatusReasonInternalError,
			Message: `Internal error occurred: failed to allocate a serviceIP for Service "svc": range is full`,
			Causes:  []metav1.StatusCause{{Message: `failed to allocate a serviceIP for Service "svc": range is full`}}}},
		// v1.38 (read from v1.38.0-beta.0's alloc.go and ipallocator) answers as v1.37.
		{name: "leading zeros are refused", release: featuregate.NewestKubeVersion, ips: []string{"10.96.0.010"}, want: statusOf{
			Code: 422, Reason: metav1.StatusReasonInvalid,
			Message: `Service "svc" is invalid: spec.clusterIPs[0]: Invalid value: "10.96.0.010": must not have leading 0s`,
			Causes:  []metav1.StatusCause{invalid("spec.clusterIPs[0]", `Invalid value: "10.96.0.010": must not have leading 0s`)}}},
		{name: "a refused IPAddress is Invalid", release: featuregate.NewestKubeVersion, alloc: refusing{err: fmt.Errorf("ipaddress: create IPAddress 10.96.0.20: %w", refusal)}, want: statusOf{
			Code: 422, Reason: metav1.StatusReasonInvalid,
			Message: `Service "svc" is invalid: spec.clusterIPs: Invalid value: [""]: failed to allocate IP: ` + refusalText,
			Causes:  []metav1.StatusCause{invalid("spec.clusterIPs", "Invalid value: [\"\"]: failed to allocate IP: "+refusalText)}}},
		{name: "no ready ServiceCIDR is a full range", release: featuregate.NewestKubeVersion, alloc: refusing{err: allocator.ErrNotReady}, want: statusOf{
			Code: 500, Reason: metav1.StatusReasonInternalError,
			Message: `Internal error occurred: failed to allocate a serviceIP for Service "svc": range is full`,
			Causes:  []metav1.StatusCause{{Message: `failed to allocate a serviceIP for Service "svc": range is full`}}}},
	}
	for _, tt := range tests {
		t.Run(tt.release+"/"+tt.name, func(t *testing.T) {
			a := tt.alloc
			if a == nil {
				a = mustBitmap(t, "10.96.0.0/24")
			}
			opts := optionsOf(t, tt.release)
			gate, err := featuregate.NewGate(opts.Version, tt.gates)
			if err != nil {
				t.Fatal(err)
			}
			opts.FeatureGate = gate
			sa := service.NewWithOptions(corev1.IPv4Protocol, map[corev1.IPFamily]allocator.Interface{corev1.IPv4Protocol: a}, opts)
			svc := matrixService("svc", matrixSpec{})
			if len(tt.ips) > 0 {
				svc.Spec.ClusterIP, svc.Spec.ClusterIPs = tt.ips[0], tt.ips
			}
			_, err = sa.Allocate(ctx, svc, false)
			if tt.want.Code == 0 {
				if err != nil {
					t.Fatalf("Allocate() = %v, want success", err)
				}
				return
			}
			if diff := cmp.Diff(tt.want, statusOfErr(t, err)); diff != "" {
				t.Errorf("Allocate() status (-want +got):\n%s", diff)
			}
		})
	}
}

// TestStrictValidationKeepsWhatAServiceHas: from v1.36 a new ClusterIP with leading zeros is
// refused, but a Service stored by an older release keeps the spelling it has through updates.
func TestStrictValidationKeepsWhatAServiceHas(t *testing.T) {
	ctx := context.Background()
	bm := mustBitmap(t, "10.96.0.0/24")
	sa := service.NewWithOptions(corev1.IPv4Protocol, map[corev1.IPFamily]allocator.Interface{corev1.IPv4Protocol: bm}, optionsOf(t, "1.37.2"))
	// Stored by v1.35, which takes the spelling and allocates 10.96.0.10.
	stored := matrixService("old", matrixSpec{})
	stored.Spec.ClusterIP, stored.Spec.ClusterIPs = "10.96.0.010", []string{"10.96.0.010"}
	v135 := service.NewWithOptions(corev1.IPv4Protocol, map[corev1.IPFamily]allocator.Interface{corev1.IPv4Protocol: bm}, optionsOf(t, "1.35.4"))
	if _, err := v135.Allocate(ctx, stored, false); err != nil {
		t.Fatal(err)
	}

	upd := stored.DeepCopy()
	upd.Labels = map[string]string{"changed": "yes"}
	if _, err := sa.Update(ctx, stored, upd, false); err != nil {
		t.Errorf("v1.37 Update() of a Service holding 10.96.0.010 = %v, want it kept", err)
	}
	if _, err := sa.Allocate(ctx, func() *corev1.Service {
		s := matrixService("new", matrixSpec{})
		s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.0.011", []string{"10.96.0.011"}
		return s
	}(), false); err == nil || !strings.Contains(err.Error(), "must not have leading 0s") {
		t.Errorf("v1.37 Allocate() of 10.96.0.011 = %v, want it refused for its leading zeros", err)
	}
}
