package repair

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/client-go/kubernetes/fake"

	clusterip "github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

// TestRepairRewritesABitmapOfAnotherRange: after --service-cluster-ip-range changed, the
// stored bitmap is of the old range, and every Legacy allocation fails until kube-apiserver
// v1.33's Legacy repair rewrites it to the flag's range on its first pass. The first pass does the
// same here, in Legacy mode and in DualWrite mode (where the mirror writes no bits until then): the stored range becomes the flag's; the bits of the old bitmap inside the new range stay
// (a Service's for good, a leaked one until its hold-off is over, 3 passes as in kube-apiserver),
// those outside it go, and the bits of the Services inside the new range are set.
func TestRepairRewritesABitmapOfAnotherRange(t *testing.T) {
	tests := []struct {
		name     string
		stored   *bitmap.Allocator
		flag     string
		services []string // "namespace/name=ip"
		want     []string // the bits stored after the first pass
		held     int      // leaks held off by the first pass
	}{
		{
			name:   "a wider range",
			stored: bits(t, "10.0.0.0/24", "10.0.0.10", "10.0.0.30"), flag: "10.0.0.0/23",
			services: []string{"a/kept=10.0.0.10", "a/new=10.0.1.5"},
			want:     []string{"10.0.0.10", "10.0.0.30", "10.0.1.5"}, held: 1,
		},
		{
			name:   "a narrower range",
			stored: bits(t, "10.0.0.0/23", "10.0.0.10", "10.0.1.10"), flag: "10.0.0.0/24",
			services: []string{"a/kept=10.0.0.10", "a/out=10.0.1.10"},
			want:     []string{"10.0.0.10"},
		},
		{
			name:   "another range",
			stored: bits(t, "10.0.0.0/24", "10.0.0.10"), flag: "10.1.0.0/24",
			services: []string{"a/old=10.0.0.10", "a/new=10.1.0.7"},
			want:     []string{"10.1.0.7"},
		},
		{
			name:   "another family",
			stored: bits(t, "fd00::/120", "fd00::5"), flag: "10.1.0.0/24",
			services: []string{"a/v6=fd00::5"},
			want:     nil,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, mode := range []featuregate.Mode{featuregate.Legacy, featuregate.DualWrite} {
				t.Run(mode.String(), func(t *testing.T) { testRewrite(t, mode, tt.stored, tt.flag, tt.services, tt.want, tt.held) })
			}
		})
	}
}

// testRewrite stores a bitmap and Services (and, in DualWrite mode, the flag range's ServiceCIDR),
// runs one repair pass in mode, and checks the bits it leaves and the leaks it holds off.
func testRewrite(t *testing.T, mode featuregate.Mode, stored *bitmap.Allocator, flagRange string, services, want []string, held int) {
	cli := testenv.NewEtcd(t).TestClient(t)
	key := etcdstore.ServiceIPsKey("")
	storeBitmap(t, cli, key, stored)
	client := fake.NewClientset()
	if mode == featuregate.DualWrite {
		if err := client.Tracker().Add(testenv.ServiceCIDR("kubernetes", flagRange)); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range services {
		k, ip, _ := strings.Cut(s, "=")
		if err := client.Tracker().Add(svc(k, ip)); err != nil {
			t.Fatal(err)
		}
	}
	flag := netip.MustParsePrefix(flagRange)
	cfg := clusterip.Config{Mode: mode, Ranges: []netip.Prefix{flag}, Client: client, Bitmaps: etcdstore.Stores{Client: cli}}
	c, err := NewController(cfg, Options{LeakGrace: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.RunOnce(t.Context()); err != nil {
		t.Fatalf("first RunOnce() = %v, want nil", err)
	}
	if got := c.HeldOff(); got != held {
		t.Errorf("HeldOff() = %d, want %d", got, held)
	}
	snap, _, err := etcdstore.New(cli, key).Get(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if snap.Range != flagRange {
		t.Fatalf("stored range after the first pass = %q, want %q", snap.Range, flagRange)
	}
	b := bits(t, flagRange)
	if err := b.Restore(snap); err != nil {
		t.Fatal(err)
	}
	var got []string
	for ip := range b.All() {
		got = append(got, ip.String())
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("bits after the first pass (-want +got):\n%s", diff)
	}
	rep, err := Audit(t.Context(), cfg)
	if err != nil {
		t.Fatalf("Audit() after the first pass = %v, want a report", err)
	}
	if n := rep.Counts["bitmapsOfOtherRange"]; n != 0 {
		t.Errorf(`Counts["bitmapsOfOtherRange"] after the first pass = %d, want 0`, n)
	}
}
