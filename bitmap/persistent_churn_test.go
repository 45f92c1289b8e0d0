package bitmap_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/bitmaptest"
	"github.com/kube-ipam/clusterip/bitmap/internal/churntest"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

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
