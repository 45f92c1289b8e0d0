package service_test

import (
	"context"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/allocator/service"
)

// ctxBound is an allocator whose Release fails once its context is done, as an API call does,
// and records the deadline each Release had.
type ctxBound struct {
	allocator.Interface
	mu        sync.Mutex
	deadlines []bool // per Release: whether its context had a deadline
}

func (c *ctxBound) Release(ctx context.Context, ip netip.Addr) error {
	_, ok := ctx.Deadline()
	c.mu.Lock()
	c.deadlines = append(c.deadlines, ok)
	c.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	return c.Interface.Release(ctx, ip)
}

// stalled is an allocator whose allocations wait for the caller's context to end and then fail
// with its error, as an API call past the caller's deadline does.
type stalled struct{ allocator.Interface }

func (s stalled) Allocate(ctx context.Context, _ netip.Addr, _ allocator.Owner) error {
	<-ctx.Done()
	return ctx.Err()
}

func (s stalled) AllocateNext(ctx context.Context, _ allocator.Owner) (netip.Addr, error) {
	<-ctx.Done()
	return netip.Addr{}, ctx.Err()
}

// TestServiceAllocatorUndoOutlivesCallersContext checks that the releases that undo a failed or
// reverted call, and those Commit makes, run with a context of their own, bounded by
// allocator.UndoTimeout: a caller whose deadline ran out while the second family was being
// allocated does not leave the first family's address taken, and a caller whose request ended
// after the Service was stored still frees what its update dropped.
func TestServiceAllocatorUndoOutlivesCallersContext(t *testing.T) {
	require := corev1.IPFamilyPolicyRequireDualStack
	newCluster := func(t *testing.T, stallV6 bool) (*ctxBound, *service.Allocator) {
		v4 := &ctxBound{Interface: mustBitmap(t, "10.0.0.0/24")}
		var v6 allocator.Interface = mustBitmap(t, "fd00::/112")
		if stallV6 {
			v6 = stalled{v6}
		}
		return v4, newV133(t, corev1.IPv4Protocol, map[corev1.IPFamily]allocator.Interface{
			corev1.IPv4Protocol: v4, corev1.IPv6Protocol: v6})
	}
	dual := func() *corev1.Service {
		svc := matrixService("undo", matrixSpec{})
		svc.Spec.IPFamilyPolicy = &require
		return svc
	}

	t.Run("the caller's deadline passes in the second family", func(t *testing.T) {
		v4, sa := newCluster(t, true)
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if _, err := sa.Allocate(ctx, dual(), false); err == nil {
			t.Fatal("Allocate() succeeded with a stalled family")
		}
		if got := v4.Used(); got != 0 {
			t.Errorf("IPv4 addresses held after the failed Allocate = %d, want 0", got)
		}
	})

	t.Run("Revert with a cancelled context", func(t *testing.T) {
		v4, sa := newCluster(t, false)
		ctx, cancel := context.WithCancel(context.Background())
		txn, err := sa.Allocate(ctx, dual(), false)
		if err != nil {
			t.Fatal(err)
		}
		cancel()
		if err := txn.Revert(ctx); err != nil {
			t.Errorf("Revert() = %v, want nil", err)
		}
		if got := v4.Used(); got != 0 {
			t.Errorf("IPv4 addresses held after Revert = %d, want 0", got)
		}
	})

	t.Run("Commit's releases are bounded", func(t *testing.T) {
		v4, sa := newCluster(t, false)
		ctx := context.Background()
		svc := dual()
		txn, err := sa.Allocate(ctx, svc, false)
		if err != nil {
			t.Fatal(err)
		}
		if err := txn.Commit(ctx); err != nil {
			t.Fatalf("Commit() = %v", err)
		}
		upd := svc.DeepCopy()
		upd.Spec.Type = corev1.ServiceTypeExternalName
		upd.Spec.ExternalName = "example.com"
		utxn, err := sa.Update(ctx, svc, upd, false)
		if err != nil {
			t.Fatal(err)
		}
		if err := utxn.Commit(ctx); err != nil {
			t.Fatalf("Commit() = %v", err)
		}
		if got := v4.Used(); got != 0 {
			t.Errorf("IPv4 addresses held after Commit = %d, want 0", got)
		}
		v4.mu.Lock()
		defer v4.mu.Unlock()
		for i, ok := range v4.deadlines {
			if !ok {
				t.Errorf("Release %d of Commit ran without a deadline", i)
			}
		}
	})

	t.Run("Commit with a cancelled context", func(t *testing.T) {
		v4, sa := newCluster(t, false)
		ctx, cancel := context.WithCancel(context.Background())
		svc := dual()
		txn, err := sa.Allocate(ctx, svc, false)
		if err != nil {
			t.Fatal(err)
		}
		if err := txn.Commit(ctx); err != nil {
			t.Fatalf("Commit() = %v", err)
		}
		upd := svc.DeepCopy()
		upd.Spec.Type = corev1.ServiceTypeExternalName
		upd.Spec.ExternalName = "example.com"
		utxn, err := sa.Update(ctx, svc, upd, false)
		if err != nil {
			t.Fatal(err)
		}
		cancel() // the registry stored the update, then its request ended
		if err := utxn.Commit(ctx); err != nil {
			t.Errorf("Commit() = %v, want nil", err)
		}
		if got := v4.Used(); got != 0 {
			t.Errorf("IPv4 addresses held after Commit = %d, want 0", got)
		}
		if err := utxn.Commit(ctx); err != nil {
			t.Errorf("second Commit() = %v, want nil", err)
		}
	})

	if allocator.UndoTimeout <= 0 {
		t.Errorf("UndoTimeout = %v, want > 0", allocator.UndoTimeout)
	}
}

