// Package bitmap records which addresses of a Service CIDR are taken as a compact bit set that is
// cheap to snapshot: the legacy allocator of kube-apiserver, with its exact semantics.
//
// One bit stands for each usable address; offset i is the address network+1+i. An IPv4 range
// excludes its network and broadcast addresses; an IPv6 range excludes its network address and is
// capped at 65535 slots (network+1 … network+0xffff), exactly as kube-apiserver keeps it, so that the
// stored bitmaps of both interoperate. AllocateNext prefers the dynamic (upper) band of KEP-3070 and
// starts at a random offset inside it. AllocateNextSkipping picks in the same order but passes over
// the addresses a predicate refuses, without setting their bits (in a Persistent, inside the
// compare-and-swap that takes the bit), for a dual-write allocator whose other store holds them.
//
// Allocator keeps the bit set in memory. Persistent keeps it in a Store with compare-and-swap, such
// as the etcd key of package etcdstore that kube-apiserver itself reads and writes. Snapshot and
// Restore use kube-apiserver's RangeAllocation encoding. Load reads a stored bitmap, and Modify
// changes one with compare-and-swap, retried on conflicts, for callers that change a stored bitmap
// by hand (bootstrap, repair); Project reads a bitmap stored for another range as the new range
// keeps it. A Store that is also a Deleter removes its snapshot with compare-and-delete, for
// repair to remove a bitmap no server uses any more.
//
// New accepts IPv4 ranges down to a /8 (MinIPv4Bits); NewPersistent accepts IPv4 ranges only down
// to a /12 (MaxPersistentHostBits), kube-apiserver's own cap, because a wider snapshot is too large
// for the etcd key kube-apiserver keeps it in.
//
// # Persistent: compare-and-swap and group commit
//
// Every operation of a Persistent restores the stored snapshot when the local copy is stale, applies the
// operation to a copy of it, and stores the result with compare-and-swap on the revision read;
// it adopts the result only once the store has accepted it. A revision conflict that brings the
// stored state along (a *ConflictError) is retried at once on that state, so that a loser is as
// fresh as the winner and several processes on one key get fair shares; a conflict without it
// reloads the snapshot, and long runs of conflicts back off (see WithBackoff). After
// WithMaxAttempts attempts the operation fails with an error wrapping ErrConflict.
//
// Concurrent calls in one process are committed together (group commit): while one
// compare-and-swap is in flight, new calls queue up; then every queued operation is applied, in
// arrival order, to one copy, which is stored with a single compare-and-swap, and each caller gets
// its own result (an operation that fails, say with allocator.ErrAllocated, fails
// alone). No lock is held across a Store call, so Has, All, Used, Free, CIDR and DryRun answer at
// once from the last state the allocator read or wrote; they do not see writes of other
// allocators until the next operation or Refresh.
//
// A caller's context bounds its wait, whatever the other callers of its batch do. A caller whose
// context ends before its operation is being stored returns the context's error at once, and the
// operation is dropped. One whose context ends while a Store write including its operation is in
// flight returns at once with an error wrapping both ErrOutcomeUnknown and the context's error; if
// that write is then stored, the allocator releases the address of such an Allocate or
// AllocateNext in a later batch, so that an address nobody was told about does not stay taken. A
// Store call is canceled only when every caller in its batch has given up.
//
// A Store error other than a conflict is followed by a fencing write (the old snapshot again,
// with compare-and-swap on the old revision): if that succeeds the operations failed and nothing
// was stored; if not, they fail with an error wrapping
// ErrOutcomeUnknown. So an error that does not wrap ErrOutcomeUnknown always means that the
// operation changed nothing in the store.
package bitmap
