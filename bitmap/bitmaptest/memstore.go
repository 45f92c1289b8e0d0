package bitmaptest

import (
	"bytes"
	"context"
	"fmt"
	"sync"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
)

var _ bitmap.Store = (*MemStore)(nil)

// MemStoreStats counts the calls a MemStore has served.
type MemStoreStats struct {
	// Gets is the number of Get calls.
	Gets int
	// Updates is the number of Update calls, successful or not, that reached the compare-and-swap
	// (an error returned by an OnUpdate hook is not counted).
	Updates int
	// Conflicts is the number of those Update calls that failed with a conflict.
	Conflicts int
}

// MemStore is a bitmap.Store in memory, for tests. It copies snapshots in and out, so callers may reuse
// their slices. Hooks let a test inject conflicts, errors, delays and lost responses.
//
// The zero MemStore is empty (nothing stored, revision 0) and ready to use. A MemStore is safe for
// concurrent use.
type MemStore struct {
	mu        sync.Mutex // guards every field below
	snap      bitmap.Snapshot
	rev       int64
	lastRev   int64 // highest revision ever handed out; revisions never go back, even after Delete
	stats     MemStoreStats
	onGet     func(ctx context.Context) error
	onUpdate  func(ctx context.Context, rev int64, s bitmap.Snapshot) error
	onUpdated func(ctx context.Context, newRev int64) error
}

// NewMemStore returns an empty MemStore.
func NewMemStore() *MemStore { return &MemStore{} }

// errNilMemStore is what Get and Update of a nil *MemStore return: it matches allocator.ErrInvalid,
// so bitmap.NewPersistent over one fails instead of panicking.
var errNilMemStore = fmt.Errorf("%w: bitmaptest: nil *MemStore", allocator.ErrInvalid)

// Get returns a copy of the stored snapshot and its revision, or the zero bitmap.Snapshot and 0 if
// nothing is stored. If an OnGet hook returns an error, Get returns that error. Get of a nil
// *MemStore returns an error matching allocator.ErrInvalid.
func (m *MemStore) Get(ctx context.Context) (bitmap.Snapshot, int64, error) {
	if m == nil {
		return bitmap.Snapshot{}, 0, errNilMemStore
	}
	m.mu.Lock()
	hook := m.onGet
	m.mu.Unlock()
	if hook != nil {
		if err := hook(ctx); err != nil {
			return bitmap.Snapshot{}, 0, err
		}
	}
	if err := ctx.Err(); err != nil {
		return bitmap.Snapshot{}, 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stats.Gets++
	return cloneSnapshot(m.snap), m.rev, nil
}

// Update stores a copy of s if the stored revision is rev (0: only if nothing is stored) and
// returns the new revision; otherwise it returns a *bitmap.ConflictError that carries what is stored.
//
// An OnUpdate hook runs first, without the store's lock held (so it may call Put or Delete to
// simulate another writer); if it returns an error, Update returns that error and stores nothing.
// An OnUpdated hook runs after a successful store; if it returns an error, Update returns that
// error although the snapshot stays stored, like a write whose response was lost.
func (m *MemStore) Update(ctx context.Context, rev int64, s bitmap.Snapshot) (int64, error) {
	if m == nil {
		return 0, errNilMemStore
	}
	m.mu.Lock()
	hook := m.onUpdate
	m.mu.Unlock()
	if hook != nil {
		if err := hook(ctx, rev, cloneSnapshot(s)); err != nil {
			return 0, err
		}
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	m.mu.Lock()
	m.stats.Updates++
	if rev != m.rev {
		m.stats.Conflicts++
		err := &bitmap.ConflictError{Current: cloneSnapshot(m.snap), Rev: m.rev}
		m.mu.Unlock()
		return 0, err
	}
	newRev := m.putLocked(s)
	after := m.onUpdated
	m.mu.Unlock()
	if after != nil {
		if err := after(ctx, newRev); err != nil {
			return 0, err
		}
	}
	return newRev, nil
}

// Put stores a copy of s unconditionally, as another writer would, and returns the new revision.
func (m *MemStore) Put(s bitmap.Snapshot) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.putLocked(s)
}

func (m *MemStore) putLocked(s bitmap.Snapshot) int64 {
	m.lastRev++
	m.rev = m.lastRev
	m.snap = cloneSnapshot(s)
	return m.rev
}

// Delete removes the stored snapshot, so that Get reports revision 0.
func (m *MemStore) Delete() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.snap, m.rev = bitmap.Snapshot{}, 0
}

// Stats returns the numbers of calls served so far.
func (m *MemStore) Stats() MemStoreStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.stats
}

// OnGet sets a hook that runs at the start of every Get; a non-nil error from it is returned by
// Get. nil removes the hook.
func (m *MemStore) OnGet(hook func(ctx context.Context) error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.onGet = hook
}

// OnUpdate sets a hook that runs at the start of every Update with its arguments; see Update.
// nil removes the hook.
func (m *MemStore) OnUpdate(hook func(ctx context.Context, rev int64, s bitmap.Snapshot) error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.onUpdate = hook
}

// OnUpdated sets a hook that runs after every successful Update with the new revision; see
// Update. nil removes the hook.
func (m *MemStore) OnUpdated(hook func(ctx context.Context, newRev int64) error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.onUpdated = hook
}

// cloneSnapshot returns s with its own copy of Data. Empty data stays nil.
func cloneSnapshot(s bitmap.Snapshot) bitmap.Snapshot {
	if len(s.Data) == 0 {
		s.Data = nil
		return s
	}
	s.Data = bytes.Clone(s.Data)
	return s
}
