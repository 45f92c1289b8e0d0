package servicecidr

import (
	"errors"
	"net/netip"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

func TestAllocateNextOutsideNeverChoosesPrefixesInside(t *testing.T) {
	tests := []struct {
		name    string
		cidrs   []string
		outside string
		allowed []string // prefixes the addresses may come from
		n       int      // AllocateNextOutside calls that succeed; the next one gives ErrFull
	}{
		{name: "flag range skipped, extra served", cidrs: []string{"10.0.0.0/24", "10.1.0.0/28"}, outside: "10.0.0.0/24", allowed: []string{"10.1.0.0/28"}, n: 14},
		{name: "prefix nested in the skipped one skipped too", cidrs: []string{"10.0.0.0/24", "10.0.0.0/28", "10.1.0.0/29"}, outside: "10.0.0.0/24", allowed: []string{"10.1.0.0/29"}, n: 6},
		{name: "only prefixes inside: full", cidrs: []string{"10.0.0.0/24"}, outside: "10.0.0.0/24", n: 0},
		{name: "a prefix containing the skipped one is served", cidrs: []string{"10.0.0.0/28", "10.0.0.0/27"}, outside: "10.0.0.0/28", allowed: []string{"10.0.0.0/27"}, n: 30},
		{name: "zero prefix skips nothing", cidrs: []string{"10.0.0.0/29"}, allowed: []string{"10.0.0.0/29"}, n: 6},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var objs []runtime.Object
			for i, c := range tt.cidrs {
				objs = append(objs, testenv.ServiceCIDR(string(rune('a'+i)), c))
			}
			f := newFixture(t, fixtureConfig{mem: newMemFactory(), objects: objs})
			f.waitReady(tt.cidrs...)
			var skip netip.Prefix
			if tt.outside != "" {
				skip = netip.MustParsePrefix(tt.outside)
			}
			for i := range tt.n {
				ip, err := f.alloc.AllocateNextOutside(f.ctx, testOwner, skip)
				if err != nil {
					t.Fatalf("AllocateNextOutside(%v) #%d = %v", skip, i+1, err)
				}
				ok := false
				for _, p := range tt.allowed {
					ok = ok || netip.MustParsePrefix(p).Contains(ip)
				}
				if !ok {
					t.Errorf("AllocateNextOutside(%v) #%d = %v, want an address of %v", skip, i+1, ip, tt.allowed)
				}
			}
			if _, err := f.alloc.AllocateNextOutside(f.ctx, testOwner, skip); !errors.Is(err, allocator.ErrFull) {
				t.Errorf("AllocateNextOutside(%v) once the rest is full = %v, want ErrFull", skip, err)
			}
		})
	}
}
