package clusterip

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/bitmaptest"
	"github.com/kube-ipam/clusterip/featuregate"
)

// memStores keeps the bitmap of each range in a bitmaptest.MemStore: Config.Bitmaps is any
// bitmap.Stores, not only etcd's.
type memStores []*bitmaptest.MemStore

func (s memStores) Store(i int) bitmap.Store { return s[i] }

func TestNewKeepsEachRangesBitmapInItsStore(t *testing.T) {
	ctx := context.Background()
	v4, v6 := netip.MustParsePrefix("10.96.0.0/24"), netip.MustParsePrefix("fd00::/120")
	stores := memStores{bitmaptest.NewMemStore(), bitmaptest.NewMemStore()}
	a, err := New(ctx, Config{Mode: featuregate.Legacy, Ranges: []netip.Prefix{v6, v4}, Bitmaps: stores})
	if err != nil {
		t.Fatalf("New() = %v", err)
	}
	defer a.Close()
	ip := netip.MustParseAddr("10.96.0.5")
	if err := a.For(corev1.IPv4Protocol).Allocate(ctx, ip, testOwner); err != nil {
		t.Fatalf("Allocate(%s) = %v", ip, err)
	}
	primary, _, _ := stores[0].Get(ctx)
	secondary, _, _ := stores[1].Get(ctx)
	if primary.Range != v6.String() || len(bitsOf(t, v6, primary)) != 0 {
		t.Errorf("Store(0) holds %q with bits %v, want the primary range %s, empty", primary.Range, bitsOf(t, v6, primary), v6)
	}
	if got := bitsOf(t, v4, secondary); secondary.Range != v4.String() || !slices.Equal(got, []netip.Addr{ip}) {
		t.Errorf("Store(1) holds %q with bits %v, want the secondary range %s with %s", secondary.Range, got, v4, ip)
	}

	// A store without a Key is named by its type in errors.
	other := memStores{bitmaptest.NewMemStore()}
	other[0].Put(bitmap.Snapshot{Range: "10.96.0.0/24", Data: []byte("not a bitmap of a /24, far too long to be one")})
	_, err = New(ctx, Config{Mode: featuregate.Legacy, Ranges: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/24")}, Bitmaps: other})
	if err == nil || !strings.Contains(err.Error(), "at a *bitmaptest.MemStore") {
		t.Errorf("New() over a bitmap that does not restore = %v, want an error naming the store by its type", err)
	}
}
