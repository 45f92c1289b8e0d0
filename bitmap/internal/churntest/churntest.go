// Package churntest drives allocators that share one store with concurrent AllocateNext and
// Release calls and checks the outcome against what every caller was told: no address held by two
// callers, every held address stored, and nothing else stored but the addresses of writes whose
// outcome was reported as unknown (bitmap.ErrOutcomeUnknown: a possible leak, never a duplicate).
// It also holds the helpers the tests of bitmap and bitmap/etcdstore share: [NewPersistent] and
// [Stored].
package churntest

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
)

// Config says how to churn. The zero Config runs 4 workers per allocator, 100 calls each.
type Config struct {
	// WorkersEach is the number of goroutines per allocator. Defaults to 4.
	WorkersEach int
	// Calls is the number of calls per worker. Defaults to 100; ignored if Stop is set.
	Calls int
	// MaxHeld is the most addresses a worker holds at once. Defaults to 6.
	MaxHeld int
	// Timeout bounds each call. Defaults to none.
	Timeout time.Duration
	// Stop, if not nil, makes the workers run until it is closed instead of Calls calls.
	Stop <-chan struct{}
	// After, if not nil, is called with the error of every call.
	After func(error)
}

// Result is what the callers of a run were told.
type Result struct {
	mu      sync.Mutex
	held    map[netip.Addr]int // address → the worker told it holds it
	limbo   map[netip.Addr]bool
	unknown int // AllocateNext calls that failed with ErrOutcomeUnknown
	ok      int
	failed  int
}

// Run runs cfg.WorkersEach workers per allocator. Each calls AllocateNext or Release at random,
// holding at most cfg.MaxHeld addresses. A Release that fails keeps the address held (an error
// without ErrOutcomeUnknown means nothing was stored), unless its outcome is unknown: then the
// address is in limbo, freed or not. Duplicates are reported on t as they happen.
func Run(t testing.TB, as []allocator.Interface, cfg Config) *Result {
	if cfg.WorkersEach <= 0 {
		cfg.WorkersEach = 4
	}
	if cfg.Calls <= 0 {
		cfg.Calls = 100
	}
	if cfg.MaxHeld <= 0 {
		cfg.MaxHeld = 6
	}
	r := &Result{held: map[netip.Addr]int{}, limbo: map[netip.Addr]bool{}}
	var wg sync.WaitGroup
	for w := range len(as) * cfg.WorkersEach {
		a := as[w%len(as)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.work(t, a, w, cfg)
		}()
	}
	wg.Wait()
	return r
}

func (r *Result) work(t testing.TB, a allocator.Interface, w int, cfg Config) {
	rng := rand.New(rand.NewPCG(uint64(w), 3))
	var mine []netip.Addr
	for n := 0; ; n++ {
		if cfg.Stop == nil && n == cfg.Calls {
			return
		}
		if cfg.Stop != nil {
			select {
			case <-cfg.Stop:
				return
			default:
			}
		}
		ctx, cancel := context.Background(), context.CancelFunc(func() {})
		if cfg.Timeout > 0 {
			ctx, cancel = context.WithTimeout(ctx, cfg.Timeout)
		}
		var err error
		if len(mine) == 0 || (len(mine) < cfg.MaxHeld && rng.IntN(2) == 0) {
			var ip netip.Addr
			ip, err = a.AllocateNext(ctx, allocator.Owner{})
			r.mu.Lock()
			switch {
			case err == nil:
				if other, dup := r.held[ip]; dup {
					t.Errorf("%v handed to worker %d while worker %d holds it", ip, w, other)
				}
				r.held[ip] = w
				delete(r.limbo, ip)
				mine = append(mine, ip)
			case errors.Is(err, bitmap.ErrOutcomeUnknown):
				r.unknown++
			}
		} else {
			i := rng.IntN(len(mine))
			ip := mine[i]
			r.mu.Lock()
			delete(r.held, ip) // a caller gives up its claim before it releases
			r.mu.Unlock()
			err = a.Release(ctx, ip)
			r.mu.Lock()
			switch {
			case err == nil:
				mine = slices.Delete(mine, i, i+1)
			case errors.Is(err, bitmap.ErrOutcomeUnknown):
				mine = slices.Delete(mine, i, i+1)
				r.limbo[ip] = true
			default: // nothing was stored: still ours, unless it was handed out meanwhile
				if other, dup := r.held[ip]; dup {
					t.Errorf("%v handed to worker %d while worker %d, whose Release of it failed, holds it", ip, other, w)
				}
				r.held[ip] = w
			}
		}
		if err == nil {
			r.ok++
		} else {
			r.failed++
		}
		r.mu.Unlock()
		cancel()
		if cfg.After != nil {
			cfg.After(err)
		}
	}
}

// Check compares the stored addresses with what the callers were told and reports on t every
// held address that is not stored, and stored addresses held by nobody beyond the number of
// allocations with an unknown outcome. It returns the number of such leaked addresses.
func (r *Result) Check(t testing.TB, stored []netip.Addr) (leaked int) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for ip, w := range r.held {
		if !slices.Contains(stored, ip) {
			t.Errorf("%v is held by worker %d but not stored: lost", ip, w)
		}
	}
	var extra []netip.Addr
	for _, ip := range stored {
		if _, ok := r.held[ip]; !ok && !r.limbo[ip] {
			extra = append(extra, ip)
		}
	}
	if len(extra) > r.unknown {
		t.Errorf("stored but held by nobody: %v; only %d allocations had an unknown outcome", extra, r.unknown)
	}
	t.Logf("calls ok %d, failed %d; held %d, stored %d; unknown outcomes: %d allocations, %d releases; leaked %d",
		r.ok, r.failed, len(r.held), len(stored), r.unknown, len(r.limbo), len(extra))
	return len(extra)
}

// NewPersistent returns a Persistent allocator of cidr over store, built within 30 s, and closes
// it when t ends. It fails t if NewPersistent fails.
func NewPersistent(t testing.TB, cidr string, store bitmap.Store, opts ...bitmap.PersistentOption) *bitmap.Persistent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := bitmap.NewPersistent(ctx, netip.MustParsePrefix(cidr), store, opts...)
	if err != nil {
		t.Fatalf("NewPersistent(%s) = %v", cidr, err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// Stored reads store within 30 s and returns the addresses of cidr its snapshot holds, in
// ascending order, read through a fresh in-memory allocator. It fails t if the store holds
// nothing or cannot be read.
func Stored(t testing.TB, store bitmap.Store, cidr string) []netip.Addr {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, rev, err := bitmap.Load(ctx, store, netip.MustParsePrefix(cidr))
	if err != nil || rev == 0 {
		t.Fatalf("bitmap.Load() = rev %d, %v", rev, err)
	}
	return slices.Collect(a.All())
}
