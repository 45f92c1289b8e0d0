package bitmap_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/allocator/allocatortest"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/bitmaptest"
	"github.com/kube-ipam/clusterip/bitmap/internal/churntest"
	"github.com/kube-ipam/clusterip/internal/testenv"
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

// gateUpdates makes every Update of store wait until open is called; started receives when the
// first one is waiting.
func gateUpdates(store *bitmaptest.MemStore) (started <-chan struct{}, open func()) {
	gate := make(chan struct{})
	ch := make(chan struct{}, 1)
	store.OnUpdate(func(context.Context, int64, bitmap.Snapshot) error {
		select {
		case ch <- struct{}{}:
		default:
		}
		<-gate
		return nil
	})
	return ch, sync.OnceFunc(func() { close(gate) })
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

func TestPersistentSeesOtherAllocatorsWrites(t *testing.T) {
	ctx := context.Background()
	store := bitmaptest.NewMemStore()
	a := churntest.NewPersistent(t, "10.96.0.0/24", store)
	b := churntest.NewPersistent(t, "10.96.0.0/24", store)
	ip, err := a.AllocateNext(ctx, allocator.Owner{})
	if err != nil {
		t.Fatal(err)
	}
	if b.Has(ip) {
		t.Fatalf("b.Has(%v) before any read = true; b answers from its last known state", ip)
	}
	// b's local state is stale (ip looks free), so its write conflicts and it learns the truth.
	if err := b.Allocate(ctx, ip, allocator.Owner{}); !errors.Is(err, allocator.ErrAllocated) {
		t.Fatalf("b.Allocate(%v) = %v, want ErrAllocated", ip, err)
	}
	if !b.Has(ip) {
		t.Errorf("b.Has(%v) after its Allocate was refused = false, want true", ip)
	}
	// A release through b is not skipped just because a's allocation is newer than b's state.
	ip2, err := a.AllocateNext(ctx, allocator.Owner{})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, ip2); err != nil {
		t.Fatal(err)
	}
	if got := churntest.Stored(t, store, "10.96.0.0/24"); !slices.Equal(got, []netip.Addr{ip}) {
		t.Errorf("stored = %v, want [%v]", got, ip)
	}
	// a is now stale; its next write conflicts, reloads and keeps b's release.
	if err := a.Allocate(ctx, netip.MustParseAddr("10.96.0.3"), allocator.Owner{}); err != nil {
		t.Fatal(err)
	}
	if err := a.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	want := []netip.Addr{netip.MustParseAddr("10.96.0.3"), ip}
	slices.SortFunc(want, netip.Addr.Compare)
	if got := slices.Collect(a.All()); !slices.Equal(got, want) {
		t.Errorf("a.All() = %v, want %v", got, want)
	}
}

// TestPersistentGroupCommit checks that concurrent callers share compare-and-swaps: with each
// CAS taking a while, N callers need far fewer than N of them.
func TestPersistentGroupCommit(t *testing.T) {
	const callers, each = 32, 4
	store := bitmaptest.NewMemStore()
	p := churntest.NewPersistent(t, "10.96.0.0/24", store)
	store.OnUpdate(func(context.Context, int64, bitmap.Snapshot) error {
		time.Sleep(2 * time.Millisecond) // a CAS in flight for a while, as over the network
		return nil
	})
	before := store.Stats().Updates
	var (
		mu  sync.Mutex
		got []netip.Addr
		wg  sync.WaitGroup
	)
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				ip, err := p.AllocateNext(context.Background(), allocator.Owner{})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				got = append(got, ip)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	cas := store.Stats().Updates - before
	t.Logf("%d operations in %d compare-and-swaps", callers*each, cas)
	if cas >= callers*each/2 {
		t.Errorf("compare-and-swaps = %d for %d concurrent operations, want fewer than half", cas, callers*each)
	}
	slices.SortFunc(got, netip.Addr.Compare)
	if len(slices.Compact(slices.Clone(got))) != len(got) {
		t.Errorf("duplicate addresses handed out: %v", got)
	}
	if diff := cmp.Diff(got, churntest.Stored(t, store, "10.96.0.0/24"), cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("stored addresses differ from those handed out (-handed +stored):\n%s", diff)
	}
	if p.Used() != uint64(len(got)) {
		t.Errorf("Used() = %d, want %d", p.Used(), len(got))
	}
}

