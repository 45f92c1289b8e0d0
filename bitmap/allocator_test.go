package bitmap_test

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
)

func TestNewSizesAndBands(t *testing.T) {
	tests := []struct {
		cidr       string
		size, band uint64
	}{
		{"10.0.0.0/30", 2, 0},
		{"10.0.0.0/28", 14, 0},
		{"10.0.0.0/27", 30, 16},
		{"10.96.0.0/24", 254, 16},
		{"10.0.0.0/22", 1022, 64},
		{"10.0.0.0/20", 4094, 256},
		{"10.0.0.0/15", 131070, 256},
		{"10.96.0.0/12", 1048574, 256},
		{"fd00::/127", 1, 0},
		{"fd00::/124", 15, 0},
		{"fd00::/122", 63, 16},
		{"fd00::/118", 1023, 64},
		{"fd00::/112", 65535, 256},
		{"fd00::/108", 65535, 256}, // capped, as kube-apiserver
		{"fd00::/64", 65535, 256},
	}
	for _, tt := range tests {
		a, err := bitmap.New(netip.MustParsePrefix(tt.cidr))
		if err != nil {
			t.Fatalf("New(%s) = %v", tt.cidr, err)
		}
		if a.Size() != tt.size || a.StaticBand() != tt.band || a.Free() != tt.size {
			t.Errorf("New(%s): Size() = %d, StaticBand() = %d, Free() = %d; want %d, %d, %d",
				tt.cidr, a.Size(), a.StaticBand(), a.Free(), tt.size, tt.band, tt.size)
		}
	}
}

func TestNewRejectsBadRanges(t *testing.T) {
	tests := []struct {
		name string
		cidr netip.Prefix
	}{
		{"zero", netip.Prefix{}},
		{"IPv4 /32", netip.MustParsePrefix("10.0.0.1/32")},
		{"IPv4 /31", netip.MustParsePrefix("10.0.0.0/31")},
		{"IPv6 /128", netip.MustParsePrefix("fd00::1/128")},
		{"IPv4-mapped", netip.MustParsePrefix("::ffff:10.0.0.0/120")},
		{"host bits set", netip.MustParsePrefix("10.0.0.1/24")},
		{"IPv4 wider than /8", netip.MustParsePrefix("10.0.0.0/7")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := bitmap.New(tt.cidr)
			var pe *allocator.PrefixError
			if !errors.As(err, &pe) || !errors.Is(err, allocator.ErrInvalid) || a != nil {
				t.Errorf("New(%v) = %v, %v; want nil, a *PrefixError", tt.cidr, a, err)
			}
		})
	}
}

func TestIPv6CapIsOutOfRange(t *testing.T) {
	a, err := bitmap.New(netip.MustParsePrefix("fd00::/108"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	last := netip.MustParseAddr("fd00::ffff") // offset 65534, the last slot
	if err := a.Allocate(ctx, last, allocator.Owner{}); err != nil {
		t.Errorf("Allocate(%v) = %v, want nil", last, err)
	}
	beyond := netip.MustParseAddr("fd00::1:0") // inside the /108, beyond the 65535 slots
	var nir *allocator.NotInRangeError
	if err := a.Allocate(ctx, beyond, allocator.Owner{}); !errors.As(err, &nir) {
		t.Errorf("Allocate(%v) = %v, want a *NotInRangeError", beyond, err)
	}
}

func TestAllocateNextStartsAtRandomNotSequentially(t *testing.T) {
	a, err := bitmap.New(netip.MustParsePrefix("10.96.0.0/24"), bitmap.WithSeed(1))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	distinctStarts := map[netip.Addr]bool{}
	for range 20 {
		ip, err := a.AllocateNext(ctx, allocator.Owner{})
		if err != nil {
			t.Fatal(err)
		}
		distinctStarts[ip] = true
		// Releasing and allocating again must not hand back the same address every time.
		if err := a.Release(ctx, ip); err != nil {
			t.Fatal(err)
		}
	}
	if len(distinctStarts) < 10 {
		t.Errorf("20 AllocateNext/Release rounds gave only %d distinct addresses; want a random start each time", len(distinctStarts))
	}
}

func TestWithSeedIsDeterministic(t *testing.T) {
	seq := func() []netip.Addr {
		a, _ := bitmap.New(netip.MustParsePrefix("10.96.0.0/20"), bitmap.WithSeed(42))
		var out []netip.Addr
		for range 50 {
			ip, _ := a.AllocateNext(context.Background(), allocator.Owner{})
			out = append(out, ip)
		}
		return out
	}
	a, b := seq(), seq()
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("two allocators with WithSeed(42) diverge at #%d: %v vs %v", i, a[i], b[i])
		}
	}
}

func TestAllocateNextUsesStaticBandOnlyWhenUpperIsFull(t *testing.T) {
	cidr := netip.MustParsePrefix("10.96.0.0/24")
	a, _ := bitmap.New(cidr)
	ctx := context.Background()
	static := netip.MustParseAddr("10.96.0.10") // offset 9, static band
	if err := a.Allocate(ctx, static, allocator.Owner{}); err != nil {
		t.Fatalf("Allocate(%v) in the static band = %v", static, err)
	}
	for i := range 254 - 16 {
		ip, err := a.AllocateNext(ctx, allocator.Owner{})
		if err != nil {
			t.Fatal(err)
		}
		if ip.As4()[3] <= 16 {
			t.Fatalf("AllocateNext() #%d = %v in the static band while the upper band has room", i, ip)
		}
	}
	for i := range 15 {
		ip, err := a.AllocateNext(ctx, allocator.Owner{})
		if err != nil {
			t.Fatal(err)
		}
		if ip.As4()[3] > 16 || ip == static {
			t.Fatalf("AllocateNext() #%d after the upper band filled = %v, want a free static address", i, ip)
		}
	}
	if _, err := a.AllocateNext(ctx, allocator.Owner{}); !errors.Is(err, allocator.ErrFull) {
		t.Errorf("AllocateNext() = %v, want ErrFull", err)
	}
}

func TestCloneIsIndependent(t *testing.T) {
	a, _ := bitmap.New(netip.MustParsePrefix("10.96.0.0/28"))
	ctx := context.Background()
	ip := netip.MustParseAddr("10.96.0.3")
	_ = a.Allocate(ctx, ip, allocator.Owner{})
	c := a.Clone()
	_ = c.Release(ctx, ip)
	_, _ = c.AllocateNext(ctx, allocator.Owner{})
	if !a.Has(ip) || a.Used() != 1 {
		t.Errorf("changing a clone changed the original")
	}
}
