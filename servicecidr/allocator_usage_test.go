package servicecidr

import (
	"net/netip"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kube-ipam/clusterip/internal/testenv"
)

// waitUsage waits until f's Allocator reports want as its Usage.
func waitUsage(t *testing.T, f *fixture, want []PrefixUsage) {
	t.Helper()
	var got []PrefixUsage
	testenv.WaitFor(t, "Usage", func() bool {
		got = f.alloc.Usage()
		return slices.Equal(want, got)
	})
	if !slices.Equal(want, got) {
		t.Fatalf("Usage() = %+v, want %+v", got, want)
	}
}

// waitServing waits until the per-CIDR allocator of every ready prefix serves (its informer has
// synced): until then PrefixOf, Allocate and Release go through a ready prefix inside it, whose
// allocator already does. Usage can be complete before that.
func waitServing(t *testing.T, f *fixture) {
	t.Helper()
	testenv.WaitFor(t, "the allocator of every ready prefix to serve", func() bool {
		for _, v := range f.alloc.views(func(*entry) bool { return true }) {
			if v.ready && !v.serving() {
				return false
			}
		}
		return true
	})
}

func TestUsageCountsEachPrefixOnItsOwn(t *testing.T) {
	// Two nested prefixes share 10.0.0.5; 10.0.1.5 is only in the outer one; a ServiceCIDR that
	// is not ready is reported too. The per-CIDR allocators are the real ones (IPAddress objects).
	f := newFixture(t, fixtureConfig{objects: []runtime.Object{
		testenv.ServiceCIDR("wide", "10.0.0.0/16"), testenv.ServiceCIDR("narrow", "10.0.0.0/24"),
		testenv.ServiceCIDR("also-narrow", "10.0.0.0/24"), notReady(testenv.ServiceCIDR("idle", "10.1.0.0/28")),
		testenv.IPAddress("10.0.0.5", "default", "test"), testenv.IPAddress("10.0.1.5", "default", "test"), testenv.IPAddress("10.1.0.3", "default", "test"), testenv.IPAddress("10.9.0.1", "default", "test"),
	}})
	waitUsage(t, f, []PrefixUsage{
		{Prefix: netip.MustParsePrefix("10.0.0.0/16"), Used: 2, Free: 65534 - 2, Ready: true},
		{Prefix: netip.MustParsePrefix("10.0.0.0/24"), Used: 1, Free: 254 - 1, Ready: true},
		{Prefix: netip.MustParsePrefix("10.1.0.0/28"), Used: 1, Free: 14 - 1, Ready: false},
	})
	// CI saw PrefixOf(10.0.0.5) answer the /24 once: the /16's allocator had not synced yet.
	waitServing(t, f)
	for _, tt := range []struct {
		ip     string
		want   string // "" for none
		reason string
	}{
		{"10.0.0.5", "10.0.0.0/16", "the outermost of two nested prefixes"},
		{"10.0.1.5", "10.0.0.0/16", "the only prefix"},
		{"10.0.0.255", "10.0.0.0/16", "the broadcast address of the inner prefix only"},
		{"10.0.0.0", "", "the network address of both"},
		{"10.1.0.3", "10.1.0.0/28", "a prefix that is not ready, there being no other"},
		{"10.1.0.0", "", "the network address of the only prefix"},
		{"10.9.0.1", "", "in no prefix"},
	} {
		got, ok := f.alloc.PrefixOf(netip.MustParseAddr(tt.ip))
		if want, wantOK := tt.want, tt.want != ""; ok != wantOK || (ok && got.String() != want) {
			t.Errorf("PrefixOf(%s) = %v, %v; want %q (%s)", tt.ip, got, ok, want, tt.reason)
		}
	}

	// A prefix stays while one of its ServiceCIDRs does, and goes with the last.
	f.delete("narrow")
	f.delete("idle")
	waitUsage(t, f, []PrefixUsage{
		{Prefix: netip.MustParsePrefix("10.0.0.0/16"), Used: 2, Free: 65534 - 2, Ready: true},
		{Prefix: netip.MustParsePrefix("10.0.0.0/24"), Used: 1, Free: 254 - 1, Ready: true},
	})
	f.delete("also-narrow")
	waitUsage(t, f, []PrefixUsage{
		{Prefix: netip.MustParsePrefix("10.0.0.0/16"), Used: 2, Free: 65534 - 2, Ready: true},
	})

	// A new prefix is reported from the moment its allocator exists, empty or not.
	f.create(testenv.ServiceCIDR("fresh", "10.2.0.0/29"))
	waitUsage(t, f, []PrefixUsage{
		{Prefix: netip.MustParsePrefix("10.0.0.0/16"), Used: 2, Free: 65534 - 2, Ready: true},
		{Prefix: netip.MustParsePrefix("10.2.0.0/29"), Used: 0, Free: 6, Ready: true},
	})
}
