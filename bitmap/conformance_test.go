package bitmap_test

import (
	"net/netip"
	"testing"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/allocator/allocatortest"
	"github.com/kube-ipam/clusterip/bitmap"
)

func TestAllocatorConformance(t *testing.T) {
	allocatortest.Run(t, func(t *testing.T, cidr netip.Prefix) allocator.Interface {
		a, err := bitmap.New(cidr)
		if err != nil {
			t.Fatalf("New(%v) = %v", cidr, err)
		}
		return a
	})
}
