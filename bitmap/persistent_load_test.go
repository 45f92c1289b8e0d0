package bitmap_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/bitmaptest"
	"github.com/kube-ipam/clusterip/bitmap/internal/churntest"
)

func TestNewPersistentBootstrapsMissingSnapshot(t *testing.T) {
	store := bitmaptest.NewMemStore()
	p := churntest.NewPersistent(t, "10.96.0.0/24", store)
	s, rev, err := store.Get(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(bitmap.Snapshot{Range: "10.96.0.0/24"}, s); diff != "" || rev == 0 {
		t.Errorf("stored after bootstrap: rev %d, mismatch (-want +got):\n%s", rev, diff)
	}
	if p.Revision() != rev || p.Used() != 0 {
		t.Errorf("Revision() = %d, Used() = %d; want %d, 0", p.Revision(), p.Used(), rev)
	}
}

func TestNewPersistentAdoptsStoredSnapshot(t *testing.T) {
	store := bitmaptest.NewMemStore()
	rev := store.Put(snapshotOf(t, "10.96.0.0/24", "10.96.0.1", "10.96.0.200"))
	p := churntest.NewPersistent(t, "10.96.0.0/24", store)
	if got := slices.Collect(p.All()); !slices.Equal(got, []netip.Addr{netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("10.96.0.200")}) {
		t.Errorf("All() = %v, want the stored addresses", got)
	}
	if p.Revision() != rev {
		t.Errorf("Revision() = %d, want %d", p.Revision(), rev)
	}
	if st := store.Stats(); st.Updates != 0 {
		t.Errorf("store updates = %d, want 0: an existing snapshot is not rewritten", st.Updates)
	}
}

func TestNewPersistentUsesSnapshotCreatedConcurrently(t *testing.T) {
	store := bitmaptest.NewMemStore()
	// Another allocator creates the snapshot between our Get and our create-if-absent.
	store.OnUpdate(func(_ context.Context, rev int64, _ bitmap.Snapshot) error {
		store.OnUpdate(nil)
		store.Put(snapshotOf(t, "10.96.0.0/24", "10.96.0.7"))
		return nil
	})
	p := churntest.NewPersistent(t, "10.96.0.0/24", store)
	if !p.Has(netip.MustParseAddr("10.96.0.7")) || p.Used() != 1 {
		t.Errorf("Has(10.96.0.7) = %v, Used() = %d; want the other allocator's snapshot", p.Has(netip.MustParseAddr("10.96.0.7")), p.Used())
	}
}

func TestNewPersistentRefusesCorruptSnapshots(t *testing.T) {
	tests := []struct {
		name string
		snap bitmap.Snapshot
	}{
		{name: "bits beyond the range", snap: bitmap.Snapshot{Range: "10.96.0.0/24", Data: append([]byte{0xff}, make([]byte, 39)...)}},
		{name: "bad range", snap: bitmap.Snapshot{Range: "ten-ninety-six", Data: []byte{1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			store := bitmaptest.NewMemStore()
			rev := store.Put(tt.snap)
			_, err := bitmap.NewPersistent(context.Background(), netip.MustParsePrefix("10.96.0.0/24"), store)
			if !errors.Is(err, bitmap.ErrCorrupt) {
				t.Fatalf("NewPersistent() error = %v, want ErrCorrupt", err)
			}
			got, gotRev, _ := store.Get(context.Background())
			if diff := cmp.Diff(tt.snap, got); diff != "" || gotRev != rev {
				t.Errorf("store changed: rev %d → %d, (-want +got):\n%s", rev, gotRev, diff)
			}
		})
	}
}

// A stored bitmap of another range (kube-apiserver's --service-cluster-ip-range changed) does not
// stop start-up, as it does not stop kube-apiserver v1.33's: NewPersistent succeeds, and every
// operation fails, as kube-apiserver's do, with "the provided range does not match the current
// range" (a *RangeMismatchError matching allocator.ErrMismatchedNetwork) and leaves the store
// alone, until something rewrites the stored bitmap to the allocator's range (kube-apiserver's
// repair, or package repair, in Legacy mode). Then the allocator serves that bitmap.
func TestPersistentOverAnotherRangeFailsUntilRewritten(t *testing.T) {
	const cidr = "10.96.0.0/24"
	tests := []struct {
		name string
		snap bitmap.Snapshot
	}{
		{name: "another range", snap: snapshotOf(t, "10.0.0.0/24", "10.0.0.1")},
		{name: "a wider range", snap: snapshotOf(t, "10.96.0.0/16", "10.96.0.10")},
		{name: "another family", snap: snapshotOf(t, "fd00::/120", "fd00::1")},
	}
	ops := []struct {
		name string
		do   func(context.Context, *bitmap.Persistent) error
	}{
		{"Allocate", func(ctx context.Context, p *bitmap.Persistent) error {
			return p.Allocate(ctx, netip.MustParseAddr("10.96.0.10"), allocator.Owner{})
		}},
		{"AllocateNext", func(ctx context.Context, p *bitmap.Persistent) error {
			_, err := p.AllocateNext(ctx, allocator.Owner{})
			return err
		}},
		{"Release", func(ctx context.Context, p *bitmap.Persistent) error {
			return p.Release(ctx, netip.MustParseAddr("10.96.0.10"))
		}},
		{"Refresh", func(ctx context.Context, p *bitmap.Persistent) error { return p.Refresh(ctx) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			store := bitmaptest.NewMemStore()
			rev := store.Put(tt.snap)
			p, err := bitmap.NewPersistent(ctx, netip.MustParsePrefix(cidr), store)
			if err != nil {
				t.Fatalf("NewPersistent(%s) over a bitmap of %s = %v, want nil", cidr, tt.snap.Range, err)
			}
			if err := p.LoadError(); !errors.As(err, new(*bitmap.RangeMismatchError)) {
				t.Errorf("LoadError() after NewPersistent = %v, want a *RangeMismatchError", err)
			}
			for _, op := range ops {
				err := op.do(ctx, p)
				var rme *bitmap.RangeMismatchError
				if !errors.Is(err, allocator.ErrMismatchedNetwork) || !errors.As(err, &rme) {
					t.Fatalf("%s() = %v, want a *RangeMismatchError matching ErrMismatchedNetwork", op.name, err)
				}
				if !strings.HasPrefix(err.Error(), "the provided range does not match the current range") {
					t.Errorf("%s() = %q, want it to begin with kube-apiserver's text", op.name, err)
				}
				if rme.Stored != tt.snap.Range || rme.Range != netip.MustParsePrefix(cidr) {
					t.Errorf("%s(): RangeMismatchError{Stored: %q, Range: %v}, want {%q, %s}", op.name, rme.Stored, rme.Range, tt.snap.Range, cidr)
				}
			}
			if p.Used() != 0 || p.Has(netip.MustParseAddr("10.96.0.10")) {
				t.Errorf("Used() = %d, Has(10.96.0.10) = %v; want an empty bitmap until the store holds one of %s", p.Used(), p.Has(netip.MustParseAddr("10.96.0.10")), cidr)
			}
			got, gotRev, _ := store.Get(ctx)
			if diff := cmp.Diff(tt.snap, got); diff != "" || gotRev != rev {
				t.Errorf("store changed: rev %d → %d, (-want +got):\n%s", rev, gotRev, diff)
			}

			// The repair rewrites the stored bitmap to the allocator's range.
			store.Put(snapshotOf(t, cidr, "10.96.0.10"))
			if err := p.LoadError(); err == nil {
				t.Errorf("LoadError() after the rewrite, before any read = nil, want the mismatch still: it does no I/O")
			}
			if err := p.Allocate(ctx, netip.MustParseAddr("10.96.0.10"), allocator.Owner{}); !errors.Is(err, allocator.ErrAllocated) {
				t.Errorf("Allocate(10.96.0.10) after the rewrite = %v, want ErrAllocated", err)
			}
			ip, err := p.AllocateNext(ctx, allocator.Owner{})
			if err != nil || !netip.MustParsePrefix(cidr).Contains(ip) {
				t.Errorf("AllocateNext() after the rewrite = %v, %v; want an address of %s", ip, err, cidr)
			}
			if p.Used() != 2 {
				t.Errorf("Used() after the rewrite = %d, want 2", p.Used())
			}
			if err := p.LoadError(); err != nil {
				t.Errorf("LoadError() after the rewrite was read = %v, want nil", err)
			}
		})
	}
}

func TestPersistentMissingSnapshotIsNotReady(t *testing.T) {
	store := bitmaptest.NewMemStore()
	p := churntest.NewPersistent(t, "10.96.0.0/24", store)
	store.Delete()
	if _, err := p.AllocateNext(context.Background(), allocator.Owner{}); !errors.Is(err, allocator.ErrNotReady) {
		t.Errorf("AllocateNext() with the snapshot deleted = %v, want ErrNotReady", err)
	}
	if _, rev, _ := store.Get(context.Background()); rev != 0 {
		t.Errorf("store recreated the snapshot (rev %d); only NewPersistent bootstraps", rev)
	}
}

// TestNewPersistentReportsValueCreatedConcurrentlyAsCorrupt checks that a value that cannot be
// decoded makes NewPersistent fail with ErrCorrupt also when it appears between the first read and
// the create-if-absent (a store then reports a plain conflict, without the value).
func TestNewPersistentReportsValueCreatedConcurrentlyAsCorrupt(t *testing.T) {
	store := bitmaptest.NewMemStore()
	store.OnUpdate(func(context.Context, int64, bitmap.Snapshot) error {
		return fmt.Errorf("test: %w", bitmap.ErrConflict)
	})
	gets := 0
	store.OnGet(func(context.Context) error {
		if gets++; gets > 1 {
			return fmt.Errorf("test: garbage at the key: %w", bitmap.ErrCorrupt)
		}
		return nil
	})
	_, err := bitmap.NewPersistent(context.Background(), netip.MustParsePrefix("10.96.0.0/24"), store)
	if !errors.Is(err, bitmap.ErrCorrupt) {
		t.Errorf("NewPersistent() = %v, want an error wrapping ErrCorrupt", err)
	}
}

// TestNewPersistentRefusesRangesTooLargeToStore checks that NewPersistent refuses, before it
// touches the store, an IPv4 range wider than kube-apiserver's cap of 20 host bits, whose snapshot
// the store (etcd) could not hold, while New keeps accepting it in memory.
func TestNewPersistentRefusesRangesTooLargeToStore(t *testing.T) {
	tests := []struct {
		cidr    string
		refused bool
	}{
		{cidr: "10.0.0.0/8", refused: true},
		{cidr: "10.0.0.0/11", refused: true},
		{cidr: "10.96.0.0/12", refused: false},
		{cidr: "10.96.0.0/24", refused: false},
		// An IPv6 bitmap holds at most MaxIPv6Slots whatever the prefix, as in kube-apiserver.
		{cidr: "fd00::/64", refused: false},
		{cidr: "fd00::/108", refused: false},
	}
	for _, tt := range tests {
		t.Run(tt.cidr, func(t *testing.T) {
			cidr := netip.MustParsePrefix(tt.cidr)
			store := bitmaptest.NewMemStore()
			p, err := bitmap.NewPersistent(context.Background(), cidr, store)
			if !tt.refused {
				if err != nil {
					t.Fatalf("NewPersistent(%s) = %v, want nil", cidr, err)
				}
				p.Close()
				return
			}
			var pe *allocator.PrefixError
			if !errors.As(err, &pe) || !errors.Is(err, allocator.ErrInvalid) || pe.Prefix != cidr {
				t.Fatalf("NewPersistent(%s) error = %v, want an *allocator.PrefixError for %s matching ErrInvalid", cidr, err, cidr)
			}
			if got := store.Stats(); got != (bitmaptest.MemStoreStats{}) {
				t.Errorf("store calls = %+v, want none", got)
			}
			if _, err := bitmap.New(cidr); err != nil {
				t.Errorf("New(%s) = %v, want nil: in memory the range is fine", cidr, err)
			}
		})
	}
}

func TestPersistentLoadErrorWhileNothingIsStored(t *testing.T) {
	ctx := context.Background()
	store := bitmaptest.NewMemStore()
	p, err := bitmap.NewPersistent(ctx, netip.MustParsePrefix("10.96.0.0/24"), store)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.LoadError(); err != nil {
		t.Fatalf("LoadError() of a bitmap NewPersistent created = %v, want nil", err)
	}
	store.Delete()
	if err := p.Refresh(ctx); !errors.Is(err, allocator.ErrNotReady) {
		t.Fatalf("Refresh() of a deleted bitmap = %v, want ErrNotReady", err)
	}
	if err := p.LoadError(); !errors.Is(err, allocator.ErrNotReady) {
		t.Errorf("LoadError() after the bitmap was deleted = %v, want ErrNotReady", err)
	}
	if _, err := p.AllocateNext(ctx, allocator.Owner{}); err == nil {
		t.Fatal("AllocateNext() with nothing stored = nil error, want one")
	}
	store.Put(snapshotOf(t, "10.96.0.0/24"))
	if err := p.Refresh(ctx); err != nil {
		t.Fatalf("Refresh() after the bitmap was stored again = %v", err)
	}
	if err := p.LoadError(); err != nil {
		t.Errorf("LoadError() after the bitmap was stored again = %v, want nil", err)
	}
}
