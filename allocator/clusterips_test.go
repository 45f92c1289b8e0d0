package allocator_test

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/kube-ipam/clusterip/allocator"
)

func TestClusterIPs(t *testing.T) {
	tests := []struct {
		name     string
		spec     corev1.ServiceSpec
		wantRaw  []string
		wantAddr []string
	}{
		{"dual stack", corev1.ServiceSpec{ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10", "fd00::a"}},
			[]string{"10.96.0.10", "fd00::a"}, []string{"10.96.0.10", "fd00::a"}},
		{"non-canonical spellings", corev1.ServiceSpec{ClusterIPs: []string{"10.96.0.010", "FD00:0::A"}},
			[]string{"10.96.0.010", "FD00:0::A"}, []string{"10.96.0.10", "fd00::a"}},
		{"IPv4-mapped", corev1.ServiceSpec{ClusterIPs: []string{"::ffff:10.96.0.11"}},
			[]string{"::ffff:10.96.0.11"}, []string{"10.96.0.11"}},
		{"clusterIP only", corev1.ServiceSpec{ClusterIP: "10.96.0.12"}, []string{"10.96.0.12"}, []string{"10.96.0.12"}},
		{"headless", corev1.ServiceSpec{ClusterIP: "None", ClusterIPs: []string{"None"}}, nil, nil},
		{"empty first", corev1.ServiceSpec{ClusterIPs: []string{"", "fd00::a"}}, nil, nil},
		{"none", corev1.ServiceSpec{}, nil, nil},
		{"one that does not parse", corev1.ServiceSpec{ClusterIPs: []string{"10.96.0.300", "fd00::a"}},
			[]string{"10.96.0.300", "fd00::a"}, []string{"fd00::a"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := &corev1.Service{Spec: tt.spec}
			if diff := cmp.Diff(tt.wantRaw, allocator.RawClusterIPs(svc)); diff != "" {
				t.Errorf("RawClusterIPs() (-want +got):\n%s", diff)
			}
			var want []netip.Addr
			for _, s := range tt.wantAddr {
				want = append(want, netip.MustParseAddr(s))
			}
			if diff := cmp.Diff(want, allocator.ClusterIPs(svc), cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
				t.Errorf("ClusterIPs() (-want +got):\n%s", diff)
			}
		})
	}
	if allocator.ClusterIPs(nil) != nil || allocator.RawClusterIPs(nil) != nil {
		t.Errorf("ClusterIPs(nil) or RawClusterIPs(nil) is not nil")
	}
}
