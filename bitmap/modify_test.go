package bitmap_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/bitmaptest"
)

var cidr24 = netip.MustParsePrefix("10.96.0.0/24")

// setBit returns a Modify function that sets the bit of ip.
func setBit(ip string) func(*bitmap.Allocator) (bool, error) {
	return func(a *bitmap.Allocator) (bool, error) {
		err := a.Allocate(context.Background(), netip.MustParseAddr(ip), allocator.Owner{})
		if errors.Is(err, allocator.ErrAllocated) {
			return false, nil
		}
		return err == nil, err
	}
}

// stored returns the addresses of the bitmap of cidr in m.
func stored(t *testing.T, m bitmap.Store, cidr netip.Prefix) []string {
	t.Helper()
	a, _, err := bitmap.Load(context.Background(), m, cidr)
	if err != nil {
		t.Fatalf("Load() = %v", err)
	}
	var ips []string
	for ip := range a.All() {
		ips = append(ips, ip.String())
	}
	return ips
}

func TestModifyCreatesAMissingBitmap(t *testing.T) {
	m := bitmaptest.NewMemStore()
	if err := bitmap.Modify(t.Context(), m, cidr24, setBit("10.96.0.7")); err != nil {
		t.Fatalf("Modify() = %v", err)
	}
	if diff := cmp.Diff([]string{"10.96.0.7"}, stored(t, m, cidr24)); diff != "" {
		t.Errorf("stored bits (-want +got):\n%s", diff)
	}
}

func TestModifyWithoutCreate(t *testing.T) {
	m := bitmaptest.NewMemStore()
	called := false
	err := bitmap.Modify(t.Context(), m, cidr24, func(a *bitmap.Allocator) (bool, error) {
		called = true
		return setBit("10.96.0.7")(a)
	}, bitmap.WithoutCreate())
	if !errors.Is(err, allocator.ErrNotReady) || called {
		t.Errorf("Modify(WithoutCreate()) of nothing = %v, called %v; want ErrNotReady without a call", err, called)
	}
	if _, rev, _ := m.Get(t.Context()); rev != 0 {
		t.Errorf("Modify(WithoutCreate()) created the bitmap")
	}
}

func TestModifyStoresNothingWithoutAChange(t *testing.T) {
	m := bitmaptest.NewMemStore()
	if err := bitmap.Modify(t.Context(), m, cidr24, func(*bitmap.Allocator) (bool, error) { return false, nil }); err != nil {
		t.Fatalf("Modify() = %v", err)
	}
	want := errors.New("no")
	if err := bitmap.Modify(t.Context(), m, cidr24, func(a *bitmap.Allocator) (bool, error) {
		_, _ = setBit("10.96.0.7")(a)
		return true, want
	}); !errors.Is(err, want) {
		t.Errorf("Modify() with a failing function = %v, want %v", err, want)
	}
	if st := m.Stats(); st.Updates != 0 {
		t.Errorf("Stats().Updates = %d, want 0", st.Updates)
	}
}

func TestModifyRetriesOnTheStateThatWon(t *testing.T) {
	m := bitmaptest.NewMemStore()
	if err := bitmap.Modify(t.Context(), m, cidr24, setBit("10.96.0.1")); err != nil {
		t.Fatal(err)
	}
	other, _ := bitmap.New(cidr24)
	_ = other.Allocate(t.Context(), netip.MustParseAddr("10.96.0.1"), allocator.Owner{})
	_ = other.Allocate(t.Context(), netip.MustParseAddr("10.96.0.2"), allocator.Owner{})
	conflicts := 3
	m.OnUpdate(func(context.Context, int64, bitmap.Snapshot) error {
		if conflicts > 0 {
			conflicts--
			m.Put(other.Snapshot()) // another writer gets in first
		}
		return nil
	})
	calls := 0
	err := bitmap.Modify(t.Context(), m, cidr24, func(a *bitmap.Allocator) (bool, error) {
		calls++
		return setBit("10.96.0.3")(a)
	})
	if err != nil {
		t.Fatalf("Modify() = %v", err)
	}
	if calls != 4 {
		t.Errorf("the function ran %d times, want 4 (3 conflicts)", calls)
	}
	if diff := cmp.Diff([]string{"10.96.0.1", "10.96.0.2", "10.96.0.3"}, stored(t, m, cidr24)); diff != "" {
		t.Errorf("stored bits (-want +got):\n%s", diff)
	}
}

