package allocatortest

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"sync"
	"testing"

	"github.com/kube-ipam/clusterip/allocator"
)

// The helpers below are the checks the suite is made of, exported so that a fork's own tests
// (of a multi-CIDR allocator, a contention scenario, a fixture of its own) can say the same
// things in the same words.

// Fill calls a.AllocateNext(ctx, owner) until it returns [allocator.ErrFull] and returns the
// addresses it got, in order. It fails t at once on any other error, on an address returned
// twice, and when a hands out more addresses than a.Used()+a.Free() said it could at the start.
func Fill(t testing.TB, ctx context.Context, a allocator.Interface, owner allocator.Owner) []netip.Addr {
	t.Helper()
	limit := a.Used() + a.Free()
	seen := map[netip.Addr]bool{}
	var got []netip.Addr
	for {
		ip, err := a.AllocateNext(ctx, owner)
		if errors.Is(err, allocator.ErrFull) {
			return got
		}
		if err != nil {
			t.Fatalf("AllocateNext() after %d addresses = %v", len(got), err)
		}
		if seen[ip] {
			t.Fatalf("AllocateNext() = %v twice", ip)
		}
		seen[ip] = true
		got = append(got, ip)
		if uint64(len(got)) > limit {
			t.Fatalf("AllocateNext() gave %d addresses without ErrFull, more than Used()+Free() = %d", len(got), limit)
		}
	}
}

// CheckCounts reports on t unless a.Used() is used and a.Free() is free.
func CheckCounts(t testing.TB, a allocator.Interface, used, free uint64) {
	t.Helper()
	if got := a.Used(); got != used {
		t.Errorf("Used() = %d, want %d", got, used)
	}
	if got := a.Free(); got != free {
		t.Errorf("Free() = %d, want %d", got, free)
	}
}

// ExactlyOneWinner calls Allocate(ctx, ip, owner) on each of as at the same moment, one
// goroutine each (pass one allocator several times to race it with itself, or several that
// share their state), and reports on t unless exactly one call returned nil and every other
// returned an error matching [allocator.ErrAllocated]. It returns the index in as of the winner,
// or -1 if there was none.
func ExactlyOneWinner(t testing.TB, ctx context.Context, ip netip.Addr, owner allocator.Owner, as ...allocator.Interface) int {
	t.Helper()
	errs := make([]error, len(as))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, a := range as {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs[i] = a.Allocate(ctx, ip, owner)
		}()
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		if err != nil && !errors.Is(err, allocator.ErrAllocated) {
			t.Errorf("Allocate(%v) = %v, want nil or ErrAllocated", ip, err)
		}
	}
	wins := 0
	for _, err := range errs {
		if err == nil {
			wins++
		}
	}
	if wins != 1 {
		t.Errorf("%d of %d concurrent Allocate(%v) calls succeeded, want exactly 1", wins, len(as), ip)
	}
	return slices.IndexFunc(errs, func(err error) bool { return err == nil })
}
