package gates

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/version"
	basefeaturegate "k8s.io/component-base/featuregate"

	"github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

// TestGatesOffOnRunLegacyAsKubeAPIServerDoes starts a real kube-apiserver v1.33.13 with
// MultiCIDRServiceAllocator=false and DisableAllocatorDualWrite=true, as upstream's own
// integration tests do: it starts, and allocates a Service's ClusterIP in the bitmap alone, with
// no IPAddress object, which is Legacy. ModeOf selects Legacy for the same gates, and our Legacy
// allocators share that bitmap with it.
func TestGatesOffOnRunLegacyAsKubeAPIServerDoes(t *testing.T) {
	const gates = "MultiCIDRServiceAllocator=false,DisableAllocatorDualWrite=true"
	gate := basefeaturegate.NewVersionedFeatureGate(version.MajorMinor(1, 33))
	if err := featuregate.Add(gate); err != nil {
		t.Fatal(err)
	}
	if err := gate.Set(gates); err != nil {
		t.Fatal(err)
	}
	mode, err := featuregate.ModeOf(gate)
	if err != nil || mode != featuregate.Legacy {
		t.Fatalf("ModeOf(%s) = %v, %v; want Legacy, nil", gates, mode, err)
	}

	etcd := testenv.NewEtcd(t)
	cli := etcd.TestClient(t)
	const flag, prefix = "10.0.0.0/24", "/registry-offon"
	api := testenv.NewKubeAPIServer(t, etcd, testenv.KubeAPIServerOptions{ServiceClusterIPRange: flag, FeatureGates: gates, EtcdPrefix: prefix})
	ctx := context.Background()
	svc, err := api.Client.CoreV1().Services("default").Create(ctx, testenv.ClusterIPService("offon", ""), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create a Service through kube-apiserver with %s: %v", gates, err)
	}
	ip := netip.MustParseAddr(svc.Spec.ClusterIP)
	if _, err := api.Client.NetworkingV1().IPAddresses().Get(ctx, ip.String(), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("IPAddress %s: %v; want none, as in Legacy", ip, err)
	}

	a, err := clusterip.New(ctx, clusterip.Config{Mode: mode, Ranges: []netip.Prefix{netip.MustParsePrefix(flag)}, Bitmaps: etcdstore.Stores{Client: cli, Prefix: prefix}})
	if err != nil {
		t.Fatalf("New(%v) = %v", mode, err)
	}
	defer a.Close()
	v4 := a.For(corev1.IPv4Protocol)
	if err := v4.Allocate(ctx, ip, allocator.Owner{}); !errors.Is(err, allocator.ErrAllocated) {
		t.Errorf("Allocate(%s), the Service's address, = %v; want ErrAllocated: the bit kube-apiserver set", ip, err)
	}
	got, err := v4.AllocateNext(ctx, allocator.Owner{})
	if err != nil || got == ip {
		t.Errorf("AllocateNext() = %v, %v; want another free address", got, err)
	}
}
