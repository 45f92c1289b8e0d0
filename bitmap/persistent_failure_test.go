package bitmap_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/bitmaptest"
	"github.com/kube-ipam/clusterip/bitmap/internal/churntest"
)

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
