package service_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/allocator/service"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/internal/servicematrix"
)

// matrixCluster builds in-memory bitmap allocators for a cluster shape and the service.Allocator
// over them.
type memCluster struct {
	families map[corev1.IPFamily]allocator.Interface
	ranges   []netip.Prefix
	sa       *service.Allocator
}

// newMemCluster builds cl's ranges as in-memory bitmaps behind a service.Allocator with the
// answers opts says.
func newMemCluster(t testing.TB, cl matrixCluster, opts service.Options) *memCluster {
	t.Helper()
	mc := &memCluster{families: map[corev1.IPFamily]allocator.Interface{}, ranges: clusterRanges(t, cl)}
	for _, p := range mc.ranges {
		a, err := bitmap.New(p)
		if err != nil {
			t.Fatalf("bitmap.New(%s): %v", p, err)
		}
		mc.families[a.Family()] = a
	}
	mc.sa = service.NewWithOptions(familyOfPrefix(mc.ranges[0]), mc.families, opts)
	return mc
}

// held returns every address the allocators hold, sorted.
func (mc *memCluster) held() []string {
	var out []string
	for _, a := range mc.families {
		for ip := range a.All() {
			out = append(out, ip.String())
		}
	}
	slices.Sort(out)
	return out
}

// take allocates the case's taken addresses of the families the cluster serves and returns them.
func (mc *memCluster) take(t testing.TB, ips []string) []string {
	t.Helper()
	var out []string
	for _, ip := range ips {
		a := netip.MustParseAddr(ip)
		al := mc.families[allocator.FamilyOf(a)]
		if al == nil {
			continue
		}
		if err := al.Allocate(context.Background(), a, allocator.Owner{}); err != nil {
			t.Fatalf("take %s: %v", ip, err)
		}
		out = append(out, ip)
	}
	return out
}

// wantHeld is the sorted union of extra and the addresses svc holds, in canonical form.
func wantHeld(extra []string, svc *corev1.Service) []string {
	out := slices.Clone(extra)
	if svc != nil {
		for _, ip := range servicematrix.Addrs(svc) {
			out = append(out, ip.String())
		}
	}
	slices.Sort(out)
	return out
}

func (mc *memCluster) checkHeld(t *testing.T, when string, want []string) {
	t.Helper()
	if diff := cmp.Diff(want, mc.held()); diff != "" {
		t.Errorf("%s: allocators hold (-want +got):\n%s", when, diff)
	}
}

// TestServiceAllocatorMatrix runs every case of each release's Service matrix against
// service.Allocator configured as that release, over in-memory bitmaps, for every cluster shape,
// and checks the results, the error texts of Legacy mode (whose allocators are bitmaps) where the
// release runs it, and that the allocators hold exactly what the Services hold, after Commit,
// Revert and Release. The texts of v1.37, which runs no Legacy mode, are checked through the
// IPAddressOnly allocators by test/integration/gates.
func TestServiceAllocatorMatrix(t *testing.T) {
	for _, release := range matrixReleases {
		t.Run(release, func(t *testing.T) { testAllocatorMatrix(t, release) })
	}
}

