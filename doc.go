// Package clusterip builds the Service ClusterIP allocators of a cluster for the mode its
// kube-apiserver feature gates select (see package featuregate), with kube-apiserver's exact
// semantics, so that a registry or a kube-apiserver fork can allocate beside real kube-apiservers
// on the same etcd:
//
//   - Legacy: one bitmap per IP family in etcd, at kube-apiserver's keys (package bitmap).
//   - DualWrite: IPAddress objects from ServiceCIDRs (package servicecidr), mirrored into each
//     family's bitmap for Legacy peers by a DualWriteAllocator, which writes the bit before the
//     IPAddress object and deletes the object before the bit, and undoes half-done writes.
//   - IPAddressOnly: IPAddress objects from ServiceCIDRs only.
//
// New takes a Config (the flag ranges, the etcd client, the Kubernetes client and an informer
// factory) and returns the Allocators; For gives the allocator.Interface of one IP family (and
// Bitmap, DualWrite and ServiceCIDRs its parts), Run keeps the ServiceCIDR-based allocators in
// step with their ServiceCIDRs, and WaitReady waits until every family can allocate.
//
// In DualWrite mode a missing bitmap is created from the IPAddress objects already in its range,
// as when a cluster goes back from IPAddressOnly to DualWrite; see New.
package clusterip
