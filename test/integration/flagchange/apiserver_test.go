package flagchange

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/allocator/service"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/repair"
	"github.com/kube-ipam/clusterip/test/integration/internal/clustertest"
)

// The --service-cluster-ip-range of the first and of the second run of the flag-change tests
// against a real kube-apiserver: the second contains the first, so the first run's Services stay
// in range.
const (
	flagBefore = "10.0.0.0/24"
	flagAfter  = "10.0.0.0/23"
)

// Feature gates of kube-apiserver v1.33 for each mode.
const (
	gatesLegacy        = "MultiCIDRServiceAllocator=false"
	gatesIPAddressOnly = "MultiCIDRServiceAllocator=true,DisableAllocatorDualWrite=true"
)

// storedBitmapAfterLegacyRun starts a stock kube-apiserver v1.33 in Legacy mode with
// --service-cluster-ip-range=flagBefore on etcd under prefix, creates a Service through it and
// stops it. It returns that Service's ClusterIP: the stored bitmap of flagBefore, written by
// kube-apiserver, holds it and the kubernetes Service's.
func storedBitmapAfterLegacyRun(t *testing.T, etcd *testenv.Etcd, prefix string) netip.Addr {
	t.Helper()
	api := testenv.NewKubeAPIServer(t, etcd, testenv.KubeAPIServerOptions{
		ServiceClusterIPRange: flagBefore, FeatureGates: gatesLegacy, EtcdPrefix: prefix,
	})
	ctx := context.Background()
	svc, err := api.Client.CoreV1().Services("default").Create(ctx, testenv.ClusterIPService("before", ""), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create a Service through kube-apiserver with %s: %v", flagBefore, err)
	}
	testenv.WaitForKubernetesService(t, api.Client)
	api.Stop()
	return netip.MustParseAddr(svc.Spec.ClusterIP)
}

// storedRange returns the range of the bitmap stored at the primary key under prefix, and its
// revision.
func storedRange(t *testing.T, cli *clientv3.Client, prefix string) (bitmap.Snapshot, int64) {
	t.Helper()
	snap, rev, err := etcdstore.New(cli, etcdstore.ServiceIPsKey(prefix)).Get(context.Background())
	if err != nil || rev == 0 {
		t.Fatalf("read the bitmap under %s: rev %d, %v", prefix, rev, err)
	}
	return snap, rev
}

