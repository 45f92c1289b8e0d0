package service_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/allocator/service"
)

// TestServiceAllocatorHoldsExactlyLiveServices applies random creates, updates, deletes and
// reverted calls, drawn from the matrix's specs, to one cluster of each shape and checks after
// every step that the allocators hold exactly the addresses of the stored Services and that no
// two Services share one. With flaky allocators one allocation in four fails, so every failure
// path of a transaction across two families is taken.
func TestServiceAllocatorHoldsExactlyLiveServices(t *testing.T) {
	inputs := matrixInputs()
	steps := 800 // each step scans both allocators, so keep the walk short
	if testing.Short() {
		steps = 200
	}
	for _, flaky := range []bool{false, true} {
		for _, cl := range matrixClusters {
			t.Run(fmt.Sprintf("%s/flaky=%v", cl.Name, flaky), func(t *testing.T) {
				checkHoldsExactlyLiveServices(t, cl, inputs, steps, flaky)
			})
		}
	}
}

// flakyAllocator fails one allocation in four, as a storage outage would; Release never fails.
type flakyAllocator struct {
	allocator.Interface
	rng *rand.Rand
}

var errFlaky = errors.New("injected storage failure")

func (f flakyAllocator) Allocate(ctx context.Context, ip netip.Addr, o allocator.Owner) error {
	if f.rng.IntN(4) == 0 {
		return errFlaky
	}
	return f.Interface.Allocate(ctx, ip, o)
}

func (f flakyAllocator) AllocateNext(ctx context.Context, o allocator.Owner) (netip.Addr, error) {
	if f.rng.IntN(4) == 0 {
		return netip.Addr{}, errFlaky
	}
	return f.Interface.AllocateNext(ctx, o)
}

func checkHoldsExactlyLiveServices(t *testing.T, cl matrixCluster, inputs []matrixCase, steps int, flaky bool) {
	ctx := context.Background()
	h := fnv.New64a()
	h.Write([]byte(cl.Name))
	rng := rand.New(rand.NewPCG(1, h.Sum64()))
	mc := newMemCluster(t, cl, optionsOf(t, "1.33.13"))
	if flaky {
		fams := map[corev1.IPFamily]allocator.Interface{}
		for f, a := range mc.families {
			fams[f] = flakyAllocator{Interface: a, rng: rng}
		}
		mc.sa = newV133(t, familyOfPrefix(mc.ranges[0]), fams)
	}
	live := map[string]*corev1.Service{}
	var names []string
	failures := 0
	// settle counts a failed call and commits a successful one or, one time in five, reverts it,
	// as a registry does when storing the Service succeeds or fails. It reports whether the
	// Service is stored.
	settle := func(step int, txn *service.Transaction, err error) bool {
		if err != nil {
			failures++
			return false
		}
		if rng.IntN(5) == 0 {
			if err := txn.Revert(ctx); err != nil {
				t.Fatalf("step %d: Revert: %v", step, err)
			}
			return false
		}
		if err := txn.Commit(ctx); err != nil {
			t.Fatalf("Commit() = %v", err)
		}
		return true
	}
	for step := range steps {
		tc := inputs[rng.IntN(len(inputs))]
		switch op := rng.IntN(10); {
		case op < 6: // create, committed or (1 in 5) reverted
			name := fmt.Sprintf("s%d", step)
			svc := matrixService(name, tc.Create)
			if txn, err := mc.sa.Allocate(ctx, svc, false); !settle(step, txn, err) {
				break
			}
			live[name] = svc
			names = append(names, name)
		case op < 8 && len(names) > 0 && tc.Update != nil: // update
			name := names[rng.IntN(len(names))]
			old := live[name]
			upd := old.DeepCopy()
			applySpec(upd, *tc.Update, old)
			if txn, err := mc.sa.Update(ctx, old.DeepCopy(), upd, false); !settle(step, txn, err) {
				break
			}
			live[name] = upd
		case op == 9 && len(names) > 0: // delete
			i := rng.IntN(len(names))
			if err := mc.sa.Release(ctx, live[names[i]]); err != nil {
				t.Fatalf("step %d: Release: %v", step, err)
			}
			delete(live, names[i])
			names = slices.Delete(names, i, i+1)
		}
		var want []string
		for _, svc := range live {
			want = wantHeld(want, svc)
		}
		if dup := duplicate(want); dup != "" {
			t.Fatalf("step %d (%s): %s is held by two Services", step, tc.Name, dup)
		}
		if diff := cmp.Diff(want, mc.held()); diff != "" {
			t.Fatalf("step %d (%s): allocators hold (-want +got):\n%s", step, tc.Name, diff)
		}
	}
	if len(live) == 0 || failures == 0 {
		t.Fatalf("%d Services live and %d failed calls after %d steps: the walk exercised too little", len(live), failures, steps)
	}
	t.Logf("%d steps: %d Services live, %d failed calls", steps, len(live), failures)
}

// duplicate returns an entry that appears twice in the sorted list s, or "".
func duplicate(s []string) string {
	for i := 1; i < len(s); i++ {
		if s[i] == s[i-1] {
			return s[i]
		}
	}
	return ""
}