// TestPersistentBatchFailuresAreIsolated queues several operations behind a CAS in flight and
// checks that they are stored with one CAS, that each gets its own answer, and that one failing
// does not fail the others.
func TestPersistentBatchFailuresAreIsolated(t *testing.T) {
	ctx := context.Background()
	store := bitmaptest.NewMemStore()
	p := churntest.NewPersistent(t, "10.96.0.0/24", store, bitmap.WithSeed(1))
	held := netip.MustParseAddr("10.96.0.50")
	if err := p.Allocate(ctx, held, allocator.Owner{}); err != nil {
		t.Fatal(err)
	}
	started, open := gateUpdates(store)
	defer open()
	first := make(chan error, 1)
	go func() { first <- p.Allocate(ctx, netip.MustParseAddr("10.96.0.2"), allocator.Owner{}) }()
	<-started

	target := netip.MustParseAddr("10.96.0.9")
	type result struct {
		name string
		ip   netip.Addr
		err  error
	}
	results := make(chan result, 4)
	go func() { results <- result{name: "allocate A", err: p.Allocate(ctx, target, allocator.Owner{})} }()
	go func() { results <- result{name: "allocate B", err: p.Allocate(ctx, target, allocator.Owner{})} }()
	go func() { results <- result{name: "release", err: p.Release(ctx, held)} }()
	go func() {
		ip, err := p.AllocateNext(ctx, allocator.Owner{})
		results <- result{name: "next", ip: ip, err: err}
	}()
	testenv.WaitFor(t, "four queued operations", func() bool { return bitmap.QueuedOps(p) == 4 })
	updatesBefore := store.Stats().Updates // the first CAS is still waiting in the hook: not counted
	open()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	var allocated, refused int
	var next netip.Addr
	for range 4 {
		r := <-results
		switch {
		case r.name == "next" && r.err == nil:
			next = r.ip
		case r.name == "release" && r.err == nil:
		case r.err == nil:
			allocated++
		case errors.Is(r.err, allocator.ErrAllocated):
			refused++
		default:
			t.Errorf("%s: %v", r.name, r.err)
		}
	}
	if allocated != 1 || refused != 1 {
		t.Errorf("two Allocate(%v): %d succeeded and %d got ErrAllocated, want 1 and 1", target, allocated, refused)
	}
	// The first CAS, then exactly one for the four queued operations.
	if got := store.Stats().Updates - updatesBefore; got != 2 {
		t.Errorf("compare-and-swaps = %d, want 2: the first caller's and one for the queued batch", got)
	}
	want := []netip.Addr{netip.MustParseAddr("10.96.0.2"), target, next}
	slices.SortFunc(want, netip.Addr.Compare)
	if got := churntest.Stored(t, store, "10.96.0.0/24"); !slices.Equal(got, want) {
		t.Errorf("stored = %v, want %v", got, want)
	}
}

// conflictingWriter makes the next n Updates of store meet a write of another allocator that
// takes one more address each time, and returns the addresses it takes.
func conflictingWriter(t *testing.T, store *bitmaptest.MemStore, cidr string, n int) *[]string {
	var mu sync.Mutex
	var taken []string
	count := 0
	store.OnUpdate(func(ctx context.Context, rev int64, s bitmap.Snapshot) error {
		mu.Lock()
		defer mu.Unlock()
		if count >= n {
			return nil
		}
		count++
		taken = append(taken, fmt.Sprintf("10.96.0.%d", count))
		store.Put(snapshotOf(t, cidr, taken...))
		return nil
	})
	return &taken
}

