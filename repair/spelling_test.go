package repair

import (
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	clusterip "github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

// spellings are the ClusterIP spellings kube-apiserver v1.33 accepts and stores as written.
var spellings = testenv.ClusterIPSpellings()

// TestClassifyKeysNonCanonicalClusterIPsByTheParsedAddress: a Service holding a ClusterIP
// spelling v1.33 accepts holds the parsed address, whose IPAddress object and bit are its own:
// consistent in every mode, never invalid, never a leak. A second Service holding the same
// address in another spelling is a duplicate.
func TestClassifyKeysNonCanonicalClusterIPsByTheParsedAddress(t *testing.T) {
	const flag4, flag6 = "10.96.0.0/24", "fd00:10:96::/112"
	var services []*corev1.Service
	var ipas []*networkingv1.IPAddress
	var bits4, bits6 []string
	for i, s := range spellings {
		key := "ns/s" + string(rune('a'+i))
		services = append(services, svc(key, s.ClusterIP))
		ipas = append(ipas, ipAddr(s.Addr, key))
		if netip.MustParseAddr(s.Addr).Is4() {
			bits4 = append(bits4, s.Addr)
		} else {
			bits6 = append(bits6, s.Addr)
		}
	}
	cidrs := []*networkingv1.ServiceCIDR{testenv.ServiceCIDR("kubernetes", flag4, flag6)}
	tests := []struct {
		name     string
		mode     featuregate.Mode
		services []*corev1.Service
		want     []Finding
	}{
		{name: "legacy/consistent", mode: featuregate.Legacy, services: services},
		{name: "dualwrite/consistent", mode: featuregate.DualWrite, services: services},
		{name: "ipaddress/consistent", mode: featuregate.IPAddressOnly, services: services},
		{name: "dualwrite/a canonical spelling of the same address in a second Service is a duplicate", mode: featuregate.DualWrite,
			services: append(services[:1:1], svc("ns/z", "10.96.0.10")),
			want:     []Finding{f("10.96.0.10", DuplicateOwner, "ns/sa")}},
		{name: "dualwrite/one Service listing one address in two spellings holds it once", mode: featuregate.DualWrite,
			services: []*corev1.Service{svc("ns/sa", "10.96.0.010", "10.96.0.10")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := &world{mode: tt.mode, services: tt.services, cidrs: cidrs, ipAddresses: ipas,
				bitmaps: []*bitmap.Allocator{bits(t, flag4, bits4...), bits(t, flag6, bits6...)}}
			var want []Finding
			if len(tt.services) < len(services) {
				// The IPAddress objects and bits of the spellings no Service holds any more leak.
				held := map[string]bool{}
				for _, s := range tt.services {
					for _, ip := range s.Spec.ClusterIPs {
						held[ip] = true
					}
				}
				for _, s := range spellings {
					if !held[s.ClusterIP] && !held[s.Addr] {
						want = append(want, f(s.Addr, Leaked, ""))
					}
				}
			}
			want = append(want, tt.want...)
			sortFindings(want, func(f *Finding) *Finding { return f })
			got := classify(w).report(tt.mode)
			if diff := cmp.Diff(want, got.Findings, ignoreDetail, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("findings (-want +got):\n%s", diff)
			}
		})
	}
}

// TestRepairKeepsTheRecordsOfNonCanonicalClusterIPs: one DualWrite pass with no hold-off on a
// cluster whose Services hold v1.33's non-canonical spellings deletes no IPAddress object and
// clears no bit: doing so would let the allocator hand the address to a second Service.
func TestRepairKeepsTheRecordsOfNonCanonicalClusterIPs(t *testing.T) {
	e := testenv.NewEtcd(t)
	cli := e.TestClient(t)
	ranges := []netip.Prefix{netip.MustParsePrefix("10.96.0.0/24"), netip.MustParsePrefix("fd00:10:96::/112")}
	var bits4, bits6 []string
	objects := []runtime.Object{testenv.ServiceCIDR("kubernetes", "10.96.0.0/24", "fd00:10:96::/112")}
	for i, s := range spellings {
		key := "ns/s" + string(rune('a'+i))
		objects = append(objects, svc(key, s.ClusterIP), aged(ipAddr(s.Addr, key), time.Hour))
		if netip.MustParseAddr(s.Addr).Is4() {
			bits4 = append(bits4, s.Addr)
		} else {
			bits6 = append(bits6, s.Addr)
		}
	}
	storeBitmap(t, cli, etcdstore.ServiceIPsKey(""), bits(t, "10.96.0.0/24", bits4...))
	storeBitmap(t, cli, etcdstore.SecondaryServiceIPsKey(""), bits(t, "fd00:10:96::/112", bits6...))
	client := fake.NewClientset(objects...)
	cfg := clusterip.Config{Mode: featuregate.DualWrite, Ranges: ranges, Client: client, Bitmaps: etcdstore.Stores{Client: cli}}
	rec := &recorder{}
	c, err := NewController(cfg, Options{LeakGrace: -1, Recorder: rec})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := c.RunOnce(t.Context())
	if err != nil {
		t.Fatalf("RunOnce() error = %v", err)
	}
	if !rep.Consistent {
		t.Errorf("RunOnce() acted on %+v, want a consistent audit", rep.Findings)
	}
	for _, a := range client.Actions() {
		if v := a.GetVerb(); v != "list" && v != "get" {
			t.Errorf("repair made a %s of %s; want reads only", v, a.GetResource().Resource)
		}
	}
	if got := rec.Got(); len(got) != 0 {
		t.Errorf("Events %q, want none", got)
	}
	for _, mode := range []featuregate.Mode{featuregate.DualWrite, featuregate.Legacy, featuregate.IPAddressOnly} {
		rep, err := Audit(t.Context(), withMode(cfg, mode))
		if err != nil {
			t.Fatal(err)
		}
		if !rep.Consistent {
			t.Errorf("Audit(%s) after a pass: %+v, want consistent", mode, rep.Findings)
		}
	}
}
