package bitmap_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/bitmaptest"
	"github.com/kube-ipam/clusterip/bitmap/internal/churntest"
)

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