func TestPersistentRetriesConflicts(t *testing.T) {
	store := bitmaptest.NewMemStore()
	p := churntest.NewPersistent(t, "10.96.0.0/24", store, bitmap.WithBackoff(time.Microsecond, time.Millisecond))
	taken := conflictingWriter(t, store, "10.96.0.0/24", 3)
	ip, err := p.AllocateNext(context.Background(), allocator.Owner{})
	if err != nil {
		t.Fatalf("AllocateNext() = %v", err)
	}
	if st := store.Stats(); st.Conflicts != 3 {
		t.Errorf("conflicts = %d, want 3", st.Conflicts)
	}
	var want []netip.Addr
	for _, s := range *taken {
		want = append(want, netip.MustParseAddr(s))
	}
	want = append(want, ip)
	slices.SortFunc(want, netip.Addr.Compare)
	if got := churntest.Stored(t, store, "10.96.0.0/24"); !slices.Equal(got, want) {
		t.Errorf("stored = %v, want the other writer's %v plus ours %v", got, *taken, ip)
	}
	if got := slices.Collect(p.All()); !slices.Equal(got, want) {
		t.Errorf("All() = %v, want %v", got, want)
	}
}

func TestPersistentGivesUpAfterMaxAttempts(t *testing.T) {
	store := bitmaptest.NewMemStore()
	p := churntest.NewPersistent(t, "10.96.0.0/24", store, bitmap.WithMaxAttempts(3), bitmap.WithBackoff(time.Microsecond, time.Microsecond))
	conflictingWriter(t, store, "10.96.0.0/24", 1000)
	before := store.Stats().Updates
	_, err := p.AllocateNext(context.Background(), allocator.Owner{})
	if !errors.Is(err, bitmap.ErrConflict) {
		t.Fatalf("AllocateNext() = %v, want ErrConflict", err)
	}
	if got := store.Stats().Updates - before; got != 3 {
		t.Errorf("compare-and-swaps = %d, want 3 (the bound)", got)
	}
	// The allocator knows the other writer's state and stored nothing of its own.
	if got, want := churntest.Stored(t, store, "10.96.0.0/24"), slices.Collect(p.All()); !slices.Equal(got, want) {
		t.Errorf("stored = %v, All() = %v; want equal", got, want)
	}
}

var errInjected = errors.New("injected store failure")

func TestPersistentWriteFailureLeavesNothing(t *testing.T) {
	store := bitmaptest.NewMemStore()
	p := churntest.NewPersistent(t, "10.96.0.0/24", store)
	store.OnUpdate(func(context.Context, int64, bitmap.Snapshot) error {
		store.OnUpdate(nil) // fail once, before storing; the fencing write then succeeds
		return errInjected
	})
	_, err := p.AllocateNext(context.Background(), allocator.Owner{})
	if !errors.Is(err, errInjected) || errors.Is(err, bitmap.ErrOutcomeUnknown) {
		t.Fatalf("AllocateNext() = %v, want the injected error, without ErrOutcomeUnknown", err)
	}
	if got := churntest.Stored(t, store, "10.96.0.0/24"); len(got) != 0 || p.Used() != 0 {
		t.Errorf("stored = %v, Used() = %d; want nothing", got, p.Used())
	}
	if _, err := p.AllocateNext(context.Background(), allocator.Owner{}); err != nil {
		t.Errorf("AllocateNext() after the failure = %v", err)
	}
}

func TestPersistentLostResponseIsOutcomeUnknown(t *testing.T) {
	store := bitmaptest.NewMemStore()
	p := churntest.NewPersistent(t, "10.96.0.0/24", store)
	store.OnUpdated(func(context.Context, int64) error {
		store.OnUpdated(nil) // stored, but the answer is lost
		return errInjected
	})
	_, err := p.AllocateNext(context.Background(), allocator.Owner{})
	if !errors.Is(err, bitmap.ErrOutcomeUnknown) || !errors.Is(err, errInjected) {
		t.Fatalf("AllocateNext() = %v, want ErrOutcomeUnknown wrapping the injected error", err)
	}
	// The allocator must not have claimed anything: the next call reloads and sees the write.
	ip, err := p.AllocateNext(context.Background(), allocator.Owner{})
	if err != nil {
		t.Fatal(err)
	}
	if got := churntest.Stored(t, store, "10.96.0.0/24"); len(got) != 2 || !slices.Contains(got, ip) {
		t.Errorf("stored = %v, want the lost write's address and %v", got, ip)
	}
}

