package allocator_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
)

// TestServiceAllocatorHoldsExactlyLiveServices applies random creates, updates, deletes and
// reverted calls, drawn from the matrix's specs, to one cluster of each shape and checks after
// every step that the allocators hold exactly the addresses of the stored Services and that no
// two Services share one.
func TestServiceAllocatorHoldsExactlyLiveServices(t *testing.T) {
	ctx := context.Background()
	inputs := matrixInputs()
	steps := 3000
	if testing.Short() {
		steps = 500
	}
	for _, cl := range matrixClusters {
		t.Run(cl.Name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(len(cl.Name))))
			mc := newMemCluster(t, cl)
			live := map[string]*corev1.Service{}
			var names []string
			for step := range steps {
				tc := inputs[rng.IntN(len(inputs))]
				switch op := rng.IntN(10); {
				case op < 5: // create, committed or (1 in 5) reverted
					name := fmt.Sprintf("s%d", step)
					svc := matrixService(name, tc.Create)
					txn, err := mc.sa.Allocate(ctx, svc, false)
					if err != nil {
						break
					}
					if rng.IntN(5) == 0 {
						if err := txn.Revert(ctx); err != nil {
							t.Fatalf("step %d: Revert: %v", step, err)
						}
						break
					}
					txn.Commit()
					live[name] = svc
					names = append(names, name)
				case op < 8 && len(names) > 0 && tc.Update != nil: // update
					name := names[rng.IntN(len(names))]
					old := live[name]
					upd := old.DeepCopy()
					applySpec(upd, *tc.Update, old)
					txn, err := mc.sa.Update(ctx, old.DeepCopy(), upd, false)
					if err != nil {
						break
					}
					if rng.IntN(5) == 0 {
						if err := txn.Revert(ctx); err != nil {
							t.Fatalf("step %d: Revert: %v", step, err)
						}
						break
					}
					txn.Commit()
					live[name] = upd
				case len(names) > 0: // delete
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
		})
	}
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
