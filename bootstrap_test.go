package clusterip

import (
	"context"
	"net/netip"
	"slices"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kube-ipam/clusterip/bitmap"
)

func TestBootstrapFreshClusterCreatesEmptyBitmap(t *testing.T) {
	client := fake.NewSimpleClientset() //nolint:staticcheck // NewClientset needs apply configurations we do not use
	store := bitmap.NewMemStore()
	cidr := netip.MustParsePrefix("10.96.0.0/24")
	if err := bootstrap(context.Background(), client, cidr, store); err != nil {
		t.Fatalf("bootstrap() = %v", err)
	}
	s, rev, err := store.Get(context.Background())
	if err != nil || rev == 0 {
		t.Fatalf("store.Get() = rev %d, %v; want a stored bitmap", rev, err)
	}
	if s.Range != cidr.String() || len(s.Data) != 0 {
		t.Errorf("stored %+v, want an empty bitmap of %s", s, cidr)
	}
}

// Going back from IPAddressOnly to DualWrite: the bitmap is built from the IPAddress objects in its
// window, and those created between the first List and the bitmap's creation are caught up.
func TestBootstrapFromIPAddressObjects(t *testing.T) {
	cidr := netip.MustParsePrefix("fd00::/108")
	var objs []runtime.Object
	var want []netip.Addr
	for _, s := range []string{"fd00::1", "fd00::a", "fd00::ffff", "fd00::1:0", "fd01::1", "10.96.0.1", "not-an-ip"} {
		objs = append(objs, ipAddressObject(s))
		if ip, err := netip.ParseAddr(s); err == nil && (ip == netip.MustParseAddr("fd00::1") || ip == netip.MustParseAddr("fd00::a") || ip == netip.MustParseAddr("fd00::ffff")) {
			want = append(want, ip)
		}
	}
	for i := range 200 {
		ip := netip.MustParseAddr("fd00::1000").Next()
		for range i {
			ip = ip.Next()
		}
		objs = append(objs, ipAddressObject(ip.String()))
		want = append(want, ip)
	}
	client := fake.NewSimpleClientset(objs...) //nolint:staticcheck // NewClientset needs apply configurations we do not use
	// A peer that writes no bits creates one more object right after the first List.
	late := netip.MustParseAddr("fd00::beef")
	lists := 0
	client.PrependReactor("list", "ipaddresses", func(k8stesting.Action) (bool, runtime.Object, error) {
		lists++
		if lists == 2 { // the List of the catch-up: the object was created after the first one
			if err := client.Tracker().Create(networkingv1.SchemeGroupVersion.WithResource("ipaddresses"), ipAddressObject(late.String()), "", metav1.CreateOptions{}); err != nil {
				t.Errorf("create the late IPAddress: %v", err)
			}
		}
		return false, nil, nil
	})
	want = append(want, late)
	slices.SortFunc(want, netip.Addr.Compare)

	store := bitmap.NewMemStore()
	if err := bootstrap(context.Background(), client, cidr, store); err != nil {
		t.Fatalf("bootstrap() = %v", err)
	}
	s, _, err := store.Get(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got := bitsOf(t, cidr, s); !slices.Equal(got, want) {
		t.Errorf("bits = %v (%d), want %v (%d)", got, len(got), want, len(want))
	}
}

func TestBootstrapLeavesExistingBitmapAlone(t *testing.T) {
	cidr := netip.MustParsePrefix("10.96.0.0/24")
	client := fake.NewSimpleClientset(ipAddressObject("10.96.0.7")) //nolint:staticcheck // NewClientset needs apply configurations we do not use
	store := bitmap.NewMemStore()
	empty, _ := bitmap.New(cidr)
	rev := store.Put(snapshotOf(empty))
	if err := bootstrap(context.Background(), client, cidr, store); err != nil {
		t.Fatalf("bootstrap() = %v", err)
	}
	if _, got, _ := store.Get(context.Background()); got != rev {
		t.Errorf("stored revision = %d, want %d (untouched)", got, rev)
	}
}

func TestBootstrapLosingTheCreateUsesTheWinners(t *testing.T) {
	cidr := netip.MustParsePrefix("10.96.0.0/24")
	client := fake.NewSimpleClientset(ipAddressObject("10.96.0.7")) //nolint:staticcheck // NewClientset needs apply configurations we do not use
	store := bitmap.NewMemStore()
	winner, _ := bitmap.New(cidr)
	_ = winner.Allocate(context.Background(), netip.MustParseAddr("10.96.0.7"), testOwner)
	var winnerRev int64
	store.OnUpdate(func(_ context.Context, rev int64, _ bitmap.Snapshot) error {
		if rev == 0 && winnerRev == 0 {
			winnerRev = store.Put(snapshotOf(winner)) // another process creates it first
		}
		return nil
	})
	if err := bootstrap(context.Background(), client, cidr, store); err != nil {
		t.Fatalf("bootstrap() = %v", err)
	}
	if _, got, _ := store.Get(context.Background()); got != winnerRev {
		t.Errorf("stored revision = %d, want the winner's %d", got, winnerRev)
	}
}
