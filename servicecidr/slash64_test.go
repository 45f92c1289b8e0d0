package servicecidr

import (
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kube-ipam/clusterip/internal/testenv"
)

// TestAllocateNextInASlash64NeverLeavesThePrefix is the regression test of kubernetes#138374:
// kube-apiserver v1.33's IPAddress allocator draws a random offset up to 2^64 for an IPv6 /64 and
// adds it as a signed 64-bit number, so every offset of 2^63 or more lands below the prefix: half
// its picks are outside the range they are allocated from. Ours must never leave the prefix,
// whatever the offset, in a /64 at the bottom or at the very top of the address space. Every pick
// goes through the real per-CIDR allocator and creates an IPAddress object.
func TestAllocateNextInASlash64NeverLeavesThePrefix(t *testing.T) {
	const picks = 1000
	tests := []struct {
		name, cidr string
	}{
		{"a /64 with a low prefix", "fd00:10:96::/64"},
		{"the last /64 of the address space", "ffff:ffff:ffff:ffff::/64"},
		{"a /64 whose upper half starts past 2^63", "2001:db8:0:8000::/64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prefix := netip.MustParsePrefix(tt.cidr)
			f := newFixture(t, fixtureConfig{family: corev1.IPv6Protocol, objects: []runtime.Object{testenv.ServiceCIDR("wide", tt.cidr)}})
			f.waitReady(tt.cidr)
			high := 0 // picks whose offset is 2^63 or more: where v1.33 goes wrong
			for i := range picks {
				ip, err := f.alloc.AllocateNext(f.ctx, testOwner)
				if err != nil {
					t.Fatalf("AllocateNext() #%d: %v", i, err)
				}
				if !prefix.Contains(ip) || ip == prefix.Addr() {
					t.Fatalf("AllocateNext() #%d = %s, outside %s", i, ip, prefix)
				}
				if ip.As16()[8]&0x80 != 0 {
					high++
				}
			}
			// The offsets are uniform over the /64: about half have the top host bit set. With
			// none, the test would not exercise the offsets v1.33 gets wrong.
			if high < picks/4 || high > 3*picks/4 {
				t.Errorf("%d of %d picks at an offset of 2^63 or more, want about half", high, picks)
			}
			list, err := f.client.NetworkingV1().IPAddresses().List(f.ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(list.Items) != picks {
				t.Errorf("%d IPAddress objects after %d picks, want %d", len(list.Items), picks, picks)
			}
			for _, ipa := range list.Items {
				if ip, err := netip.ParseAddr(ipa.Name); err != nil || !prefix.Contains(ip) {
					t.Errorf("IPAddress %s is outside %s", ipa.Name, prefix)
				}
			}
		})
	}
}
