package metrics

import (
	"context"
	"net/netip"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
)

// BenchmarkAllocateNextRelease measures one AllocateNext+Release pair on an in-memory /12 bitmap,
// bare and wrapped, to show what recording the metrics adds.
func BenchmarkAllocateNextRelease(b *testing.B) {
	ctx := context.Background()
	for _, wrap := range []bool{false, true} {
		name := "bare"
		if wrap {
			name = "wrapped"
		}
		b.Run(name, func(b *testing.B) {
			inner, err := bitmap.New(netip.MustParsePrefix("10.96.0.0/12"))
			if err != nil {
				b.Fatal(err)
			}
			var a allocator.Interface = inner
			if wrap {
				rec, err := New(prometheus.NewRegistry())
				if err != nil {
					b.Fatal(err)
				}
				a = rec.Wrap(inner, Source{Label: "10.96.0.0/12"})
			}
			b.ReportAllocs()
			for b.Loop() {
				ip, err := a.AllocateNext(ctx, allocator.Owner{})
				if err != nil {
					b.Fatal(err)
				}
				if err := a.Release(ctx, ip); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