// TestLegacyStartsOverKubeAPIServersBitmapOfAnotherRange: kube-apiserver v1.33 wrote the bitmap of
// one --service-cluster-ip-range; the flag changes. Our Legacy allocators start on it, refuse
// every allocation with kube-apiserver's text until the repair's first pass rewrites the bitmap
// to the new range (keeping the Services' bits), then allocate from it; and a stock Legacy
// kube-apiserver with the new flag starts on what the repair wrote and allocates around the bits
// it kept.
func TestLegacyStartsOverKubeAPIServersBitmapOfAnotherRange(t *testing.T) {
	etcd := testenv.NewEtcd(t)
	cli := etcd.TestClient(t)
	const prefix = "/registry-flagchange-legacy"
	before := storedBitmapAfterLegacyRun(t, etcd, prefix)
	ctx := context.Background()

	cfg := clusterip.Config{Mode: featuregate.Legacy, Version: clustertest.StockVersion(t), Ranges: []netip.Prefix{netip.MustParsePrefix(flagAfter)}, Bitmaps: etcdstore.Stores{Client: cli, Prefix: prefix}}
	a, err := clusterip.New(ctx, cfg)
	if err != nil {
		t.Fatalf("New(Legacy, %s) over kube-apiserver's bitmap of %s = %v, want nil", flagAfter, flagBefore, err)
	}
	defer a.Close()
	v4 := a.For(corev1.IPv4Protocol)
	if _, err := v4.AllocateNext(ctx, allocator.Owner{}); !errors.Is(err, allocator.ErrMismatchedNetwork) || !strings.HasPrefix(err.Error(), kubeAPIServerRangeMismatch) {
		t.Fatalf("AllocateNext() before the repair = %v; want ErrMismatchedNetwork beginning with %q", err, kubeAPIServerRangeMismatch)
	}
	// Through the Service layer, as a Legacy kube-apiserver would answer if asked before its repair.
	_, err = a.Services().Allocate(ctx, testenv.ClusterIPService("early", ""), false)
	if want := "failed to allocate a serviceIP: " + kubeAPIServerRangeMismatch; !apierrors.IsInternalError(err) || !strings.Contains(err.Error(), want) {
		t.Errorf("Services().Allocate() before the repair = %v; want 500 with %q", err, want)
	}
	if snap, _ := storedRange(t, cli, prefix); snap.Range != flagBefore {
		t.Fatalf("a refused allocation changed the stored bitmap to %q", snap.Range)
	}

	// The repair reads the Services through a kube-apiserver that keeps off the bitmaps
	// (IPAddressOnly), so that the rewrite is ours.
	api := testenv.NewKubeAPIServer(t, etcd, testenv.KubeAPIServerOptions{
		ServiceClusterIPRange: flagAfter, FeatureGates: gatesIPAddressOnly, EtcdPrefix: prefix,
	})
	cfg.Client = api.Client
	c, err := repair.NewController(cfg, repair.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.RunOnce(ctx); err != nil {
		t.Fatalf("repair RunOnce() = %v", err)
	}
	api.Stop()
	snap, _ := storedRange(t, cli, prefix)
	if snap.Range != flagAfter {
		t.Fatalf("stored range after the repair = %q, want %q", snap.Range, flagAfter)
	}
	kept := []netip.Addr{netip.MustParseAddr("10.0.0.1"), before} // the kubernetes Service's, and ours
	if err := a.Bitmap(corev1.IPv4Protocol).Refresh(ctx); err != nil {
		t.Fatalf("Refresh() after the repair = %v", err)
	}
	for _, ip := range kept {
		if !v4.Has(ip) {
			t.Errorf("bit of %s lost by the rewrite", ip)
		}
	}
	ip, err := v4.AllocateNext(ctx, allocator.Owner{})
	if err != nil || !netip.MustParsePrefix(flagAfter).Contains(ip) {
		t.Fatalf("AllocateNext() after the repair = %v, %v; want an address of %s", ip, err, flagAfter)
	}
	if err := v4.Release(ctx, ip); err != nil {
		t.Fatal(err)
	}

	// A stock Legacy kube-apiserver with the new flag starts on the rewritten bitmap.
	stock := testenv.NewKubeAPIServer(t, etcd, testenv.KubeAPIServerOptions{
		ServiceClusterIPRange: flagAfter, FeatureGates: gatesLegacy, EtcdPrefix: prefix,
	})
	svc, err := stock.Client.CoreV1().Services("default").Create(ctx, testenv.ClusterIPService("after", ""), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create a Service through the stock server after our rewrite: %v", err)
	}
	got := netip.MustParseAddr(svc.Spec.ClusterIP)
	if !netip.MustParsePrefix(flagAfter).Contains(got) || got == before || got == kept[0] {
		t.Errorf("stock server allocated %s; want a free address of %s", got, flagAfter)
	}
	if snap, _ := storedRange(t, cli, prefix); snap.Range != flagAfter {
		t.Errorf("stored range after the stock server's allocation = %q, want %q", snap.Range, flagAfter)
	}
}

// TestDualWriteAnswersAsKubeAPIServerOverABitmapOfAnotherRange: kube-apiserver v1.33 wrote the
// bitmap of one --service-cluster-ip-range; a stock kube-apiserver v1.33 in DualWrite mode
// starts with another, and so do our DualWrite allocators, beside it. Both answer alike: a
// Service without a ClusterIP gets one from the ServiceCIDRs; a Service asking for an address of
// the flag range is refused with 422 Invalid and "the provided range does not match the current
// range"; and neither writes the stored bitmap.
func TestDualWriteAnswersAsKubeAPIServerOverABitmapOfAnotherRange(t *testing.T) {
	etcd := testenv.NewEtcd(t)
	cli := etcd.TestClient(t)
	const prefix = "/registry-flagchange-dualwrite"
	storedBitmapAfterLegacyRun(t, etcd, prefix)
	_, rev := storedRange(t, cli, prefix)
	ctx := context.Background()

	stock := testenv.NewKubeAPIServer(t, etcd, testenv.KubeAPIServerOptions{ServiceClusterIPRange: flagAfter, EtcdPrefix: prefix})
	cidrs := waitForDefaultServiceCIDR(t, stock.Client)
	cfg := clusterip.Config{Mode: featuregate.DualWrite, Version: clustertest.StockVersion(t), Ranges: []netip.Prefix{netip.MustParsePrefix(flagAfter)}, Bitmaps: etcdstore.Stores{Client: cli, Prefix: prefix}, Client: stock.Client}
	ours := startFlagServer(t, cfg, stock.Client, cidrs)

	tests := []struct {
		name      string
		clusterIP [2]string // asked of kube-apiserver, of clusterip; "" for any
		wantErr   bool
	}{
		{name: "any ClusterIP"},
		{name: "a ClusterIP of the flag range", clusterIP: [2]string{"10.0.1.10", "10.0.1.11"}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for i, who := range []string{"kube-apiserver", "clusterip"} {
				svc := testenv.ClusterIPService(fmt.Sprintf("svc-%s-%d", who, len(tt.name)), tt.clusterIP[i])
				var err error
				if who == "kube-apiserver" {
					svc, err = stock.Client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
				} else {
					// What the Service registry of a fork on clusterip does before it stores the
					// Service (storing it here would have the stock server allocate it again).
					var txn *service.Transaction
					if txn, err = ours.allocs.Services().Allocate(ctx, svc, false); err == nil {
						err = txn.Commit(ctx)
					}
				}
				switch {
				case tt.wantErr && (!apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "failed to allocate IP "+tt.clusterIP[i]+": "+kubeAPIServerRangeMismatch)):
					t.Errorf("%s: %v; want 422 Invalid with %q", who, err, "failed to allocate IP "+tt.clusterIP[i]+": "+kubeAPIServerRangeMismatch)
				case tt.wantErr:
					t.Logf("%s: %v", who, err)
				case err != nil:
					t.Errorf("%s: %v; want a ClusterIP", who, err)
				case !inAny(cidrs, svc.Spec.ClusterIP):
					t.Errorf("%s: ClusterIP %s in no ServiceCIDR of %v", who, svc.Spec.ClusterIP, cidrs)
				default:
					t.Logf("%s: ClusterIP %s", who, svc.Spec.ClusterIP)
				}
			}
		})
	}
	if snap, got := storedRange(t, cli, prefix); snap.Range != flagBefore || got != rev {
		t.Errorf("stored bitmap is of %q at revision %d, want %s at %d: nobody writes a mirror of another range", snap.Range, got, flagBefore, rev)
	}
}

// waitForDefaultServiceCIDR waits until kube-apiserver has made its default ServiceCIDR and
// returns its CIDRs.
func waitForDefaultServiceCIDR(t *testing.T, c kubernetes.Interface) []string {
	t.Helper()
	var cidrs []string
	testenv.WaitFor(t, "the default ServiceCIDR", func() bool {
		sc, err := c.NetworkingV1().ServiceCIDRs().Get(context.Background(), "kubernetes", metav1.GetOptions{})
		if err != nil {
			return false
		}
		cidrs = sc.Spec.CIDRs
		return true
	})
	return cidrs
}

func inAny(cidrs []string, ip string) bool {
	for _, c := range cidrs {
		if cidrContains(c, ip) {
			return true
		}
	}
	return false
}
