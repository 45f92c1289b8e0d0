package bitmap_test

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"testing"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/bitmaptest"
)

// skipper is an allocator whose AllocateNext can pass over addresses: both bitmap allocators.
type skipper interface {
	allocator.Interface
	AllocateNextSkipping(ctx context.Context, skip func(netip.Addr) bool) (netip.Addr, error)
}

func TestAllocateNextSkipping(t *testing.T) {
	ctx := context.Background()
	none := func(netip.Addr) bool { return false }
	tests := []struct {
		name    string
		cidr    string
		held    []string
		skip    func(netip.Addr) bool
		want    func(netip.Addr) bool // nil: want ErrFull
		wantDoc string
	}{
		{
			name: "nil skip allocates as AllocateNext", cidr: "10.0.0.0/29", held: []string{"10.0.0.1"},
			want: func(ip netip.Addr) bool { return ip != netip.MustParseAddr("10.0.0.1") }, wantDoc: "any free address",
		},
		{
			name: "a skip that refuses none", cidr: "10.0.0.0/29", skip: none,
			want: func(netip.Addr) bool { return true }, wantDoc: "any address",
		},
		{
			name: "every free address refused", cidr: "10.0.0.0/29", held: []string{"10.0.0.1", "10.0.0.2"},
			skip: func(netip.Addr) bool { return true },
		},
		{
			name: "all but one refused", cidr: "10.0.0.0/29", held: []string{"10.0.0.1"},
			skip: func(ip netip.Addr) bool { return ip != netip.MustParseAddr("10.0.0.4") },
			want: func(ip netip.Addr) bool { return ip == netip.MustParseAddr("10.0.0.4") }, wantDoc: "10.0.0.4",
		},
		{
			name: "the dynamic band refused: the static band serves", cidr: "10.0.0.0/24",
			skip: func(ip netip.Addr) bool { return ip.As4()[3] > 16 },
			want: func(ip netip.Addr) bool { return ip.As4()[3] >= 1 && ip.As4()[3] <= 16 }, wantDoc: "one of 10.0.0.1-16",
		},
		{
			name: "the static band refused: the dynamic band serves first anyway", cidr: "10.0.0.0/24",
			skip: func(ip netip.Addr) bool { return ip.As4()[3] <= 16 },
			want: func(ip netip.Addr) bool { return ip.As4()[3] > 16 }, wantDoc: "one of 10.0.0.17-254",
		},
		{
			name: "a full range", cidr: "10.0.0.0/30", held: []string{"10.0.0.1", "10.0.0.2"}, skip: none,
		},
	}
	impls := []struct {
		name string
		make func(t *testing.T, cidr netip.Prefix, held []netip.Addr) (skipper, func() int)
	}{
		{"Allocator", func(t *testing.T, cidr netip.Prefix, held []netip.Addr) (skipper, func() int) {
			a, err := bitmap.New(cidr)
			if err != nil {
				t.Fatal(err)
			}
			for _, ip := range held {
				if err := a.Allocate(ctx, ip, allocator.Owner{}); err != nil {
					t.Fatal(err)
				}
			}
			return a, func() int { return 0 }
		}},
		{"Persistent", func(t *testing.T, cidr netip.Prefix, held []netip.Addr) (skipper, func() int) {
			store := bitmaptest.NewMemStore()
			var ips []string
			for _, ip := range held {
				ips = append(ips, ip.String())
			}
			store.Put(snapshotOf(t, cidr.String(), ips...))
			p, err := bitmap.NewPersistent(ctx, cidr, store)
			if err != nil {
				t.Fatal(err)
			}
			return p, func() int { return store.Stats().Updates }
		}},
	}
	for _, impl := range impls {
		for _, tt := range tests {
			t.Run(impl.name+"/"+tt.name, func(t *testing.T) {
				cidr := netip.MustParsePrefix(tt.cidr)
				var held []netip.Addr
				for _, s := range tt.held {
					held = append(held, netip.MustParseAddr(s))
				}
				a, updates := impl.make(t, cidr, held)
				for range 20 {
					before, writes := slices.Collect(a.All()), updates()
					asked := map[netip.Addr]int{}
					skip := tt.skip
					if skip != nil {
						skip = func(ip netip.Addr) bool {
							if slices.Contains(before, ip) {
								t.Errorf("skip(%v) called for an allocated address", ip)
							}
							asked[ip]++
							return tt.skip(ip)
						}
					}
					ip, err := a.AllocateNextSkipping(ctx, skip)
					if tt.want == nil {
						if !errors.Is(err, allocator.ErrFull) || ip.IsValid() {
							t.Fatalf("AllocateNextSkipping() = %v, %v; want the zero Addr and ErrFull", ip, err)
						}
						if got := slices.Collect(a.All()); !slices.Equal(got, before) {
							t.Errorf("after ErrFull: allocated %v, want %v (unchanged)", got, before)
						}
						if got := updates(); got != writes {
							t.Errorf("after ErrFull: %d store writes, want none", got-writes)
						}
						return
					}
					if err != nil || !tt.want(ip) {
						t.Fatalf("AllocateNextSkipping() = %v, %v; want %s", ip, err, tt.wantDoc)
					}
					if slices.Contains(before, ip) || !a.Has(ip) {
						t.Fatalf("AllocateNextSkipping() = %v: it was allocated before (%v) or is not now", ip, before)
					}
					if got, want := a.Used(), uint64(len(before)+1); got != want {
						t.Errorf("Used() = %d, want %d: only the address returned is taken", got, want)
					}
					for ip, n := range asked {
						if n > 1 && impl.name == "Allocator" {
							t.Errorf("skip(%v) called %d times, want once", ip, n)
						}
					}
					if err := a.Release(ctx, ip); err != nil {
						t.Fatal(err)
					}
				}
			})
		}
	}
}

