package servicecidr

import (
	"net/netip"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"

	"github.com/kube-ipam/clusterip/internal/testenv"
)

func TestHasSyncedFalseBeforeRun(t *testing.T) {
	f := newFixture(t, fixtureConfig{noRun: true, objects: []runtime.Object{testenv.ServiceCIDR("a", "10.1.0.0/28")}})
	// The informers have synced, but nothing has reconciled them.
	if !cache.WaitForCacheSync(f.ctx.Done(), f.alloc.cidrs.HasSynced, f.alloc.ips.HasSynced) {
		t.Fatal("informers did not sync")
	}
	if f.alloc.HasSynced() {
		t.Error("HasSynced() before Run = true, want false")
	}
}

// TestHasSyncedWithNoServiceCIDR checks that HasSynced tells an Allocator that has seen that no
// ServiceCIDR of its family exists from one that has not looked yet, and stays true once a
// ServiceCIDR comes.
func TestHasSyncedWithNoServiceCIDR(t *testing.T) { runScenario(t, testHasSyncedWithNone) }

func testHasSyncedWithNone(t *testing.T, b backend) {
	f := b.fixture(t, fixtureConfig{})
	testenv.WaitFor(t, "HasSynced", f.alloc.HasSynced)
	if f.alloc.Ready() {
		t.Fatalf("Ready() with no ServiceCIDR = true, want false")
	}
	f.create(testenv.ServiceCIDR("a", "10.2.0.0/28"))
	f.waitReady("10.2.0.0/28")
	if !f.alloc.HasSynced() {
		t.Error("HasSynced() after a ServiceCIDR was added = false, want true (it never goes back)")
	}
}

// TestHasSyncedMeansReadyIsSettled checks that once HasSynced is true, Ready answers for the
// ServiceCIDRs of the initial list without waiting: a ready one serves at once, on every backend.
func TestHasSyncedMeansReadyIsSettled(t *testing.T) {
	cidrs := func() []*networkingv1.ServiceCIDR {
		return []*networkingv1.ServiceCIDR{testenv.ServiceCIDR("a", "10.3.0.0/28"), testenv.ServiceCIDR("other-family", "fd00:3::/120")}
	}
	objs := func() []runtime.Object {
		var out []runtime.Object
		for _, sc := range cidrs() {
			out = append(out, sc)
		}
		return out
	}
	check := func(t *testing.T, f *fixture) {
		testenv.WaitFor(t, "HasSynced", f.alloc.HasSynced)
		if got, want := f.alloc.ReadyCIDRs(), []netip.Prefix{netip.MustParsePrefix("10.3.0.0/28")}; len(got) != 1 || got[0] != want[0] {
			t.Fatalf("ReadyCIDRs() as soon as HasSynced() = %v, want %v", got, want)
		}
		if _, err := f.alloc.AllocateNext(f.ctx, testOwner); err != nil {
			t.Errorf("AllocateNext() as soon as HasSynced() = %v, want an address", err)
		}
	}
	t.Run("InMemory", func(t *testing.T) {
		check(t, newFixture(t, fixtureConfig{mem: newMemFactory(), objects: objs()}))
	})
	t.Run("IPAddressFake", func(t *testing.T) {
		check(t, newFixture(t, fixtureConfig{objects: objs()}))
	})
	t.Run("IPAddressKubeAPIServer", func(t *testing.T) {
		client := sharedKubeAPIServer(t)
		label := nextLabel()
		var prefixes []netip.Prefix
		// Created before the Allocator starts, so that its informer's initial list holds them.
		for _, sc := range cidrs() {
			sc.Name = label + "-" + sc.Name
			sc.Labels = map[string]string{testLabel: label}
			for _, c := range sc.Spec.CIDRs {
				prefixes = append(prefixes, netip.MustParsePrefix(c))
			}
			if _, err := client.NetworkingV1().ServiceCIDRs().Create(t.Context(), sc, metav1.CreateOptions{}); err != nil {
				t.Fatalf("create ServiceCIDR %s: %v", sc.Name, err)
			}
		}
		f := newFixture(t, fixtureConfig{client: client, label: label})
		f.prefixes = append(f.prefixes, prefixes...) // for its cleanup
		check(t, f)
	})
}
