package servicecidr

import (
	"errors"
	"net/netip"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/ipaddress"
)

// managedIPAddress returns an IPAddress for ip as an Allocator with the default managed-by label
// would create it for webOwner.
func managedIPAddress(ip string) *networkingv1.IPAddress {
	ipa := testenv.IPAddress(ip, "default", "test")
	ipa.Labels = map[string]string{networkingv1.LabelManagedBy: ipaddress.DefaultManagedBy}
	ipa.Spec.ParentRef.Name = webOwner.Name
	return ipa
}

func (f *fixture) ipAddressExists(ip string) bool {
	f.t.Helper()
	_, err := f.client.NetworkingV1().IPAddresses().Get(f.ctx, ip, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false
	}
	if err != nil {
		f.t.Fatalf("get IPAddress %s: %v", ip, err)
	}
	return true
}

// TestReleaseOutsideKnownServiceCIDRs releases addresses whose IPAddress exists in no ServiceCIDR
// the Allocator knows: ours are deleted, others are left with an error saying why.
func TestReleaseOutsideKnownServiceCIDRs(t *testing.T) {
	runScenario(t, func(t *testing.T, b backend) {
		t.Run("ServiceCIDRDeletedWithoutLifecycleController", func(t *testing.T) {
			f := b.fixture(t, fixtureConfig{})
			f.create(testenv.ServiceCIDR("a", "10.31.0.0/24"))
			f.waitReady("10.31.0.0/24")
			ip, err := f.alloc.AllocateNext(f.ctx, webOwner)
			if err != nil {
				t.Fatalf("AllocateNext() = %v", err)
			}
			f.prefixes = append(f.prefixes, netip.MustParsePrefix("10.31.0.0/24"))
			f.delete("a")
			f.waitReady()
			testenv.WaitFor(t, "the prefix to go", func() bool { return f.alloc.refs(netip.MustParsePrefix("10.31.0.0/24")) == 0 })
			if err := f.alloc.Release(f.ctx, ip); err != nil {
				t.Fatalf("Release(%v) = %v, want nil", ip, err)
			}
			if f.ipAddressExists(ip.String()) {
				t.Errorf("IPAddress %v still exists after Release returned nil", ip)
			}
		})
		t.Run("BeforeTheFirstSync", func(t *testing.T) {
			f := b.fixture(t, fixtureConfig{noRun: true})
			f.prefixes = append(f.prefixes, netip.MustParsePrefix("10.32.0.0/24"))
			if _, err := f.client.NetworkingV1().IPAddresses().Create(f.ctx, managedIPAddress("10.32.0.5"), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			if err := f.alloc.Release(f.ctx, netip.MustParseAddr("10.32.0.5")); err != nil {
				t.Fatalf("Release() before the first sync = %v, want nil", err)
			}
			if f.ipAddressExists("10.32.0.5") {
				t.Errorf("IPAddress 10.32.0.5 still exists after Release returned nil")
			}
			if err := f.alloc.Release(f.ctx, netip.MustParseAddr("10.32.0.6")); err != nil {
				t.Errorf("Release() of an address with no IPAddress = %v, want nil", err)
			}
		})
		t.Run("NotOurs", func(t *testing.T) {
			f := b.fixture(t, fixtureConfig{})
			f.prefixes = append(f.prefixes, netip.MustParsePrefix("10.33.0.0/24"))
			foreign := managedIPAddress("10.33.0.5")
			foreign.Labels[networkingv1.LabelManagedBy] = "someone-else.example.com"
			if _, err := f.client.NetworkingV1().IPAddresses().Create(f.ctx, foreign, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			if err := f.alloc.Release(f.ctx, netip.MustParseAddr("10.33.0.5")); !errors.Is(err, ErrNotManaged) {
				t.Errorf("Release() of another manager's IPAddress = %v, want ErrNotManaged", err)
			}
			if !f.ipAddressExists("10.33.0.5") {
				t.Errorf("another manager's IPAddress was deleted")
			}
		})
	}, fakeBackend, apiserverBackend)
}

// TestManagedByReachesEveryPerCIDRAllocator checks that the IPAddress objects the Allocator
// creates carry its own managed-by value, the default included, even when WithIPAddressOptions
// passes the per-CIDR allocators another one, so that Release recognises every object it made.
func TestManagedByReachesEveryPerCIDRAllocator(t *testing.T) {
	tests := []struct {
		name string
		opts []Option
		want string
	}{
		{"default", nil, ipaddress.DefaultManagedBy},
		{"default over an ipaddress option", []Option{WithIPAddressOptions(ipaddress.WithManagedBy("other.example.com"))}, ipaddress.DefaultManagedBy},
		{"own value", []Option{WithManagedBy("mine.example.com")}, "mine.example.com"},
		{"own value over an ipaddress option", []Option{WithManagedBy("mine.example.com"), WithIPAddressOptions(ipaddress.WithManagedBy("other.example.com"))}, "mine.example.com"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, fixtureConfig{opts: tt.opts})
			f.create(testenv.ServiceCIDR("a", "10.32.0.0/24"))
			f.waitReady("10.32.0.0/24")
			ip, err := f.alloc.AllocateNext(f.ctx, webOwner)
			if err != nil {
				t.Fatalf("AllocateNext() = %v", err)
			}
			ipa, err := f.client.NetworkingV1().IPAddresses().Get(f.ctx, ip.String(), metav1.GetOptions{})
			if err != nil {
				t.Fatalf("get IPAddress %v: %v", ip, err)
			}
			if got := ipa.Labels[networkingv1.LabelManagedBy]; got != tt.want {
				t.Errorf("managed-by label = %q, want %q", got, tt.want)
			}
			if err := f.alloc.Release(f.ctx, ip); err != nil {
				t.Errorf("Release(%v) = %v, want nil", ip, err)
			}
		})
	}
}