// TestPersistentAllocateNextSkippingDecidesOnTheStoredState checks that the refusals apply to
// the state the compare-and-swap succeeds on: when another allocator has taken the only address
// skip lets through, AllocateNextSkipping answers ErrFull after reading the store again, and
// stores nothing.
func TestPersistentAllocateNextSkippingDecidesOnTheStoredState(t *testing.T) {
	ctx := context.Background()
	cidr := netip.MustParsePrefix("10.0.0.0/29")
	store := bitmaptest.NewMemStore()
	p, err := bitmap.NewPersistent(ctx, cidr, store)
	if err != nil {
		t.Fatal(err)
	}
	other, err := bitmap.NewPersistent(ctx, cidr, store)
	if err != nil {
		t.Fatal(err)
	}
	only := netip.MustParseAddr("10.0.0.3")
	if err := other.Allocate(ctx, only, allocator.Owner{}); err != nil {
		t.Fatal(err)
	}
	before := store.Stats()
	ip, err := p.AllocateNextSkipping(ctx, func(ip netip.Addr) bool { return ip != only })
	if !errors.Is(err, allocator.ErrFull) {
		t.Fatalf("AllocateNextSkipping() = %v, %v; want ErrFull: %v is taken and the rest refused", ip, err, only)
	}
	// The first attempt, on p's stale state, takes 10.0.0.3 and loses the compare-and-swap; the
	// second, on the state that won, finds nothing to take.
	after := store.Stats()
	if got, want := after.Updates-after.Conflicts, before.Updates-before.Conflicts; got != want {
		t.Errorf("store writes stored = %d, want 0", got-want)
	}
	if got := bitsOf(t, store); !slices.Equal(got, []netip.Addr{only}) {
		t.Errorf("stored bits = %v, want [%v]", got, only)
	}
	if !p.Has(only) {
		t.Errorf("Has(%v) = false after the store was read again, want true", only)
	}
}

// bitsOf returns the addresses set in the bitmap of 10.0.0.0/29 stored in store.
func bitsOf(t *testing.T, store *bitmaptest.MemStore) []netip.Addr {
	t.Helper()
	a, _, err := bitmap.Load(context.Background(), store, netip.MustParsePrefix("10.0.0.0/29"))
	if err != nil {
		t.Fatal(err)
	}
	return slices.Collect(a.All())
}
