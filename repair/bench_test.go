package repair

import (
	"net/netip"
	"strconv"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	clusterip "github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/ipmath"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

// bigWorld returns a consistent DualWrite world of n Services in 10.96.0.0/12, each with its
// IPAddress object and its bit, plus a few findings of each kind.
func bigWorld(b *testing.B, n int) *world {
	b.Helper()
	p := netip.MustParsePrefix("10.96.0.0/12")
	bm, err := bitmap.New(p)
	if err != nil {
		b.Fatal(err)
	}
	w := &world{mode: featuregate.DualWrite, cidrs: []*networkingv1.ServiceCIDR{testenv.ServiceCIDR("kubernetes", p.String())}}
	for i := range n {
		ip, _ := ipmath.AddrAt(p, uint64(i)*7)
		key := "ns" + strconv.Itoa(i%100) + "/svc" + strconv.Itoa(i)
		w.services = append(w.services, svc(key, ip.String()))
		w.ipAddresses = append(w.ipAddresses, ipAddr(ip.String(), key))
		if i%1000 != 0 { // one in a thousand ipaddress-only
			if err := bm.Allocate(b.Context(), ip, allocator.Owner{}); err != nil {
				b.Fatal(err)
			}
		}
	}
	w.bitmaps = []*bitmap.Allocator{bm}
	return w
}

// BenchmarkClassify100k measures the audit's pure core over 100k Services, 100k IPAddress
// objects and 100k bits (target: ≤ 1 s of CPU for the 100k, nothing quadratic).
func BenchmarkClassify100k(b *testing.B) {
	w := bigWorld(b, 100_000)
	b.ReportAllocs()
	b.ResetTimer()
	cpu := cpuTime()
	for b.Loop() {
		r := classify(w)
		if got := r.counts[string(IPAddressOnly)]; got != 100 {
			b.Fatalf("ipaddress-only = %d, want 100", got)
		}
	}
	b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op")
}

// BenchmarkAuditFakeClientset measures Audit in IPAddressOnly mode over Services, each with its
// IPAddress object, served by the client-go fake clientset, whose List deep-copies, sorts and
// copies again every object: the scale target (≤ 1 s of CPU per 100k) counts that cost too. It
// reads "100k Services + IPAddress objects" both ways: 50k of each (100k objects) and 100k of each.
func BenchmarkAuditFakeClientset(b *testing.B) {
	for _, n := range []int{50_000, 100_000} {
		b.Run("services="+strconv.Itoa(n)+"/ipaddresses="+strconv.Itoa(n), func(b *testing.B) {
			benchmarkAuditFakeClientset(b, n)
		})
	}
}

func benchmarkAuditFakeClientset(b *testing.B, n int) {
	w := bigWorld(b, n)
	objs := make([]runtime.Object, 0, 2*len(w.services)+1)
	objs = append(objs, w.cidrs[0])
	for _, s := range w.services {
		objs = append(objs, s)
	}
	for _, a := range w.ipAddresses {
		objs = append(objs, a)
	}
	//nolint:staticcheck // NewSimpleClientset: no managed fields, much faster to seed with 200k objects
	client := fake.NewSimpleClientset(objs...)
	cfg := clusterip.Config{Mode: featuregate.IPAddressOnly, Ranges: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}, Client: client}
	b.ReportAllocs()
	b.ResetTimer()
	cpu := cpuTime()
	for b.Loop() {
		rep, err := Audit(b.Context(), cfg)
		if err != nil {
			b.Fatal(err)
		}
		if !rep.Consistent {
			b.Fatalf("audit of a consistent cluster: %d findings", len(rep.Findings))
		}
	}
	b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op")
}
