package reservation_test

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/fakeclient"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/reservation"
)

// BenchmarkServiceAllocateWithReservations measures what reservations cost a Service create that
// has none: Services().Allocate then Release of a Service asking for any address, in IPAddressOnly
// mode over the repository's fake clientset (client-go's, with watches that keep up) on a /16, without Config.Reservations and with it, with
// 0, 100 and 10 000 reservations kept for other Services. With Config.Reservations every create
// looks up its reservation in an informer index first.
func BenchmarkServiceAllocateWithReservations(b *testing.B) {
	for _, tc := range []struct {
		on    bool
		count int
	}{{false, 0}, {true, 0}, {true, 100}, {true, 10000}} {
		b.Run(fmt.Sprintf("reservations=%v/kept=%d", tc.on, tc.count), func(b *testing.B) {
			objs := []runtime.Object{&networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"},
				Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.96.0.0/16"}}}}
			for i := range tc.count {
				o, err := reservation.ObjectFor(reservation.Reservation{Addr: netip.AddrFrom4([4]byte{10, 96, byte(128 + i/256), byte(i % 256)}),
					For: types.NamespacedName{Namespace: "kept", Name: fmt.Sprintf("svc-%d", i)}})
				if err != nil {
					b.Fatal(err)
				}
				objs = append(objs, o)
			}
			client := fakeclient.New(fakeclient.Options{Objects: objs})
			inf := informers.NewSharedInformerFactory(client, 0)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			a, err := clusterip.New(ctx, clusterip.Config{Mode: featuregate.IPAddressOnly, Reservations: tc.on,
				Ranges: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")}, Client: client, Informers: inf})
			if err != nil {
				b.Fatal(err)
			}
			defer a.Close()
			inf.Start(ctx.Done())
			go func() { _ = a.Run(ctx) }()
			if err := a.WaitReady(ctx); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				svc := testenv.ClusterIPService(fmt.Sprintf("s-%d", i), "")
				svc.Spec.ClusterIP = ""
				if _, err := a.Services().Allocate(ctx, svc, false); err != nil {
					b.Fatal(err)
				}
				if err := a.Services().Release(ctx, svc); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
		})
	}
}

// BenchmarkIndexCountIn measures what the ServiceCIDR cap costs one delete that keeps an address
// (Limits asks Index.CountIn once per capped prefix): 10 000 reservations in 10.96.128.0/18 and a
// count in the /16 that holds them all, one in a /24 that holds 256, and one in a prefix that
// holds none.
func BenchmarkIndexCountIn(b *testing.B) {
	inf := cache.NewSharedIndexInformer(&cache.ListWatch{}, &networkingv1.IPAddress{}, 0, cache.Indexers{})
	idx, err := reservation.NewIndex(inf)
	if err != nil {
		b.Fatal(err)
	}
	const kept = 10000
	for i := range kept {
		o, err := reservation.ObjectFor(reservation.Reservation{Addr: netip.AddrFrom4([4]byte{10, 96, byte(128 + i/256), byte(i % 256)}),
			For: types.NamespacedName{Namespace: "kept", Name: fmt.Sprintf("svc-%d", i)}})
		if err != nil {
			b.Fatal(err)
		}
		if err := inf.GetIndexer().Add(o); err != nil {
			b.Fatal(err)
		}
	}
	now := time.Now()
	for _, tc := range []struct {
		prefix string
		want   int
	}{{"10.96.0.0/16", kept}, {"10.96.130.0/24", 256}, {"10.97.0.0/16", 0}} {
		p := netip.MustParsePrefix(tc.prefix)
		b.Run(tc.prefix, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if n := idx.CountIn(p, now, netip.Addr{}); n != tc.want {
					b.Fatalf("CountIn(%s) = %d, want %d", p, n, tc.want)
				}
			}
		})
	}
}