// TestServiceAllocatorUpdateOfServiceWithoutClusterIPs checks that an update of a stored Service
// that has ipFamilies but no clusterIPs (written by an older or foreign writer) is answered with
// a 422 and takes nothing, where it used to index past the end of clusterIPs. kube-apiserver
// v1.33 indexes past the end too and answers with a panic, no Status
// (TestServiceUpdateWithoutClusterIPsKubeAPIServer), so the 422 uses its words for an update that
// leaves a Service without its primary address.
func TestServiceAllocatorUpdateOfServiceWithoutClusterIPs(t *testing.T) {
	ctx := context.Background()
	single := corev1.IPFamilyPolicySingleStack
	require := corev1.IPFamilyPolicyRequireDualStack
	mc := newMemCluster(t, matrixCluster{Name: "dual", Ranges: []string{"10.96.0.0/16", "fd00:10:96::/112"}}, optionsOf(t, "1.33.13"))
	old := matrixService("bare", matrixSpec{})
	old.Spec.IPFamilyPolicy = &single
	old.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol}
	upd := old.DeepCopy()
	upd.Spec.IPFamilyPolicy = &require
	upd.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	var err error
	func() {
		defer func() {
			if p := recover(); p != nil {
				t.Fatalf("Update() panicked: %v", p)
			}
		}()
		_, err = mc.sa.Update(ctx, old, upd, false)
	}()
	want := statusOf{Code: 422, Reason: metav1.StatusReasonInvalid,
		Message: `Service "bare" is invalid: spec.clusterIPs[0]: Invalid value: []string(nil): primary clusterIP can not be unset`,
		Causes:  []metav1.StatusCause{invalid("spec.clusterIPs[0]", `Invalid value: []string(nil): primary clusterIP can not be unset`)}}
	if diff := cmp.Diff(want, statusOfErr(t, err)); diff != "" {
		t.Errorf("Update() status (-want +got):\n%s", diff)
	}
	mc.checkHeld(t, "after the failed Update", nil)
}
