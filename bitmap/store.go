package bitmap

import "context"

// Store keeps one Snapshot with compare-and-swap semantics, in the manner of an etcd key.
//
// Revisions are opaque, positive and increase with every successful Update; revision 0 means the
// snapshot is absent. Implementations must be safe for concurrent use.
type Store interface {
	// Get returns the stored snapshot and its revision, or the zero Snapshot and revision 0 if
	// nothing is stored. A stored value that cannot be decoded returns an error wrapping ErrCorrupt.
	Get(ctx context.Context) (Snapshot, int64, error)

	// Update stores s if the stored revision is still rev, and returns the new revision. rev 0
	// creates the snapshot only if it is absent. If the revision has moved on it returns an error
	// wrapping ErrConflict and stores nothing.
	Update(ctx context.Context, rev int64, s Snapshot) (int64, error)
}

// Stores gives the Store of the bitmap of each range of kube-apiserver's
// --service-cluster-ip-range: Store(0) is the primary range's, Store(1) the secondary's.
// clusterip.Config.Bitmaps takes one, so that only a program that keeps bitmaps links the package
// that keeps them: etcdstore.Stores keeps them where kube-apiserver does, in its etcd.
//
// Store must return a Store of the same stored bitmap each time it is called with the same index.
// A Store that also has a method Key() string names where it is kept in error messages.
// Implementations must be safe for concurrent use.
type Stores interface {
	Store(i int) Store
}

// Deleter is implemented by a Store that can remove its snapshot with compare-and-delete, such as
// etcdstore.Store. It is optional: no allocator deletes a bitmap, and repair removes one only
// where the mode no longer uses it (see repair.RemoveStaleBitmaps).
type Deleter interface {
	// Delete removes the stored snapshot if the stored revision is still rev. If the revision
	// has moved on (the snapshot was written or removed since) it returns an error wrapping
	// ErrConflict, a *ConflictError where the Store can tell what is stored now, and removes
	// nothing. rev 0 succeeds only if nothing is stored, and then changes nothing.
	Delete(ctx context.Context, rev int64) error
}