func TestModifyGivesUpAfterItsAttempts(t *testing.T) {
	for _, tt := range []struct {
		name  string
		opts  []bitmap.ModifyOption
		calls int
	}{
		{"default", nil, bitmap.DefaultModifyAttempts},
		{"WithAttempts(3)", []bitmap.ModifyOption{bitmap.WithAttempts(3)}, 3},
		{"WithAttempts(1)", []bitmap.ModifyOption{bitmap.WithAttempts(1)}, 1},
		{"WithAttempts(0) keeps the default", []bitmap.ModifyOption{bitmap.WithAttempts(0)}, bitmap.DefaultModifyAttempts},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := bitmaptest.NewMemStore()
			m.OnUpdate(func(_ context.Context, _ int64, s bitmap.Snapshot) error {
				m.Put(bitmap.Snapshot{Range: cidr24.String()}) // always first
				return nil
			})
			calls := 0
			err := bitmap.Modify(t.Context(), m, cidr24, func(a *bitmap.Allocator) (bool, error) {
				calls++
				return setBit("10.96.0.3")(a)
			}, tt.opts...)
			if !errors.Is(err, bitmap.ErrConflict) {
				t.Errorf("Modify() = %v, want ErrConflict", err)
			}
			if calls != tt.calls {
				t.Errorf("the function ran %d times, want %d", calls, tt.calls)
			}
		})
	}
}

func TestModifyWithRevisionActsOnlyOnThatRevision(t *testing.T) {
	m := bitmaptest.NewMemStore()
	if err := bitmap.Modify(t.Context(), m, cidr24, setBit("10.96.0.1")); err != nil {
		t.Fatal(err)
	}
	_, rev, err := bitmap.Load(t.Context(), m, cidr24)
	if err != nil {
		t.Fatal(err)
	}
	if err := bitmap.Modify(t.Context(), m, cidr24, setBit("10.96.0.2")); err != nil { // another writer
		t.Fatal(err)
	}
	called := false
	err = bitmap.Modify(t.Context(), m, cidr24, func(*bitmap.Allocator) (bool, error) {
		called = true
		return true, nil
	}, bitmap.WithRevision(rev))
	var ce *bitmap.ConflictError
	if !errors.As(err, &ce) || called {
		t.Fatalf("Modify(WithRevision(stale)) = %v, called %v; want a *ConflictError without a call", err, called)
	}

	// At the stored revision: one compare-and-swap, and a conflict is returned, not retried.
	m.OnUpdate(func(context.Context, int64, bitmap.Snapshot) error {
		m.Put(bitmap.Snapshot{Range: cidr24.String()})
		return nil
	})
	calls := 0
	err = bitmap.Modify(t.Context(), m, cidr24, func(a *bitmap.Allocator) (bool, error) {
		calls++
		return setBit("10.96.0.3")(a)
	}, bitmap.WithRevision(ce.Rev))
	if !errors.Is(err, bitmap.ErrConflict) || calls != 1 {
		t.Errorf("Modify(WithRevision) under a conflict = %v after %d calls; want ErrConflict after 1", err, calls)
	}
}

func TestModifyOfAnotherRange(t *testing.T) {
	old := netip.MustParsePrefix("10.96.0.0/23")
	oldBits, _ := bitmap.New(old)
	for _, ip := range []string{"10.96.0.5", "10.96.1.5"} { // the second is outside the new range
		_ = oldBits.Allocate(context.Background(), netip.MustParseAddr(ip), allocator.Owner{})
	}

	m := bitmaptest.NewMemStore()
	m.Put(oldBits.Snapshot())
	var mismatch *bitmap.RangeMismatchError
	if _, _, err := bitmap.Load(t.Context(), m, cidr24); !errors.As(err, &mismatch) {
		t.Errorf("Load() of another range = %v, want *RangeMismatchError", err)
	}
	if err := bitmap.Modify(t.Context(), m, cidr24, setBit("10.96.0.6")); !errors.As(err, &mismatch) {
		t.Errorf("Modify() of another range = %v, want *RangeMismatchError", err)
	}
	a, _, err := bitmap.Load(t.Context(), m, cidr24, bitmap.WithProjection())
	if err != nil || !slices.Equal(slices.Collect(a.All()), []netip.Addr{netip.MustParseAddr("10.96.0.5")}) {
		t.Errorf("Load(WithProjection()) = %v, %v; want 10.96.0.5", a, err)
	}
	if st := m.Stats(); st.Updates != 0 {
		t.Errorf("Load or a refused Modify wrote %d times", st.Updates)
	}

	// With projection a change of nothing still rewrites the bitmap to the new range.
	err = bitmap.Modify(t.Context(), m, cidr24, func(*bitmap.Allocator) (bool, error) { return false, nil }, bitmap.WithProjection())
	if err != nil {
		t.Fatalf("Modify(WithProjection()) = %v", err)
	}
	if s, _, _ := m.Get(t.Context()); s.Range != cidr24.String() {
		t.Errorf("stored range = %q, want %s", s.Range, cidr24)
	}
	if diff := cmp.Diff([]string{"10.96.0.5"}, stored(t, m, cidr24)); diff != "" {
		t.Errorf("stored bits (-want +got):\n%s", diff)
	}
}

