// Package etcdstore keeps a bitmap.Snapshot in etcd exactly where and as kube-apiserver keeps its
// Service IP bitmap, so that a bitmap.Persistent allocator and a kube-apiserver running the legacy
// allocator can share one etcd and one range.
//
// The key is <prefix>/ranges/serviceips for the primary IP family and
// <prefix>/ranges/secondaryserviceips for the secondary one, the prefix being kube-apiserver's
// --etcd-prefix (default "/registry"); see ServiceIPsKey and SecondaryServiceIPsKey. The value is
// a core/v1 RangeAllocation in kube-apiserver's storage encoding: protobuf behind the "k8s\x00"
// envelope by default, JSON on request (WithFormat(JSON)); both are read. Updates are compare-and-swap
// transactions on the key's ModRevision, which is the Store revision, and Delete (bitmap.Deleter)
// is a compare-and-delete on it, for a bitmap no server uses any more.
//
// This replaces the RangeAllocation storage of kube-apiserver's
// pkg/registry/core/service/allocator/storage, without its lock held across etcd calls.
package etcdstore
