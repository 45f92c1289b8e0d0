package clusterip

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/bitmaptest"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

// testCatchUp paces the bootstrap's catch-up in these tests: the objects they create late land
// well within settle.
var testCatchUp = catchUpTiming{settle: 400 * time.Millisecond, interval: 50 * time.Millisecond, max: 10 * time.Second}

func TestBootstrapFreshClusterCreatesEmptyBitmap(t *testing.T) {
	client := fake.NewSimpleClientset() //nolint:staticcheck // NewClientset needs apply configurations we do not use
	store := bitmaptest.NewMemStore()
	cidr := netip.MustParsePrefix("10.96.0.0/24")
	if err := bootstrapWith(context.Background(), client, cidr, store, testCatchUp); err != nil {
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
		objs = append(objs, testenv.IPAddress(s, "default", "peer"))
		if ip, err := netip.ParseAddr(s); err == nil && (ip == netip.MustParseAddr("fd00::1") || ip == netip.MustParseAddr("fd00::a") || ip == netip.MustParseAddr("fd00::ffff")) {
			want = append(want, ip)
		}
	}
	for i := range 200 {
		ip := netip.MustParseAddr("fd00::1000").Next()
		for range i {
			ip = ip.Next()
		}
		objs = append(objs, testenv.IPAddress(ip.String(), "default", "peer"))
		want = append(want, ip)
	}
	client := fake.NewSimpleClientset(objs...) //nolint:staticcheck // NewClientset needs apply configurations we do not use
	// A peer that writes no bits creates one more object right after the first List.
	late := netip.MustParseAddr("fd00::beef")
	lists := 0
	client.PrependReactor("list", "ipaddresses", func(k8stesting.Action) (bool, runtime.Object, error) {
		lists++
		if lists == 2 { // the List of the catch-up: the object was created after the first one
			if err := client.Tracker().Create(networkingv1.SchemeGroupVersion.WithResource("ipaddresses"), testenv.IPAddress(late.String(), "default", "peer"), "", metav1.CreateOptions{}); err != nil {
				t.Errorf("create the late IPAddress: %v", err)
			}
		}
		return false, nil, nil
	})
	want = append(want, late)
	slices.SortFunc(want, netip.Addr.Compare)

	store := bitmaptest.NewMemStore()
	if err := bootstrapWith(context.Background(), client, cidr, store, testCatchUp); err != nil {
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
	client := fake.NewSimpleClientset(testenv.IPAddress("10.96.0.7", "default", "peer")) //nolint:staticcheck // NewClientset needs apply configurations we do not use
	store := bitmaptest.NewMemStore()
	empty, _ := bitmap.New(cidr)
	rev := store.Put(empty.Snapshot())
	if err := bootstrapWith(context.Background(), client, cidr, store, testCatchUp); err != nil {
		t.Fatalf("bootstrap() = %v", err)
	}
	if _, got, _ := store.Get(context.Background()); got != rev {
		t.Errorf("stored revision = %d, want %d (untouched)", got, rev)
	}
}

func TestBootstrapLosingTheCreateUsesTheWinners(t *testing.T) {
	cidr := netip.MustParsePrefix("10.96.0.0/24")
	client := fake.NewSimpleClientset(testenv.IPAddress("10.96.0.7", "default", "peer")) //nolint:staticcheck // NewClientset needs apply configurations we do not use
	store := bitmaptest.NewMemStore()
	winner, _ := bitmap.New(cidr)
	_ = winner.Allocate(context.Background(), netip.MustParseAddr("10.96.0.7"), testOwner)
	var winnerRev int64
	store.OnUpdate(func(_ context.Context, rev int64, _ bitmap.Snapshot) error {
		if rev == 0 && winnerRev == 0 {
			winnerRev = store.Put(winner.Snapshot()) // another process creates it first
		}
		return nil
	})
	if err := bootstrapWith(context.Background(), client, cidr, store, testCatchUp); err != nil {
		t.Fatalf("bootstrap() = %v", err)
	}
	if _, got, _ := store.Get(context.Background()); got != winnerRev {
		t.Errorf("stored revision = %d, want the winner's %d", got, winnerRev)
	}
}

// A kube-apiserver v1.33 in dual write allocates without a bit while the bitmap key is missing
// (its bitmap write fails and it falls back to the IPAddress allocators): an allocation that found
// the key missing can create its IPAddress object after the bitmap was created and after the first
// catch-up List. The bootstrap keeps catching up until such objects have had time to land.
func TestBootstrapCatchesUpWithAllocationsThatFoundTheKeyMissing(t *testing.T) {
	cidr := netip.MustParsePrefix("10.96.0.0/24")
	client := fake.NewSimpleClientset(testenv.IPAddress("10.96.0.1", "default", "peer")) //nolint:staticcheck // NewClientset needs apply configurations we do not use
	store := bitmaptest.NewMemStore()
	late := []netip.Addr{netip.MustParseAddr("10.96.0.77"), netip.MustParseAddr("10.96.0.78")}
	landed := make(chan struct{})
	var once sync.Once
	store.OnUpdated(func(context.Context, int64) error {
		once.Do(func() {
			go func() { // in flight when the bitmap was created; the objects land a little later
				defer close(landed)
				for _, ip := range late {
					time.Sleep(150 * time.Millisecond)
					if err := client.Tracker().Create(networkingv1.SchemeGroupVersion.WithResource("ipaddresses"), testenv.IPAddress(ip.String(), "default", "peer"), ""); err != nil {
						t.Errorf("create the late IPAddress %s: %v", ip, err)
					}
				}
			}()
		})
		return nil
	})
	if err := bootstrapWith(context.Background(), client, cidr, store, testCatchUp); err != nil {
		t.Fatalf("bootstrap() = %v", err)
	}
	<-landed
	s, _, err := store.Get(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := append([]netip.Addr{netip.MustParseAddr("10.96.0.1")}, late...)
	if got := bitsOf(t, cidr, s); !slices.Equal(got, want) {
		t.Errorf("bits = %v, want %v: an IPAddress object created without its bit while the key was missing", got, want)
	}
}

// Another process created the bitmap first, empty (kube-apiserver v1.33 does so at start-up when the
// key is missing): the bootstrap that lost the create still sets the bits of the IPAddress objects.
func TestBootstrapLosingTheCreateToAnEmptyBitmapCatchesUp(t *testing.T) {
	cidr := netip.MustParsePrefix("10.96.0.0/24")
	client := fake.NewSimpleClientset(testenv.IPAddress("10.96.0.7", "default", "peer"), testenv.IPAddress("10.96.0.8", "default", "peer")) //nolint:staticcheck // NewClientset needs apply configurations we do not use
	store := bitmaptest.NewMemStore()
	empty, _ := bitmap.New(cidr)
	var once sync.Once
	store.OnUpdate(func(_ context.Context, rev int64, _ bitmap.Snapshot) error {
		if rev == 0 {
			once.Do(func() { store.Put(empty.Snapshot()) }) // a kube-apiserver starting up creates it empty
		}
		return nil
	})
	if err := bootstrapWith(context.Background(), client, cidr, store, testCatchUp); err != nil {
		t.Fatalf("bootstrap() = %v", err)
	}
	s, _, err := store.Get(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Addr{netip.MustParseAddr("10.96.0.7"), netip.MustParseAddr("10.96.0.8")}
	if got := bitsOf(t, cidr, s); !slices.Equal(got, want) {
		t.Errorf("bits = %v, want %v", got, want)
	}
}

// kube-apiserver v1.33 releases an address by clearing its bit and then deleting its IPAddress
// object: an object seen once without its bit may be on its way out, and the catch-up does not
// give it a bit (which would be a stale one) unless the next List shows it still there.
func TestBootstrapLeavesObjectsBeingReleasedWithoutBit(t *testing.T) {
	cidr := netip.MustParsePrefix("10.96.0.0/24")
	releasing := netip.MustParseAddr("10.96.0.9")
	client := fake.NewSimpleClientset(testenv.IPAddress("10.96.0.1", "default", "peer"), testenv.IPAddress(releasing.String(), "default", "peer")) //nolint:staticcheck // NewClientset needs apply configurations we do not use
	store := bitmaptest.NewMemStore()
	deleted := make(chan struct{})
	var once sync.Once
	store.OnUpdated(func(context.Context, int64) error {
		once.Do(func() {
			go func() { // the release: bit cleared at once, object deleted a little later
				defer close(deleted)
				s, _, _ := store.Get(context.Background())
				a, _ := bitmap.New(cidr)
				_ = a.Restore(s)
				_ = a.Release(context.Background(), releasing)
				store.Put(a.Snapshot())
				time.Sleep(20 * time.Millisecond)
				if err := client.Tracker().Delete(networkingv1.SchemeGroupVersion.WithResource("ipaddresses"), "", releasing.String()); err != nil {
					t.Errorf("delete the released IPAddress: %v", err)
				}
			}()
		})
		return nil
	})
	if err := bootstrapWith(context.Background(), client, cidr, store, testCatchUp); err != nil {
		t.Fatalf("bootstrap() = %v", err)
	}
	<-deleted
	s, _, err := store.Get(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got, want := bitsOf(t, cidr, s), []netip.Addr{netip.MustParseAddr("10.96.0.1")}; !slices.Equal(got, want) {
		t.Errorf("bits = %v, want %v: the released address got a stale bit", got, want)
	}
}