func testAllocatorMatrix(t *testing.T, release string) {
	const legacy = true
	m := loadMatrix(t, release)
	hasLegacy := hasLegacyRun(release)
	ctx := context.Background()
	opts := optionsOf(t, strings.TrimPrefix(release, "v"))
	for _, cl := range m.Clusters {
		for i, tc := range m.Cases {
			want, ok := tc.Expect[cl.Name]
			if !ok {
				t.Fatalf("%s: no expectation for cluster %s", tc.Name, cl.Name)
			}
			t.Run(cl.Name+"/"+tc.Name, func(t *testing.T) {
				name := fmt.Sprintf("m%d", i)

				// allocate builds a fresh cluster holding tc.Taken and allocates tc.Create in it.
				allocate := func(dryRun bool) (*memCluster, []string, *corev1.Service, *service.Transaction, error) {
					mc := newMemCluster(t, cl, opts)
					taken := mc.take(t, tc.Taken)
					svc := matrixService(name, tc.Create)
					txn, err := mc.sa.Allocate(ctx, svc, dryRun)
					return mc, taken, svc, txn, err
				}

				// Committed: the Service is stored, then updated, then deleted.
				mc, taken, svc, txn, err := allocate(false)
				if got := resultOf(t, tc, mc.ranges, svc, nil, err); !cmp.Equal(want.Create, got) {
					t.Fatalf("Allocate: result (-want +got):\n%s", cmp.Diff(want.Create, got))
				}
				if got := textOf(t, tc, mc.ranges, nil, err); hasLegacy && !cmp.Equal(want.CreateText.In(legacy), got) {
					t.Fatalf("Allocate: error text (-want +got):\n%s", cmp.Diff(want.CreateText.In(legacy), got))
				}
				if err != nil {
					mc.checkHeld(t, "after a failed Allocate", taken)
					return
				}
				if err := txn.Commit(ctx); err != nil {
					t.Fatalf("Commit() = %v", err)
				}
				mc.checkHeld(t, "after Allocate and Commit", wantHeld(taken, svc))
				current := svc
				if tc.Update != nil {
					if want.Update == nil {
						t.Fatalf("case has an update but no expected update result")
					}
					created := svc.DeepCopy()
					upd := created.DeepCopy()
					applySpec(upd, *tc.Update, created)
					txn, err := mc.sa.Update(ctx, created, upd, false)
					if got := resultOf(t, tc, mc.ranges, upd, created, err); !cmp.Equal(*want.Update, got) {
						t.Fatalf("Update: result (-want +got):\n%s", cmp.Diff(*want.Update, got))
					}
					if got := textOf(t, tc, mc.ranges, created, err); hasLegacy && !cmp.Equal(want.UpdateText.In(legacy), got) {
						t.Fatalf("Update: error text (-want +got):\n%s", cmp.Diff(want.UpdateText.In(legacy), got))
					}
					if err != nil {
						mc.checkHeld(t, "after a failed Update", wantHeld(taken, created))
					} else {
						if err := txn.Commit(ctx); err != nil {
							t.Fatalf("Commit() = %v", err)
						}
						mc.checkHeld(t, "after Update and Commit", wantHeld(taken, upd))
						current = upd
					}
				}
				if err := mc.sa.Release(ctx, current); err != nil {
					t.Fatalf("Release: %v", err)
				}
				mc.checkHeld(t, "after Release", taken)

				// Reverted: the store refused the Service, so nothing stays allocated.
				mc, taken, svc, txn, err = allocate(false)
				if err != nil {
					t.Fatalf("second Allocate: %v", err)
				}
				if tc.Update != nil && want.Update.Error == nil {
					if err := txn.Commit(ctx); err != nil {
						t.Fatalf("Commit() = %v", err)
					}
					created := svc.DeepCopy()
					upd := created.DeepCopy()
					applySpec(upd, *tc.Update, created)
					utxn, err := mc.sa.Update(ctx, created, upd, false)
					if err != nil {
						t.Fatalf("second Update: %v", err)
					}
					if err := utxn.Revert(ctx); err != nil {
						t.Fatalf("Revert of Update: %v", err)
					}
					mc.checkHeld(t, "after Update and Revert", wantHeld(taken, created))
				} else {
					if err := txn.Revert(ctx); err != nil {
						t.Fatalf("Revert: %v", err)
					}
					mc.checkHeld(t, "after Allocate and Revert", taken)
				}

				// Dry run: the same answer, and nothing changes.
				mc, taken, svc, txn, err = allocate(true)
				if got := resultOf(t, tc, mc.ranges, svc, nil, err); !cmp.Equal(want.Create, got) {
					t.Errorf("dry-run Allocate: result (-want +got):\n%s", cmp.Diff(want.Create, got))
				}
				if got := textOf(t, tc, mc.ranges, nil, err); hasLegacy && !cmp.Equal(want.CreateText.In(legacy), got) {
					t.Errorf("dry-run Allocate: error text (-want +got):\n%s", cmp.Diff(want.CreateText.In(legacy), got))
				}
				if err := txn.Commit(ctx); err != nil {
					t.Fatalf("Commit() = %v", err)
				}
				mc.checkHeld(t, "after a dry-run Allocate", taken)
				if tc.Update == nil {
					return
				}
				svc = matrixService(name, tc.Create)
				txn, err = mc.sa.Allocate(ctx, svc, false)
				if err != nil {
					t.Fatalf("third Allocate: %v", err)
				}
				if err := txn.Commit(ctx); err != nil {
					t.Fatalf("Commit() = %v", err)
				}
				created := svc.DeepCopy()
				upd := created.DeepCopy()
				applySpec(upd, *tc.Update, created)
				utxn, err := mc.sa.Update(ctx, created, upd, true)
				if got := resultOf(t, tc, mc.ranges, upd, created, err); !cmp.Equal(*want.Update, got) {
					t.Errorf("dry-run Update: result (-want +got):\n%s", cmp.Diff(*want.Update, got))
				}
				if got := textOf(t, tc, mc.ranges, created, err); hasLegacy && !cmp.Equal(want.UpdateText.In(legacy), got) {
					t.Errorf("dry-run Update: error text (-want +got):\n%s", cmp.Diff(want.UpdateText.In(legacy), got))
				}
				if err := utxn.Commit(ctx); err != nil {
					t.Fatalf("Commit() = %v", err)
				}
				mc.checkHeld(t, "after a dry-run Update", wantHeld(taken, created))
			})
		}
	}
}

