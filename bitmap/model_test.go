package bitmap_test

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/internal/ipmath"
)

// modelRanges are the ranges the model test and fuzz target drive; the first byte of the input
// picks one.
var modelRanges = []netip.Prefix{
	netip.MustParsePrefix("10.96.0.0/28"),
	netip.MustParsePrefix("10.96.0.0/27"),
	netip.MustParsePrefix("10.96.0.0/24"),
	netip.MustParsePrefix("10.96.0.0/30"),
	netip.MustParsePrefix("fd00::/124"),
	netip.MustParsePrefix("fd00::/122"),
	netip.MustParsePrefix("fd00::/127"),
	netip.MustParsePrefix("fd00::/112"),
}

// runModel applies the operations encoded in ops to a bitmap and to a map, and fails t when the
// bitmap's answer differs from what the map says it must be. Each operation is two bytes: the
// kind, and an offset relative to the network address (so network, broadcast and outside
// addresses come up too).
func runModel(t *testing.T, ops []byte) {
	if len(ops) == 0 {
		return
	}
	cidr := modelRanges[int(ops[0])%len(modelRanges)]
	ops = ops[1:]
	a, err := bitmap.New(cidr, bitmap.WithSeed(uint64(len(ops))))
	if err != nil {
		t.Fatal(err)
	}
	size := min(ipmath.Size(cidr), bitmap.MaxIPv6Slots)
	band := ipmath.BandOffset(cidr)
	model := map[netip.Addr]bool{}
	ctx := context.Background()
	net := ipmath.FromAddr(ipmath.Network(cidr))
	for len(ops) >= 2 {
		kind, n := ops[0]%5, uint64(ops[1])
		ops = ops[2:]
		ip := net.Add64(n).Addr(cidr.Addr().Is4()) // may be the network, broadcast or outside
		off, usable := ipmath.Offset(cidr, ip)
		usable = usable && off < size
		switch kind {
		case 0, 1: // AllocateNext, twice as often
			got, err := a.AllocateNext(ctx, allocator.Owner{})
			if uint64(len(model)) == size {
				if !errors.Is(err, allocator.ErrFull) {
					t.Fatalf("AllocateNext() on a full model = %v, %v; want ErrFull", got, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("AllocateNext() = %v with %d of %d used", err, len(model), size)
			}
			goff, ok := ipmath.Offset(cidr, got)
			if !ok || goff >= size || model[got] {
				t.Fatalf("AllocateNext() = %v: unusable or already allocated", got)
			}
			if goff < band && upperFree(model, cidr, band, size) {
				t.Fatalf("AllocateNext() = %v from the static band while the upper band has room", got)
			}
			model[got] = true
		case 2: // Allocate
			err := a.Allocate(ctx, ip, allocator.Owner{})
			var nir *allocator.NotInRangeError
			switch {
			case !usable:
				if !errors.As(err, &nir) {
					t.Fatalf("Allocate(%v) = %v, want NotInRangeError", ip, err)
				}
			case model[ip]:
				if !errors.Is(err, allocator.ErrAllocated) {
					t.Fatalf("Allocate(%v) = %v, want ErrAllocated", ip, err)
				}
			default:
				if err != nil {
					t.Fatalf("Allocate(%v) = %v, want nil", ip, err)
				}
				model[ip] = true
			}
		case 3: // Release
			if err := a.Release(ctx, ip); err != nil {
				t.Fatalf("Release(%v) = %v", ip, err)
			}
			delete(model, ip)
		case 4: // Snapshot and Restore into a fresh allocator, then carry on with it.
			s := a.Snapshot()
			b, _ := bitmap.New(cidr, bitmap.WithSeed(n))
			if err := b.Restore(s); err != nil {
				t.Fatalf("Restore(Snapshot()) = %v", err)
			}
			a = b
		}
		if a.Has(ip) != model[ip] {
			t.Fatalf("Has(%v) = %v, want %v", ip, a.Has(ip), model[ip])
		}
		if a.Used() != uint64(len(model)) || a.Free() != size-uint64(len(model)) {
			t.Fatalf("Used(), Free() = %d, %d; want %d, %d", a.Used(), a.Free(), len(model), size-uint64(len(model)))
		}
	}
	n := 0
	for ip := range a.All() {
		if !model[ip] {
			t.Fatalf("All() yields %v, which the model does not hold", ip)
		}
		n++
	}
	if n != len(model) {
		t.Fatalf("All() yields %d addresses, want %d", n, len(model))
	}
}

func upperFree(model map[netip.Addr]bool, cidr netip.Prefix, band, size uint64) bool {
	for off := band; off < size; off++ {
		ip, _ := ipmath.AddrAt(cidr, off)
		if !model[ip] {
			return true
		}
	}
	return false
}

func TestBitmapMatchesMapModel(t *testing.T) {
	for seed := range 64 {
		ops := make([]byte, 1+2*600)
		x := uint32(seed*2654435761 + 1)
		for i := range ops {
			x ^= x << 13
			x ^= x >> 17
			x ^= x << 5
			ops[i] = byte(x)
		}
		ops[0] = byte(seed)
		runModel(t, ops)
	}
}

func FuzzBitmapMatchesMapModel(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 0, 2, 1, 2, 1, 3, 1, 4, 0, 0, 0})
	f.Add([]byte{3, 2, 0, 2, 1, 2, 2, 2, 3, 0, 0})
	f.Add([]byte{6, 0, 0, 0, 0, 2, 0, 2, 1, 3, 1})
	f.Fuzz(runModel)
}

// FuzzRestore feeds arbitrary snapshots to Restore: it must never panic, must answer with
// ErrCorrupt or ErrMismatchedNetwork or nil, and what it accepts must encode back to the same
// bytes (less leading zeros).
func FuzzRestore(f *testing.F) {
	f.Add("10.96.0.0/24", []byte{0x01})
	f.Add("10.96.0.0/24", []byte{0x40, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add("10.97.0.0/24", []byte{})
	f.Add("garbage", []byte{0, 0, 1})
	f.Fuzz(func(t *testing.T, spec string, data []byte) {
		a, _ := bitmap.New(netip.MustParsePrefix("10.96.0.0/24"))
		err := a.Restore(bitmap.Snapshot{Range: spec, Data: data})
		if err != nil {
			if !errors.Is(err, bitmap.ErrCorrupt) && !errors.Is(err, allocator.ErrMismatchedNetwork) {
				t.Fatalf("Restore(%q, %x) = %v, want ErrCorrupt or ErrMismatchedNetwork", spec, data, err)
			}
			if a.Used() != 0 {
				t.Fatalf("a failed Restore changed the allocator")
			}
			return
		}
		for len(data) > 0 && data[0] == 0 {
			data = data[1:]
		}
		if got := a.Snapshot().Data; string(got) != string(data) {
			t.Fatalf("Snapshot() after Restore(%x) = %x", data, got)
		}
	})
}
