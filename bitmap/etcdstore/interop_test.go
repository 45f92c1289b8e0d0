package etcdstore_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

// TestLegacyKubeAPIServerAndPersistentShareOneBitmap runs a real kube-apiserver v1.33.13 with
// only the legacy bitmap allocator (MultiCIDRServiceAllocator=false) and a Persistent allocator
// on the same etcd key, and checks that each honours what the other stored: the apiserver refuses
// and never hands out our addresses, we see and never hand out its, and what we release it can
// allocate again.
func TestLegacyKubeAPIServerAndPersistentShareOneBitmap(t *testing.T) {
	etcd := testenv.NewEtcd(t)
	kas := testenv.NewKubeAPIServer(t, etcd, testenv.KubeAPIServerOptions{
		ServiceClusterIPRange: testCIDR,
		FeatureGates:          "MultiCIDRServiceAllocator=false",
	})
	// The deadline starts once the apiserver is up: the first run on a machine builds it first.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	services := kas.Client.CoreV1().Services(metav1.NamespaceDefault)

	// The apiserver creates the "kubernetes" Service at 10.96.0.1 on start-up.
	kubernetesIP := netip.MustParseAddr("10.96.0.1")
	if got := testenv.WaitForKubernetesService(t, kas.Client); got != kubernetesIP {
		t.Fatalf("the kubernetes Service's ClusterIP = %v, want %v", got, kubernetesIP)
	}
	key := etcdstore.ServiceIPsKey(etcdstore.DefaultPrefix)
	p := newPersistent(t, etcd.TestClient(t), key, testCIDR)
	if !p.Has(kubernetesIP) || p.Used() != 1 {
		t.Fatalf("our view of the apiserver's bitmap: Has(%v) = %v, Used() = %d; want true, 1", kubernetesIP, p.Has(kubernetesIP), p.Used())
	}

	// We take half of the range, including one chosen address.
	ours := map[netip.Addr]bool{}
	chosen := netip.MustParseAddr("10.96.0.50")
	if err := p.Allocate(ctx, chosen, allocator.Owner{}); err != nil {
		t.Fatalf("Allocate(%v) = %v", chosen, err)
	}
	ours[chosen] = true
	for len(ours) < 127 {
		ip, err := p.AllocateNext(ctx, allocator.Owner{})
		if err != nil {
			t.Fatalf("AllocateNext() = %v", err)
		}
		ours[ip] = true
	}

	// The apiserver refuses a Service that asks for one of our addresses.
	_, err := services.Create(ctx, testenv.ClusterIPService("wants-ours", chosen.String()), metav1.CreateOptions{})
	if !apierrors.IsInvalid(err) {
		t.Errorf("creating a Service with clusterIP %v that we hold = %v, want an Invalid error (already allocated)", chosen, err)
	}

	// The apiserver fills the rest of the range and never hands out one of ours.
	theirs := map[netip.Addr]bool{kubernetesIP: true}
	for i := 0; ; i++ {
		svc, err := services.Create(ctx, testenv.ClusterIPService(fmt.Sprintf("svc-%d", i), ""), metav1.CreateOptions{})
		if err != nil {
			if len(ours)+len(theirs) < 254 {
				t.Fatalf("creating Service #%d with %d+%d addresses taken = %v", i, len(ours), len(theirs), err)
			}
			break // full: the apiserver agrees the range is exhausted
		}
		ip := netip.MustParseAddr(svc.Spec.ClusterIP)
		if ours[ip] || theirs[ip] {
			t.Fatalf("the apiserver handed out %v, which is already held (ours: %v)", ip, ours[ip])
		}
		theirs[ip] = true
	}
	if got := len(ours) + len(theirs); got != 254 {
		t.Errorf("%d ours + %d the apiserver's = %d addresses, want all 254", len(ours), len(theirs), got)
	}

	// We read the apiserver's allocations back and find the range full.
	if err := p.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	for ip := range theirs {
		if !p.Has(ip) {
			t.Errorf("Has(%v) = false for an address the apiserver allocated", ip)
		}
	}
	if _, err := p.AllocateNext(ctx, allocator.Owner{}); !errors.Is(err, allocator.ErrFull) {
		t.Errorf("AllocateNext() after the apiserver filled the range = %v, want ErrFull", err)
	}

	// What we release, the apiserver can allocate again, and only that.
	if err := p.Release(ctx, chosen); err != nil {
		t.Fatal(err)
	}
	svc, err := services.Create(ctx, testenv.ClusterIPService("after-release", ""), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating a Service after we released %v = %v", chosen, err)
	}
	if got := svc.Spec.ClusterIP; got != chosen.String() {
		t.Errorf("the apiserver allocated %s after we released %v, want %v", got, chosen, chosen)
	}
	// And what the apiserver releases, we can allocate.
	if err := deleteService(ctx, kas.Client, "after-release"); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the released address", func() bool {
		return p.Refresh(ctx) == nil && !p.Has(chosen)
	})
	if ip, err := p.AllocateNext(ctx, allocator.Owner{}); err != nil || ip != chosen {
		t.Errorf("AllocateNext() after the apiserver deleted its Service = %v, %v; want %v", ip, err, chosen)
	}
}

func deleteService(ctx context.Context, client kubernetes.Interface, name string) error {
	return client.CoreV1().Services(metav1.NamespaceDefault).Delete(ctx, name, metav1.DeleteOptions{})
}