// TestServiceAllocatorFullRangeIsInternalError checks that a family with no free address fails
// the Service with the 500 kube-apiserver returns, and that the other family's address taken
// before it is released.
func TestServiceAllocatorFullRangeIsInternalError(t *testing.T) {
	ctx := context.Background()
	v4, _ := bitmap.New(netip.MustParsePrefix("10.0.0.0/24"))
	v6, _ := bitmap.New(netip.MustParsePrefix("fd00::/126")) // 3 addresses
	for range 3 {
		if _, err := v6.AllocateNext(ctx, allocator.Owner{}); err != nil {
			t.Fatal(err)
		}
	}
	sa := newV133(t, corev1.IPv4Protocol, map[corev1.IPFamily]allocator.Interface{
		corev1.IPv4Protocol: v4, corev1.IPv6Protocol: v6})
	require := corev1.IPFamilyPolicyRequireDualStack
	svc := matrixService("full", matrixSpec{})
	svc.Spec.IPFamilyPolicy = &require
	_, err := sa.Allocate(ctx, svc, false)
	if !apierrors.IsInternalError(err) {
		t.Fatalf("Allocate() error = %v, want an InternalError", err)
	}
	if got := v4.Used(); got != 0 {
		t.Errorf("IPv4 addresses held after the failed Allocate = %d, want 0", got)
	}
}

// failingAllocator fails every allocation with err, as a storage outage would.
type failingAllocator struct {
	allocator.Interface
	err error
}

func (f failingAllocator) Allocate(context.Context, netip.Addr, allocator.Owner) error { return f.err }
func (f failingAllocator) AllocateNext(context.Context, allocator.Owner) (netip.Addr, error) {
	return netip.Addr{}, f.err
}

// TestServiceAllocatorFailureInSecondFamilyReleasesFirst checks the transaction: whatever the
// family order and whether addresses are chosen, a failure in one family leaves nothing taken in
// the other.
func TestServiceAllocatorFailureInSecondFamilyReleasesFirst(t *testing.T) {
	ctx := context.Background()
	outage := errors.New("storage unavailable")
	for _, tt := range []struct {
		name    string
		primary corev1.IPFamily
		failing corev1.IPFamily
		ips     []string
	}{
		{"v4-first/v6-fails/any", corev1.IPv4Protocol, corev1.IPv6Protocol, nil},
		{"v6-first/v4-fails/any", corev1.IPv6Protocol, corev1.IPv4Protocol, nil},
		{"v4-first/v6-fails/chosen", corev1.IPv4Protocol, corev1.IPv6Protocol, []string{"10.0.0.7", "fd00::7"}},
		{"v6-first/v4-fails/chosen", corev1.IPv6Protocol, corev1.IPv4Protocol, []string{"fd00::7", "10.0.0.7"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			v4, _ := bitmap.New(netip.MustParsePrefix("10.0.0.0/24"))
			v6, _ := bitmap.New(netip.MustParsePrefix("fd00::/112"))
			fams := map[corev1.IPFamily]allocator.Interface{corev1.IPv4Protocol: v4, corev1.IPv6Protocol: v6}
			healthy := fams[otherFamilyOf(tt.failing)]
			fams[tt.failing] = failingAllocator{Interface: fams[tt.failing], err: outage}
			sa := newV133(t, tt.primary, fams)
			require := corev1.IPFamilyPolicyRequireDualStack
			svc := matrixService("txn", matrixSpec{})
			svc.Spec.IPFamilyPolicy = &require
			if tt.ips != nil {
				svc.Spec.ClusterIP, svc.Spec.ClusterIPs = tt.ips[0], tt.ips
			}
			if _, err := sa.Allocate(ctx, svc, false); err == nil {
				t.Fatal("Allocate() succeeded with a failing family")
			}
			if got := healthy.Used(); got != 0 {
				t.Errorf("%s addresses held after the failed Allocate = %d, want 0", healthy.Family(), got)
			}
		})
	}
}

func otherFamilyOf(f corev1.IPFamily) corev1.IPFamily {
	if f == corev1.IPv4Protocol {
		return corev1.IPv6Protocol
	}
	return corev1.IPv4Protocol
}
