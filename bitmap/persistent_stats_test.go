package bitmap_test

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/bitmaptest"
	"github.com/kube-ipam/clusterip/bitmap/internal/churntest"
)

func TestPersistentStatsCountCommitsAndConflicts(t *testing.T) {
	const cidr = "10.96.0.0/24"
	fast := bitmap.WithBackoff(time.Microsecond, time.Microsecond)
	ip := netip.MustParseAddr("10.96.0.200")
	tests := []struct {
		name string
		// run does its operations on p, whose store is store, and returns the error of the last.
		run  func(t *testing.T, p *bitmap.Persistent, store *bitmaptest.MemStore) error
		opts []bitmap.PersistentOption
		want bitmap.PersistentStats
		// wantErr is the error the last operation must match; nil for success.
		wantErr error
	}{{
		name: "nothing done",
		run:  func(*testing.T, *bitmap.Persistent, *bitmaptest.MemStore) error { return nil },
		want: bitmap.PersistentStats{},
	}, {
		name: "one allocation, no other writer",
		run: func(_ *testing.T, p *bitmap.Persistent, _ *bitmaptest.MemStore) error {
			_, err := p.AllocateNext(context.Background(), allocator.Owner{})
			return err
		},
		want: bitmap.PersistentStats{Batches: 1, Writes: 1},
	}, {
		name: "an allocation already held needs no write",
		run: func(_ *testing.T, p *bitmap.Persistent, _ *bitmaptest.MemStore) error {
			if err := p.Allocate(context.Background(), ip, allocator.Owner{}); err != nil {
				return err
			}
			return p.Allocate(context.Background(), ip, allocator.Owner{})
		},
		want:    bitmap.PersistentStats{Batches: 2, Writes: 1},
		wantErr: allocator.ErrAllocated,
	}, {
		name: "another Persistent on the store wrote first",
		run: func(t *testing.T, p *bitmap.Persistent, store *bitmaptest.MemStore) error {
			other := churntest.NewPersistent(t, cidr, store)
			if err := other.Allocate(context.Background(), ip, allocator.Owner{}); err != nil {
				t.Fatalf("other.Allocate(%v) = %v", ip, err)
			}
			_, err := p.AllocateNext(context.Background(), allocator.Owner{})
			return err
		},
		want: bitmap.PersistentStats{Batches: 1, Writes: 1, Conflicts: 1, Retries: 1},
	}, {
		name: "three conflicting writes, then success",
		run: func(t *testing.T, p *bitmap.Persistent, store *bitmaptest.MemStore) error {
			conflictingWriter(t, store, cidr, 3)
			_, err := p.AllocateNext(context.Background(), allocator.Owner{})
			return err
		},
		opts: []bitmap.PersistentOption{fast},
		want: bitmap.PersistentStats{Batches: 1, Writes: 1, Conflicts: 3, Retries: 3},
	}, {
		name: "gives up after max attempts: the last conflict is not retried",
		run: func(t *testing.T, p *bitmap.Persistent, store *bitmaptest.MemStore) error {
			conflictingWriter(t, store, cidr, 1000)
			_, err := p.AllocateNext(context.Background(), allocator.Owner{})
			return err
		},
		opts:    []bitmap.PersistentOption{fast, bitmap.WithMaxAttempts(3)},
		want:    bitmap.PersistentStats{Batches: 1, Conflicts: 3, Retries: 2},
		wantErr: bitmap.ErrConflict,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			store := bitmaptest.NewMemStore()
			p := churntest.NewPersistent(t, cidr, store, tt.opts...)
			err := tt.run(t, p, store)
			if (tt.wantErr == nil && err != nil) || (tt.wantErr != nil && !errors.Is(err, tt.wantErr)) {
				t.Fatalf("last operation = %v, want %v", err, tt.wantErr)
			}
			if diff := cmp.Diff(tt.want, p.Stats()); diff != "" {
				t.Errorf("Stats() (-want +got):\n%s", diff)
			}
		})
	}
}
