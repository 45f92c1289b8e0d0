package allocator_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-ipam/clusterip/allocator"
)

func TestServiceOwner(t *testing.T) {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", UID: "u-1"}}
	want := allocator.Owner{Resource: "services", Namespace: "ns", Name: "web", UID: "u-1"}
	if got := allocator.ServiceOwner(svc); got != want {
		t.Errorf("ServiceOwner() = %+v, want %+v", got, want)
	}
	if got := allocator.ServiceOwner(nil); !got.IsZero() {
		t.Errorf("ServiceOwner(nil) = %+v, want the zero Owner", got)
	}
}

func TestOwnerString(t *testing.T) {
	tests := []struct {
		o    allocator.Owner
		want string
	}{
		{allocator.Owner{}, ""},
		{allocator.Owner{Resource: "services", Namespace: "ns", Name: "web"}, "services ns/web"},
		{allocator.Owner{Group: "gateway.networking.k8s.io", Resource: "gateways", Name: "gw"}, "gateways.gateway.networking.k8s.io gw"},
		{allocator.Owner{Resource: "services"}, "services"},
		{allocator.Owner{Namespace: "ns", Name: "web"}, "ns/web"},
		{allocator.Owner{Group: "example.com", Resource: "widgets", Namespace: "ns", Name: "w", UID: "u-1"}, "widgets.example.com ns/w"},
		{allocator.Owner{Group: "example.com", Resource: "widgets"}, "widgets.example.com"},
	}
	for _, tt := range tests {
		if got := tt.o.String(); got != tt.want {
			t.Errorf("%+v.String() = %q, want %q", tt.o, got, tt.want)
		}
	}
}
