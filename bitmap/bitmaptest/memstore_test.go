package bitmaptest_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/bitmaptest"
)

func TestMemStoreCompareAndSwap(t *testing.T) {
	ctx := context.Background()
	var m bitmaptest.MemStore // the zero MemStore is ready to use
	if s, rev, err := m.Get(ctx); err != nil || rev != 0 || s.Range != "" {
		t.Fatalf("empty Get() = %+v, %d, %v; want zero, 0, nil", s, rev, err)
	}
	s1 := bitmap.Snapshot{Range: "10.96.0.0/24", Data: []byte{1}}
	rev1, err := m.Update(ctx, 0, s1)
	if err != nil || rev1 <= 0 {
		t.Fatalf("create Update(0) = %d, %v", rev1, err)
	}
	s1.Data[0] = 0xff // the store keeps its own copy
	if _, err := m.Update(ctx, 0, s1); !errors.Is(err, bitmap.ErrConflict) {
		t.Errorf("second create = %v, want ErrConflict", err)
	}
	s2 := bitmap.Snapshot{Range: "10.96.0.0/24", Data: []byte{3}}
	rev2, err := m.Update(ctx, rev1, s2)
	if err != nil || rev2 <= rev1 {
		t.Fatalf("Update(rev1) = %d, %v; want a higher revision", rev2, err)
	}
	_, err = m.Update(ctx, rev1, s1)
	var ce *bitmap.ConflictError
	if !errors.As(err, &ce) {
		t.Fatalf("stale Update() = %v, want *ConflictError", err)
	}
	if diff := cmp.Diff(s2, ce.Current); diff != "" || ce.Rev != rev2 {
		t.Errorf("conflict carries rev %d (want %d), snapshot (-want +got):\n%s", ce.Rev, rev2, diff)
	}
	got, rev, err := m.Get(ctx)
	if err != nil || rev != rev2 {
		t.Fatalf("Get() = rev %d, %v; want %d", rev, err, rev2)
	}
	got.Data[0] = 0xff // and hands out copies
	if again, _, _ := m.Get(ctx); again.Data[0] != 3 {
		t.Errorf("Get() returned the store's own slice")
	}
	m.Delete()
	if _, rev, _ := m.Get(ctx); rev != 0 {
		t.Errorf("Get() after Delete = rev %d, want 0", rev)
	}
	rev3, err := m.Update(ctx, 0, s2)
	if err != nil || rev3 <= rev2 {
		t.Errorf("create after Delete = %d, %v; want a revision above %d", rev3, err, rev2)
	}
	if st := m.Stats(); st != (bitmaptest.MemStoreStats{Gets: 4, Updates: 5, Conflicts: 2}) {
		t.Errorf("Stats() = %+v", st)
	}
}

func TestMemStoreHooks(t *testing.T) {
	ctx := context.Background()
	m := bitmaptest.NewMemStore()
	boom := errors.New("boom")
	m.OnGet(func(context.Context) error { return boom })
	if _, _, err := m.Get(ctx); !errors.Is(err, boom) {
		t.Errorf("Get() with failing hook = %v, want boom", err)
	}
	m.OnGet(nil)
	m.OnUpdate(func(context.Context, int64, bitmap.Snapshot) error { return boom })
	if _, err := m.Update(ctx, 0, bitmap.Snapshot{Range: "10.0.0.0/24"}); !errors.Is(err, boom) {
		t.Errorf("Update() with failing hook = %v, want boom", err)
	}
	if _, rev, _ := m.Get(ctx); rev != 0 {
		t.Errorf("a failing OnUpdate hook stored something (rev %d)", rev)
	}
	m.OnUpdate(nil)
	m.OnUpdated(func(context.Context, int64) error { return boom })
	if _, err := m.Update(ctx, 0, bitmap.Snapshot{Range: "10.0.0.0/24"}); !errors.Is(err, boom) {
		t.Errorf("Update() with failing OnUpdated hook = %v, want boom", err)
	}
	if _, rev, _ := m.Get(ctx); rev == 0 {
		t.Errorf("a failing OnUpdated hook must leave the write stored (a lost response)")
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, _, err := m.Get(cctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Get(canceled) = %v, want Canceled", err)
	}
}

func TestMemStoreConcurrentCASHasOneWinnerPerRevision(t *testing.T) {
	ctx := context.Background()
	m := bitmaptest.NewMemStore()
	rev, _ := m.Update(ctx, 0, bitmap.Snapshot{Range: "10.0.0.0/24"})
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		wins int
	)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := m.Update(ctx, rev, bitmap.Snapshot{Range: "10.0.0.0/24", Data: []byte{1}}); err == nil {
				mu.Lock()
				wins++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if wins != 1 {
		t.Errorf("%d concurrent Update(rev) succeeded, want 1", wins)
	}
}