func TestProject(t *testing.T) {
	for _, tt := range []struct {
		name      string
		s         bitmap.Snapshot
		want      []string
		projected bool
		err       error
	}{
		{name: "empty", s: bitmap.Snapshot{}},
		{name: "same range", s: bitmap.Snapshot{Range: "10.96.0.0/24", Data: []byte{0x02, 0x01}}, want: []string{"10.96.0.1", "10.96.0.10"}},
		{name: "same range, unmasked", s: bitmap.Snapshot{Range: "10.96.0.9/24", Data: []byte{0x01}}, want: []string{"10.96.0.1"}},
		{name: "wider range", s: snapshotOf(t, "10.96.0.0/16", "10.96.0.1", "10.96.1.1"), want: []string{"10.96.0.1"}, projected: true},
		{name: "disjoint range", s: snapshotOf(t, "10.97.0.0/24", "10.97.0.1"), projected: true},
		{name: "garbage range", s: bitmap.Snapshot{Range: "nope"}, err: bitmap.ErrCorrupt},
		{name: "bits beyond the range", s: bitmap.Snapshot{Range: "10.96.0.0/24", Data: append([]byte{1}, make([]byte, 63)...)}, err: bitmap.ErrCorrupt},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a, projected, err := bitmap.Project(tt.s, cidr24)
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Errorf("Project() = %v, want %v", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Project() = %v", err)
			}
			var got []string
			for ip := range a.All() {
				got = append(got, ip.String())
			}
			if diff := cmp.Diff(tt.want, got); diff != "" || projected != tt.projected {
				t.Errorf("Project() projected %v (want %v), bits (-want +got):\n%s", projected, tt.projected, diff)
			}
		})
	}
}

func ExampleModify() {
	ctx := context.Background()
	store := bitmaptest.NewMemStore() // or an etcdstore.Store at kube-apiserver's key
	cidr := netip.MustParsePrefix("10.96.0.0/24")
	setBits := func(ips ...string) func(*bitmap.Allocator) (bool, error) {
		return func(a *bitmap.Allocator) (bool, error) {
			changed := false
			for _, ip := range ips {
				if a.Allocate(ctx, netip.MustParseAddr(ip), allocator.Owner{}) == nil {
					changed = true
				}
			}
			return changed, nil
		}
	}
	fmt.Println(bitmap.Modify(ctx, store, cidr, setBits("10.96.0.1", "10.96.0.10"))) // creates it
	fmt.Println(bitmap.Modify(ctx, store, cidr, setBits("10.96.0.10")))              // no change, no write

	a, rev, _ := bitmap.Load(ctx, store, cidr)
	fmt.Println(a.Used(), "used at revision", rev)
	// Output:
	// <nil>
	// <nil>
	// 2 used at revision 1
}

// conflictThenBrokenStore answers its first Update with a bare ErrConflict (no state carried)
// and every Get after that with readErr.
type conflictThenBrokenStore struct {
	bitmap.Store
	conflicted bool
	readErr    error
}

func (s *conflictThenBrokenStore) Get(ctx context.Context) (bitmap.Snapshot, int64, error) {
	if s.conflicted {
		return bitmap.Snapshot{}, 0, s.readErr
	}
	return s.Store.Get(ctx)
}

func (s *conflictThenBrokenStore) Update(ctx context.Context, rev int64, snap bitmap.Snapshot) (int64, error) {
	s.conflicted = true
	return 0, fmt.Errorf("lost a race: %w", bitmap.ErrConflict)
}

func TestModifyReturnsTheErrorOfTheReadAfterAConflict(t *testing.T) {
	readErr := errors.New("etcd is gone")
	s := &conflictThenBrokenStore{Store: bitmaptest.NewMemStore(), readErr: readErr}
	calls := 0
	err := bitmap.Modify(t.Context(), s, cidr24, func(a *bitmap.Allocator) (bool, error) {
		calls++
		return setBit("10.96.0.1")(a)
	})
	if !errors.Is(err, readErr) {
		t.Errorf("Modify() = %v, want the error of the read after the conflict", err)
	}
	if calls != 1 {
		t.Errorf("the function ran %d times, want 1: nothing was read after the conflict", calls)
	}
}
