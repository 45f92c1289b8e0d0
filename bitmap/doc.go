// Package bitmap records which addresses of a Service CIDR are taken as a compact bit set that is
// cheap to snapshot: the legacy allocator of kube-apiserver, with its exact semantics.
//
// One bit stands for each usable address; offset i is the address network+1+i. An IPv4 range
// excludes its network and broadcast addresses; an IPv6 range excludes its network address and is
// capped at 65535 slots (network+1 … network+0xffff), exactly as kube-apiserver keeps it, so that the
// stored bitmaps of both interoperate. AllocateNext prefers the dynamic (upper) band of KEP-3070 and
// starts at a random offset inside it.
//
// Allocator keeps the bit set in memory. Persistent keeps it in a Store with compare-and-swap, such
// as the etcd key of package etcdstore that kube-apiserver itself reads and writes. Snapshot and
// Restore use kube-apiserver's RangeAllocation encoding. Load reads a stored bitmap, and Modify
// changes one with compare-and-swap, retried on conflicts, for callers that change a stored bitmap
// by hand (bootstrap, repair); Project reads a bitmap stored for another range as the new range
// keeps it.
//
// New accepts IPv4 ranges down to a /8 (MinIPv4Bits); NewPersistent accepts IPv4 ranges only down
// to a /12 (MaxPersistentHostBits), kube-apiserver's own cap, because a wider snapshot is too large
// for the etcd key kube-apiserver keeps it in.
package bitmap
