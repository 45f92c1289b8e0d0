package clusterip

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/fakeclient"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

// newFakeAllocators builds the Allocators of cfg over a fake clientset holding one ServiceCIDR
// per range (DualWrite and IPAddressOnly), without starting anything, and returns them with
// their informer factory (nil in Legacy mode). They are closed when t ends.
func newFakeAllocators(t *testing.T, cfg Config) (*Allocators, informers.SharedInformerFactory) {
	t.Helper()
	var inf informers.SharedInformerFactory
	if cfg.Mode != featuregate.Legacy {
		var objs []runtime.Object
		for i, r := range cfg.Ranges {
			objs = append(objs, testenv.ServiceCIDR(fmt.Sprintf("cidr-%d", i), r.String()))
		}
		cfg.Client = fakeclient.New(fakeclient.Options{Objects: objs})
		inf = informers.NewSharedInformerFactory(cfg.Client, 0)
		cfg.Informers = inf
	}
	a, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("New() = %v", err)
	}
	t.Cleanup(func() { a.Close() })
	return a, inf
}

func TestWaitReadyReturnsOnceEveryFamilyServes(t *testing.T) {
	a, inf := newFakeAllocators(t, Config{
		Mode:   featuregate.IPAddressOnly,
		Ranges: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/24"), netip.MustParsePrefix("fd00::/120")},
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// Before Run nothing follows the ServiceCIDRs, so WaitReady waits until ctx is done.
	short, cancelShort := context.WithTimeout(ctx, 50*time.Millisecond)
	err := a.WaitReady(short)
	cancelShort()
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "IPv4") {
		t.Fatalf("WaitReady() before Run = %v, want an error naming IPv4 that matches context.DeadlineExceeded", err)
	}

	inf.Start(ctx.Done())
	defer inf.Shutdown()
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	readyCtx, cancelReady := context.WithTimeout(ctx, testenv.WaitTimeout)
	defer cancelReady()
	if err := a.WaitReady(readyCtx); err != nil {
		t.Fatalf("WaitReady() = %v", err)
	}
	for _, f := range a.Families() {
		if !a.ServiceCIDRs(f).Ready() {
			t.Errorf("after WaitReady, ServiceCIDRs(%s).Ready() = false", f)
		}
	}
	if _, err := a.For(corev1.IPv6Protocol).AllocateNext(ctx, testOwner); err != nil {
		t.Errorf("AllocateNext() after WaitReady = %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run() = %v", err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("Close() = %v", err)
	}
	if err := a.WaitReady(context.Background()); err == nil {
		t.Error("WaitReady() after Close = nil, want an error")
	}
}

// TestDualWriteAccessorSeesThroughMetrics builds the allocators of each mode beside a real etcd
// and checks that DualWrite returns the dual-write layer in DualWrite mode, even when the
// metrics wrap For's result, and nil otherwise; and that WaitReady does not wait in Legacy mode.
func TestDualWriteAccessorSeesThroughMetrics(t *testing.T) {
	etcd := testenv.NewEtcd(t).TestClient(t)
	rg := netip.MustParsePrefix("10.96.0.0/24")
	for i, mode := range []featuregate.Mode{featuregate.Legacy, featuregate.DualWrite, featuregate.IPAddressOnly} {
		t.Run(mode.String(), func(t *testing.T) {
			cfg := Config{Mode: mode, Ranges: []netip.Prefix{rg}, Registerer: prometheus.NewPedanticRegistry()}
			if mode != featuregate.IPAddressOnly {
				cfg.Bitmaps = etcdstore.Stores{Client: etcd, Prefix: fmt.Sprintf("/accessor%d", i)}
			}
			a, _ := newFakeAllocators(t, cfg)
			dw := a.DualWrite(corev1.IPv4Protocol)
			if got, want := dw != nil, mode == featuregate.DualWrite; got != want {
				t.Fatalf("DualWrite(IPv4) = %v, want non-nil %v", dw, want)
			}
			if a.DualWrite(corev1.IPv6Protocol) != nil {
				t.Error("DualWrite(IPv6) of an IPv4 cluster != nil")
			}
			if dw != nil {
				u, ok := a.For(corev1.IPv4Protocol).(interface{ Unwrap() allocator.Interface })
				if !ok || u.Unwrap() != allocator.Interface(dw) {
					t.Errorf("For(IPv4) = %T, want a metrics wrapper of DualWrite(IPv4)", a.For(corev1.IPv4Protocol))
				}
				if got := dw.Stats(); got != (DualWriteStats{}) {
					t.Errorf("Stats() of fresh allocators = %+v, want zero", got)
				}
			}
			if mode == featuregate.Legacy {
				ctx, cancel := context.WithCancel(context.Background())
				cancel() // Legacy is ready without Run: a done ctx does not matter
				if err := a.WaitReady(ctx); err != nil {
					t.Errorf("WaitReady() in Legacy mode = %v, want nil at once", err)
				}
			}
		})
	}
}
