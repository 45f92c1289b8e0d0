package bitmap_test

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/bitmaptest"
	"github.com/kube-ipam/clusterip/bitmap/internal/churntest"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

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
