package bitmap_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/allocator/allocatortest"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/bitmaptest"
	"github.com/kube-ipam/clusterip/bitmap/internal/churntest"
)

func snapshotOf(t testing.TB, cidr string, ips ...string) bitmap.Snapshot {
	t.Helper()
	a, err := bitmap.New(netip.MustParsePrefix(cidr))
	if err != nil {
		t.Fatal(err)
	}
	for _, ip := range ips {
		if err := a.Allocate(context.Background(), netip.MustParseAddr(ip), allocator.Owner{}); err != nil {
			t.Fatal(err)
		}
	}
	return a.Snapshot()
}

func TestPersistentConformance(t *testing.T) {
	allocatortest.Run(t, func(t *testing.T, cidr netip.Prefix) allocator.Interface {
		return churntest.NewPersistent(t, cidr.String(), bitmaptest.NewMemStore())
	})
}

func TestPersistentConformanceWithoutBatching(t *testing.T) {
	allocatortest.Run(t, func(t *testing.T, cidr netip.Prefix) allocator.Interface {
		return churntest.NewPersistent(t, cidr.String(), bitmaptest.NewMemStore(), bitmap.WithoutBatching())
	})
}

func TestPersistentDryRunNeverWrites(t *testing.T) {
	ctx := context.Background()
	store := bitmaptest.NewMemStore()
	p := churntest.NewPersistent(t, "10.96.0.0/24", store)
	held := netip.MustParseAddr("10.96.0.10")
	if err := p.Allocate(ctx, held, allocator.Owner{}); err != nil {
		t.Fatal(err)
	}
	before := store.Stats()
	d := p.DryRun()
	if err := d.Allocate(ctx, held, allocator.Owner{}); !errors.Is(err, allocator.ErrAllocated) {
		t.Errorf("DryRun().Allocate(held) = %v, want ErrAllocated", err)
	}
	if err := d.Allocate(ctx, netip.MustParseAddr("10.96.0.11"), allocator.Owner{}); err != nil {
		t.Errorf("DryRun().Allocate(free) = %v", err)
	}
	if ip, err := d.AllocateNext(ctx, allocator.Owner{}); err != nil || p.Has(ip) {
		t.Errorf("DryRun().AllocateNext() = %v, %v; want a free address", ip, err)
	}
	if err := d.Release(ctx, held); err != nil || !p.Has(held) {
		t.Errorf("DryRun().Release() = %v, Has = %v; want nil, still held", err, p.Has(held))
	}
	if got := store.Stats(); got != before {
		t.Errorf("store calls during DryRun: %+v → %+v, want none", before, got)
	}
}

func TestPersistentOutOfRangeNeverReachesStore(t *testing.T) {
	ctx := context.Background()
	store := bitmaptest.NewMemStore()
	p := churntest.NewPersistent(t, "10.96.0.0/24", store)
	before := store.Stats()
	var nir *allocator.NotInRangeError
	if err := p.Allocate(ctx, netip.MustParseAddr("10.97.0.1"), allocator.Owner{}); !errors.As(err, &nir) {
		t.Errorf("Allocate(outside) = %v, want *NotInRangeError", err)
	}
	if err := p.Allocate(ctx, netip.MustParseAddr("::ffff:10.96.0.1"), allocator.Owner{}); !errors.Is(err, allocator.ErrInvalid) {
		t.Errorf("Allocate(mapped) = %v, want ErrInvalid", err)
	}
	if err := p.Release(ctx, netip.MustParseAddr("10.97.0.1")); err != nil {
		t.Errorf("Release(outside) = %v, want nil", err)
	}
	if got := store.Stats(); got != before {
		t.Errorf("store calls: %+v → %+v, want none", before, got)
	}
}

func TestPersistentClose(t *testing.T) {
	store := bitmaptest.NewMemStore()
	p := churntest.NewPersistent(t, "10.96.0.0/24", store)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.AllocateNext(context.Background(), allocator.Owner{}); !errors.Is(err, allocator.ErrNotReady) {
		t.Errorf("AllocateNext() after Close = %v, want ErrNotReady", err)
	}
}

func ExampleNewPersistent() {
	ctx := context.Background()
	store := bitmaptest.NewMemStore() // or etcdstore.New(client, etcdstore.ServiceIPsKey(""))
	p, err := bitmap.NewPersistent(ctx, netip.MustParsePrefix("10.96.0.0/24"), store, bitmap.WithSeed(1))
	if err != nil {
		panic(err)
	}
	defer p.Close()

	if err := p.Allocate(ctx, netip.MustParseAddr("10.96.0.10"), allocator.Owner{}); err != nil {
		panic(err)
	}
	ip, err := p.AllocateNext(ctx, allocator.Owner{})
	if err != nil {
		panic(err)
	}
	fmt.Println(ip.IsValid(), p.Has(ip), p.Used(), p.Free())

	err = p.Allocate(ctx, netip.MustParseAddr("10.96.0.10"), allocator.Owner{})
	fmt.Println(errors.Is(err, allocator.ErrAllocated))

	s, _, _ := store.Get(ctx)
	fmt.Println(s.Range, len(s.Data) > 0)
	// Output:
	// true true 2 252
	// true
	// 10.96.0.0/24 true
}

// TestPersistentOnlyOptionsAreNotOptions checks that the options only NewPersistent reads are not
// Options, so that passing one to New does not compile, while every Option is a PersistentOption.
func TestPersistentOnlyOptionsAreNotOptions(t *testing.T) {
	persistentOnly := map[string]bitmap.PersistentOption{
		"WithMaxAttempts": bitmap.WithMaxAttempts(3),
		"WithBackoff":     bitmap.WithBackoff(time.Millisecond, time.Second),
		"WithMaxBatch":    bitmap.WithMaxBatch(8),
		"WithoutBatching": bitmap.WithoutBatching(),
	}
	for name, opt := range persistentOnly {
		if _, ok := opt.(bitmap.Option); ok {
			t.Errorf("%s() is a bitmap.Option, want a PersistentOption only", name)
		}
	}
	var _ bitmap.PersistentOption = bitmap.WithSeed(1) // compiles: every Option is a PersistentOption
}
