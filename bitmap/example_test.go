package bitmap_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
)

func ExampleNew() {
	a, err := bitmap.New(netip.MustParsePrefix("10.96.0.0/24"))
	if err != nil {
		panic(err)
	}
	fmt.Println(a.Size(), "addresses, static band of", a.StaticBand())
	// Output: 254 addresses, static band of 16
}

func ExampleAllocator_AllocateNext() {
	ctx := context.Background()
	a, _ := bitmap.New(netip.MustParsePrefix("10.96.0.0/28")) // too small for a static band
	for {
		_, err := a.AllocateNext(ctx, allocator.Owner{})
		if errors.Is(err, allocator.ErrFull) {
			break
		}
	}
	fmt.Println(a.Used(), "used,", a.Free(), "free")
	_ = a.Release(ctx, netip.MustParseAddr("10.96.0.1"))
	ip, _ := a.AllocateNext(ctx, allocator.Owner{})
	fmt.Println(ip)
	// Output:
	// 14 used, 0 free
	// 10.96.0.1
}

func ExampleAllocator_Allocate() {
	ctx := context.Background()
	a, _ := bitmap.New(netip.MustParsePrefix("10.96.0.0/24"))
	fmt.Println(a.Allocate(ctx, netip.MustParseAddr("10.96.0.10"), allocator.Owner{}))
	fmt.Println(a.Allocate(ctx, netip.MustParseAddr("10.96.0.10"), allocator.Owner{}))
	fmt.Println(a.Allocate(ctx, netip.MustParseAddr("10.96.0.255"), allocator.Owner{}))
	// Output:
	// <nil>
	// allocator: address already allocated
	// allocator: 10.96.0.255 is not in the allocatable range 10.96.0.0/24
}

func ExampleAllocator_Snapshot() {
	ctx := context.Background()
	a, _ := bitmap.New(netip.MustParsePrefix("10.96.0.0/24"))
	_ = a.Allocate(ctx, netip.MustParseAddr("10.96.0.1"), allocator.Owner{})  // offset 0
	_ = a.Allocate(ctx, netip.MustParseAddr("10.96.0.10"), allocator.Owner{}) // offset 9
	s := a.Snapshot()
	fmt.Printf("%s %x\n", s.Range, s.Data)

	b, _ := bitmap.New(netip.MustParsePrefix("10.96.0.0/24"))
	_ = b.Restore(s)
	fmt.Println(b.Used(), b.Has(netip.MustParseAddr("10.96.0.10")))
	// Output:
	// 10.96.0.0/24 0201
	// 2 true
}
