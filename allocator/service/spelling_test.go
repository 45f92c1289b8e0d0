package service_test

import (
	"context"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
)

// TestServiceAllocatorAcceptsClusterIPSpellingsOfV133 checks that a chosen ClusterIP is read as
// kube-apiserver v1.33 reads it (StrictIPCIDRValidation off, its default): the Service keeps the
// spelling it was given, the allocator of the parsed address's family takes the parsed address,
// and an update and a release give that address back. The matrix records the same spellings
// against a real kube-apiserver.
func TestServiceAllocatorAcceptsClusterIPSpellingsOfV133(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name         string
		written      string
		wantFamilies []corev1.IPFamily
		wantHeld     string
	}{
		{"IPv4 with a leading zero is decimal", "10.96.0.010", []corev1.IPFamily{corev1.IPv4Protocol}, "10.96.0.10"},
		{"IPv4-mapped IPv6 is the IPv4 address", "::ffff:10.96.0.11", []corev1.IPFamily{corev1.IPv4Protocol}, "10.96.0.11"},
		{"upper-case IPv6", "FD00:10:96::A", []corev1.IPFamily{corev1.IPv6Protocol}, "fd00:10:96::a"},
		{"IPv6 without ::", "fd00:10:96:0:0:0:0:b", []corev1.IPFamily{corev1.IPv6Protocol}, "fd00:10:96::b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mc := newMemCluster(t, matrixCluster{Name: "dual", Ranges: []string{"10.96.0.0/16", "fd00:10:96::/112"}}, optionsOf(t, "1.33.13"))
			svc := matrixService("spelled", matrixSpec{ClusterIP: &tt.written, ClusterIPs: &[]string{tt.written}})
			txn, err := mc.sa.Allocate(ctx, svc, false)
			if err != nil {
				t.Fatalf("Allocate(%q) error = %v", tt.written, err)
			}
			if err := txn.Commit(ctx); err != nil {
				t.Fatalf("Commit() = %v", err)
			}
			if got, want := svc.Spec.ClusterIPs, []string{tt.written}; !slices.Equal(got, want) {
				t.Errorf("spec.clusterIPs = %q, want %q as written", got, want)
			}
			if svc.Spec.ClusterIP != tt.written {
				t.Errorf("spec.clusterIP = %q, want %q as written", svc.Spec.ClusterIP, tt.written)
			}
			if diff := cmp.Diff(tt.wantFamilies, svc.Spec.IPFamilies); diff != "" {
				t.Errorf("spec.ipFamilies (-want +got):\n%s", diff)
			}
			mc.checkHeld(t, "after Allocate", []string{tt.wantHeld})

			// A second Service asking for another spelling of the same address is refused.
			other := matrixService("other", matrixSpec{ClusterIP: &tt.wantHeld, ClusterIPs: &[]string{tt.wantHeld}})
			if _, err := mc.sa.Allocate(ctx, other, false); err == nil {
				t.Errorf("Allocate(%q) of a Service holding %q succeeded", tt.wantHeld, tt.written)
			}

			// An update that drops the address (to ExternalName) releases the parsed address.
			upd := svc.DeepCopy()
			upd.Spec.Type = corev1.ServiceTypeExternalName
			upd.Spec.ExternalName = "example.com"
			utxn, err := mc.sa.Update(ctx, svc, upd, false)
			if err != nil {
				t.Fatalf("Update to ExternalName: %v", err)
			}
			if err := utxn.Commit(ctx); err != nil {
				t.Fatalf("Commit() = %v", err)
			}
			mc.checkHeld(t, "after an update to ExternalName", nil)

			// Release gives the parsed address back too.
			svc2 := matrixService("spelled2", matrixSpec{ClusterIP: &tt.written, ClusterIPs: &[]string{tt.written}})
			txn, err = mc.sa.Allocate(ctx, svc2, false)
			if err != nil {
				t.Fatalf("second Allocate(%q) error = %v", tt.written, err)
			}
			if err := txn.Commit(ctx); err != nil {
				t.Fatalf("Commit() = %v", err)
			}
			if err := mc.sa.Release(ctx, svc2); err != nil {
				t.Fatalf("Release: %v", err)
			}
			mc.checkHeld(t, "after Release", nil)
		})
	}
}

// TestServiceAllocatorDowngradeReleasesParsedSecondary checks that a dual-stack Service whose
// secondary address is written in a non-canonical spelling gives the parsed address back when
// it is downgraded to SingleStack.
func TestServiceAllocatorDowngradeReleasesParsedSecondary(t *testing.T) {
	ctx := context.Background()
	mc := newMemCluster(t, matrixCluster{Name: "dual", Ranges: []string{"fd00:10:96::/112", "10.96.0.0/16"}}, optionsOf(t, "1.33.13"))
	require := "RequireDualStack"
	primary, secondary := "FD00:10:96::C", "10.96.0.012"
	svc := matrixService("down", matrixSpec{IPFamilyPolicy: &require, ClusterIP: &primary, ClusterIPs: &[]string{primary, secondary}})
	txn, err := mc.sa.Allocate(ctx, svc, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := txn.Commit(ctx); err != nil {
		t.Fatalf("Commit() = %v", err)
	}
	mc.checkHeld(t, "after Allocate", []string{"10.96.0.12", "fd00:10:96::c"})
	upd := svc.DeepCopy()
	single := corev1.IPFamilyPolicySingleStack
	upd.Spec.IPFamilyPolicy = &single
	utxn, err := mc.sa.Update(ctx, svc, upd, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := utxn.Commit(ctx); err != nil {
		t.Fatalf("Commit() = %v", err)
	}
	if got, want := upd.Spec.ClusterIPs, []string{primary}; !slices.Equal(got, want) {
		t.Errorf("spec.clusterIPs after the downgrade = %q, want %q", got, want)
	}
	mc.checkHeld(t, "after the downgrade", []string{"fd00:10:96::c"})
	if err := mc.sa.Release(ctx, upd); err != nil {
		t.Fatal(err)
	}
	mc.checkHeld(t, "after Release", nil)
}
