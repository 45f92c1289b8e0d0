package servicecidr

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestReadyIsReadyConditionTrueOrAbsentAndNotBeingDeleted(t *testing.T) {
	now := metav1.Now()
	cond := func(s metav1.ConditionStatus) []metav1.Condition {
		return []metav1.Condition{{Type: networkingv1.ServiceCIDRConditionReady, Status: s, Reason: "R"}}
	}
	tests := []struct {
		name string
		sc   *networkingv1.ServiceCIDR
		want bool
	}{
		{"nil", nil, false},
		{"no conditions: ready, as kube-apiserver assumes when kube-controller-manager does not run", &networkingv1.ServiceCIDR{}, true},
		{"Ready=True", &networkingv1.ServiceCIDR{Status: networkingv1.ServiceCIDRStatus{Conditions: cond(metav1.ConditionTrue)}}, true},
		{"Ready=False", &networkingv1.ServiceCIDR{Status: networkingv1.ServiceCIDRStatus{Conditions: cond(metav1.ConditionFalse)}}, false},
		{"Ready=Unknown", &networkingv1.ServiceCIDR{Status: networkingv1.ServiceCIDRStatus{Conditions: cond(metav1.ConditionUnknown)}}, false},
		{"another condition only", &networkingv1.ServiceCIDR{Status: networkingv1.ServiceCIDRStatus{Conditions: []metav1.Condition{{Type: "Other", Status: metav1.ConditionFalse}}}}, true},
		{"being deleted, no conditions", &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &now}}, false},
		{"being deleted, Ready=True", &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &now},
			Status: networkingv1.ServiceCIDRStatus{Conditions: cond(metav1.ConditionTrue)}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Ready(tt.sc); got != tt.want {
				t.Errorf("Ready() = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestPrefixesAreEveryParsedSpecCIDRMasked(t *testing.T) {
	tests := []struct {
		name  string
		cidrs []string
		want  []netip.Prefix
	}{
		{"none", nil, nil},
		{"dual stack, in order", []string{"fd00::/108", "10.96.0.0/16"}, []netip.Prefix{netip.MustParsePrefix("fd00::/108"), netip.MustParsePrefix("10.96.0.0/16")}},
		{"host bits masked", []string{"10.96.0.1/24"}, []netip.Prefix{netip.MustParsePrefix("10.96.0.0/24")}},
		{"one no allocator serves is kept", []string{"::ffff:10.0.0.0/120"}, []netip.Prefix{netip.MustParsePrefix("::ffff:10.0.0.0/120")}},
		{"one that does not parse is left out", []string{"bogus", "10.96.0.0/24"}, []netip.Prefix{netip.MustParsePrefix("10.96.0.0/24")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Prefixes(&networkingv1.ServiceCIDR{Spec: networkingv1.ServiceCIDRSpec{CIDRs: tt.cidrs}})
			if diff := cmp.Diff(tt.want, got, cmpopts.EquateEmpty(), cmpopts.EquateComparable(netip.Prefix{})); diff != "" {
				t.Errorf("Prefixes() (-want +got):\n%s", diff)
			}
		})
	}
	if got := Prefixes(nil); got != nil {
		t.Errorf("Prefixes(nil) = %v, want nil", got)
	}
}