func TestPersistentQueuedCallerGivesUp(t *testing.T) {
	store := bitmaptest.NewMemStore()
	p := churntest.NewPersistent(t, "10.96.0.0/24", store)
	started, open := gateUpdates(store)
	defer open()
	first := make(chan error, 1)
	go func() {
		_, err := p.AllocateNext(context.Background(), allocator.Owner{})
		first <- err
	}()
	<-started
	// The read-only methods answer while a compare-and-swap is in flight.
	if p.Used() != 0 || p.Has(netip.MustParseAddr("10.96.0.20")) || len(slices.Collect(p.All())) != 0 || p.Free() != 254 {
		t.Errorf("read-only methods during the CAS: Used %d, Free %d; want the last known state", p.Used(), p.Free())
	}
	if _, err := p.DryRun().AllocateNext(context.Background(), allocator.Owner{}); err != nil {
		t.Errorf("DryRun().AllocateNext() during the CAS = %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := p.AllocateNext(ctx, allocator.Owner{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("queued AllocateNext() = %v, want DeadlineExceeded", err)
	}
	open()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if got := churntest.Stored(t, store, "10.96.0.0/24"); len(got) != 1 || p.Used() != 1 {
		t.Errorf("stored = %v, Used() = %d; want only the first caller's address", got, p.Used())
	}
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

// TestPersistentChurnNeverDuplicates runs allocators sharing one store under concurrent
// AllocateNext and Release, with injected delays, lost responses and failures, and checks that no
// address is ever held by two callers, that every held address is stored, and that the store holds
// nothing else but addresses of writes reported as ErrOutcomeUnknown.
func TestPersistentChurnNeverDuplicates(t *testing.T) {
	store := bitmaptest.NewMemStore()
	var rngMu sync.Mutex // guards rng
	rng := rand.New(rand.NewPCG(1, 2))
	chance := func(n int) bool {
		rngMu.Lock()
		defer rngMu.Unlock()
		return rng.IntN(n) == 0
	}
	ps := make([]*bitmap.Persistent, 3)
	for i := range ps {
		ps[i] = churntest.NewPersistent(t, "10.96.0.0/26", store, bitmap.WithBackoff(time.Microsecond, 10*time.Microsecond))
	}
	store.OnUpdate(func(context.Context, int64, bitmap.Snapshot) error {
		if chance(20) {
			return errInjected // not stored
		}
		if chance(10) {
			time.Sleep(100 * time.Microsecond)
		}
		return nil
	})
	store.OnUpdated(func(context.Context, int64) error {
		if chance(30) {
			return errInjected // stored, answer lost
		}
		return nil
	})
	as := make([]allocator.Interface, len(ps))
	for i, p := range ps {
		as[i] = p
	}
	res := churntest.Run(t, as, churntest.Config{Calls: 150})
	store.OnUpdate(nil)
	store.OnUpdated(nil)
	res.Check(t, churntest.Stored(t, store, "10.96.0.0/26"))
}

// TestPersistentCanceledLeaderReturnsOnceItsOperationIsDone checks that a caller whose context
// ends returns as soon as its own operation is finished (here: dropped after a conflict), even if
// it was the first of its batch: it must not stay behind to store the other callers' operations.
func TestPersistentCanceledLeaderReturnsOnceItsOperationIsDone(t *testing.T) {
	store := bitmaptest.NewMemStore()
	p := churntest.NewPersistent(t, "10.96.0.0/24", store, bitmap.WithBackoff(time.Microsecond, time.Microsecond))
	first, second, rest := make(chan struct{}), make(chan struct{}), make(chan struct{})
	secondStarted := make(chan struct{})
	defer close(rest)
	updates := onNthUpdate(store, func(n int) {
		switch n {
		case 1: // the first caller's batch
			<-first
		case 2: // the batch of the two queued callers: held, then made to conflict
			close(secondStarted)
			<-second
			store.Put(snapshotOf(t, "10.96.0.0/24", "10.96.0.250"))
		default: // its retry, for the remaining caller only: held until the test ends
			<-rest
		}
	})
	firstDone := make(chan error, 1)
	go func() {
		_, err := p.AllocateNext(context.Background(), allocator.Owner{})
		firstDone <- err
	}()
	testenv.WaitFor(t, "the first CAS in flight", func() bool {
		return updates() == 1
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	canceled := make(chan error, 1)
	go func() {
		_, err := p.AllocateNext(ctx, allocator.Owner{})
		canceled <- err
	}()
	testenv.WaitFor(t, "one queued operation", func() bool { return bitmap.QueuedOps(p) == 1 })
	go func() { _, _ = p.AllocateNext(context.Background(), allocator.Owner{}) }()
	testenv.WaitFor(t, "two queued operations", func() bool { return bitmap.QueuedOps(p) == 2 })
	close(first)
	if err := <-firstDone; err != nil {
		t.Fatal(err)
	}
	<-secondStarted
	cancel() // while its operation is being stored: it waits for that CAS, but no longer
	close(second)
	select {
	case err := <-canceled:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("AllocateNext() of the canceled caller = %v, want Canceled (its CAS conflicted)", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the canceled caller is still blocked, storing another caller's operation")
	}
}

// pausingStore is a Store whose next Get, once armed, reads the store and then waits until
// resumed before it returns: a read that is answered late, after the store has moved on.
type pausingStore struct {
	*bitmaptest.MemStore
	mu     sync.Mutex
	paused chan struct{} // closed once the armed Get has read
	resume chan struct{} // the armed Get returns once this is closed
}

func (s *pausingStore) armNextGet() (paused, resume chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.paused, s.resume = make(chan struct{}), make(chan struct{})
	return s.paused, s.resume
}

func (s *pausingStore) Get(ctx context.Context) (bitmap.Snapshot, int64, error) {
	snap, rev, err := s.MemStore.Get(ctx)
	s.mu.Lock()
	paused, resume := s.paused, s.resume
	s.paused, s.resume = nil, nil
	s.mu.Unlock()
	if paused != nil {
		close(paused)
		<-resume
	}
	return snap, rev, err
}

// gatedErrContext is a context whose nth call to Err waits until gate is closed; reached is
// closed when that call starts. It lets a test stop a batch between two of its attempts.
type gatedErrContext struct {
	context.Context
	mu      sync.Mutex
	calls   int
	n       int
	reached chan struct{}
	gate    chan struct{}
}

func (c *gatedErrContext) Err() error {
	c.mu.Lock()
	c.calls++
	hit := c.calls == c.n
	c.mu.Unlock()
	if hit {
		close(c.reached)
		<-c.gate
	}
	return c.Context.Err()
}

// TestPersistentNeverAnswersFromAnOlderStateThanItRead checks that an operation that changes
// nothing is answered from a state at least as new as one the batch itself read from the store:
// a concurrent Refresh that read earlier but returns later (and is adopted because a foreign
// value had made the state stale) must not bring back an older state to answer from.
func TestPersistentNeverAnswersFromAnOlderStateThanItRead(t *testing.T) {
	ctx := context.Background()
	const cidr = "10.96.0.0/24"
	store := &pausingStore{MemStore: bitmaptest.NewMemStore()}
	p := churntest.NewPersistent(t, cidr, store)
	y := netip.MustParseAddr("10.96.0.77")
	if err := p.Allocate(ctx, y, allocator.Owner{}); err != nil {
		t.Fatal(err)
	}
	// A Refresh reads y allocated, and is answered late.
	paused, resume := store.armNextGet()
	slowRefresh := make(chan error, 1)
	go func() { slowRefresh <- p.Refresh(ctx) }()
	<-paused
	// Another allocator releases y.
	store.Put(snapshotOf(t, cidr))

	// Allocate(y): the local state says taken, the batch reads the store, sees y free and retries;
	// stop it before that retry (Err calls: submit, attempt 1, attempt 2).
	gctx := &gatedErrContext{Context: ctx, n: 3, reached: make(chan struct{}), gate: make(chan struct{})}
	result := make(chan error, 1)
	go func() { result <- p.Allocate(gctx, y, allocator.Owner{}) }()
	<-gctx.reached

	// A foreign value makes the state stale for a moment; then the store holds y free again.
	store.Put(snapshotOf(t, "10.0.0.0/24"))
	if err := p.Refresh(ctx); !errors.Is(err, allocator.ErrMismatchedNetwork) {
		t.Fatalf("Refresh() over a foreign range = %v, want ErrMismatchedNetwork", err)
	}
	store.Put(snapshotOf(t, cidr))
	// The slow Refresh now returns its old read, in which y is taken.
	close(resume)
	if err := <-slowRefresh; err != nil {
		t.Fatal(err)
	}
	close(gctx.gate)
	if err := <-result; err != nil {
		t.Errorf("Allocate(%v) = %v, want nil: the store held %v free whenever the call read it", y, err, y)
	}
	if got := churntest.Stored(t, store, cidr); !slices.Equal(got, []netip.Addr{y}) {
		t.Errorf("stored = %v, want [%v]", got, y)
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

// TestPersistentCallerDeadlineBoundsItsWait checks that a caller whose context ends while its
// operation is being stored, in a batch with a caller that has no deadline, returns at once with
// an error matching ErrOutcomeUnknown and its context's error instead of waiting for a Store call
// that hangs (2 s here), and that the committer then undoes an allocation whose caller has gone:
// the store ends up holding exactly what the callers were told they hold.
func TestPersistentCallerDeadlineBoundsItsWait(t *testing.T) {
	const cidr = "10.96.0.0/24"
	held := netip.MustParseAddr("10.96.0.7") // allocated before the test; released by the Release case
	tests := []struct {
		name string
		call func(ctx context.Context, p *bitmap.Persistent) error
		want []netip.Addr // stored at the end, besides the address of the caller without a deadline
	}{
		{
			name: "AllocateNext",
			call: func(ctx context.Context, p *bitmap.Persistent) error {
				_, err := p.AllocateNext(ctx, allocator.Owner{})
				return err
			},
			want: []netip.Addr{held},
		},
		{
			name: "Allocate",
			call: func(ctx context.Context, p *bitmap.Persistent) error {
				return p.Allocate(ctx, netip.MustParseAddr("10.96.0.9"), allocator.Owner{})
			},
			want: []netip.Addr{held},
		},
		{
			name: "Release",
			call: func(ctx context.Context, p *bitmap.Persistent) error { return p.Release(ctx, held) },
			want: nil, // stored: the caller was told the outcome is unknown, and it was done
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			store := bitmaptest.NewMemStore()
			store.Put(snapshotOf(t, cidr, held.String()))
			p := churntest.NewPersistent(t, cidr, store)

			// The first Update waits for firstGo so that both callers queue up behind it; the
			// second, which holds both of their operations, hangs for 2 s; later ones pass.
			firstGo := make(chan struct{})
			hookReturned := make(chan struct{})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			updates := onNthUpdate(store, func(n int) {
				switch n {
				case 1:
					<-firstGo
				case 2:
					// The short caller's deadline, 50 ms into the hanging Store call.
					time.AfterFunc(50*time.Millisecond, cancel)
					time.Sleep(2 * time.Second)
					close(hookReturned)
				}
			})
			first := allocateNextAsync(t, p, "first AllocateNext()")
			testenv.WaitFor(t, "the first Update in flight", func() bool {
				return updates() == 1
			})
			patient := allocateNextAsync(t, p, "AllocateNext() without a deadline")
			testenv.WaitFor(t, "one queued operation", func() bool { return bitmap.QueuedOps(p) == 1 })
			short := make(chan error, 1)
			go func() { short <- tt.call(ctx, p) }()
			testenv.WaitFor(t, "two queued operations", func() bool { return bitmap.QueuedOps(p) == 2 })
			close(firstGo)

			select {
			case err := <-short:
				if !errors.Is(err, bitmap.ErrOutcomeUnknown) || !errors.Is(err, context.Canceled) {
					t.Errorf("%s() whose context ended during the Store call = %v, want ErrOutcomeUnknown and Canceled", tt.name, err)
				}
			case <-hookReturned:
				t.Fatalf("%s() whose context ended during the Store call waited for the hanging Store call", tt.name)
			}
			want := append([]netip.Addr{<-first, <-patient}, tt.want...)
			slices.SortFunc(want, netip.Addr.Compare)
			testenv.WaitFor(t, "the store to hold only what the callers hold", func() bool {
				return slices.Equal(churntest.Stored(t, store, cidr), want) && slices.Equal(slices.Collect(p.All()), want)
			})
			if diff := cmp.Diff(want, churntest.Stored(t, store, cidr), cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
				t.Errorf("stored addresses (-want +got):\n%s", diff)
			}
		})
	}
}

// TestPersistentChurnWithDeadlinesLeaksNothing churns three allocators on one store whose writes
// often take 2 ms while every call has a 1 ms deadline, so that many callers give up while their
// write is in flight, and checks that no address is handed out twice and, once the allocators
// are idle, that the store holds exactly the addresses the callers were told they hold: every
// allocation whose caller gave up was undone.
func TestPersistentChurnWithDeadlinesLeaksNothing(t *testing.T) {
	const cidr = "10.96.0.0/24"
	store := bitmaptest.NewMemStore()
	var rngMu sync.Mutex // guards rng
	rng := rand.New(rand.NewPCG(3, 4))
	ps := make([]*bitmap.Persistent, 3)
	as := make([]allocator.Interface, len(ps))
	for i := range ps {
		ps[i] = churntest.NewPersistent(t, cidr, store, bitmap.WithBackoff(time.Microsecond, 10*time.Microsecond))
		as[i] = ps[i]
	}
	store.OnUpdate(func(context.Context, int64, bitmap.Snapshot) error {
		rngMu.Lock()
		slow := rng.IntN(4) == 0
		rngMu.Unlock()
		if slow {
			time.Sleep(2 * time.Millisecond) // ignores the context, as a hung etcd would
		}
		return nil
	})
	res := churntest.Run(t, as, churntest.Config{Calls: 100, Timeout: time.Millisecond})
	testenv.WaitFor(t, "every allocator idle", func() bool {
		return !slices.ContainsFunc(ps, func(p *bitmap.Persistent) bool { return !bitmap.Idle(p) })
	})
	store.OnUpdate(nil)
	if leaked := res.Check(t, churntest.Stored(t, store, cidr)); leaked != 0 {
		t.Errorf("%d addresses stored but held by nobody, want 0: allocations whose callers gave up were not undone", leaked)
	}
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

// TestPersistentLoserRetriesAtOnceOnTheStateThatWon checks that a batch that loses a
// compare-and-swap whose conflict brings the current state along re-applies on that state at
// once: no backoff (here an hour, which would outlast the caller's deadline) and no second read,
// however many rounds in a row it loses (up to the free retries).
func TestPersistentLoserRetriesAtOnceOnTheStateThatWon(t *testing.T) {
	const losses = 10
	store := bitmaptest.NewMemStore()
	p := churntest.NewPersistent(t, "10.96.0.0/24", store, bitmap.WithBackoff(time.Hour, time.Hour))
	taken := conflictingWriter(t, store, "10.96.0.0/24", losses)
	gets := store.Stats().Gets
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ip, err := p.AllocateNext(ctx, allocator.Owner{})
	if err != nil {
		t.Fatalf("AllocateNext() after %d conflicts = %v, want success without a backoff", losses, err)
	}
	if slices.Contains(*taken, ip.String()) {
		t.Errorf("AllocateNext() = %v, which the other writer holds", ip)
	}
	if got := store.Stats(); got.Gets != gets || got.Conflicts != losses {
		t.Errorf("store calls: %d Gets, %d conflicts; want %d Gets (no second read), %d conflicts", got.Gets, got.Conflicts, gets, losses)
	}
}

// allocateNextAsync calls p.AllocateNext without a deadline in a goroutine of its own and sends
// the address on the returned channel; an error is reported on t, prefixed with what.
func allocateNextAsync(t *testing.T, p *bitmap.Persistent, what string) <-chan netip.Addr {
	ch := make(chan netip.Addr, 1)
	go func() {
		ip, err := p.AllocateNext(context.Background(), allocator.Owner{})
		if err != nil {
			t.Errorf("%s = %v", what, err)
		}
		ch <- ip
	}()
	return ch
}

// onNthUpdate makes every Update of store call hook with its number, counting from 1, before it is
// stored, and returns a function that reports how many Updates have begun.
func onNthUpdate(store *bitmaptest.MemStore, hook func(n int)) (updates func() int) {
	var (
		mu sync.Mutex
		n  int
	)
	store.OnUpdate(func(context.Context, int64, bitmap.Snapshot) error {
		mu.Lock()
		n++
		k := n
		mu.Unlock()
		hook(k)
		return nil
	})
	return func() int {
		mu.Lock()
		defer mu.Unlock()
		return n
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
