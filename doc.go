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
// The bitmaps are kept where Config.Bitmaps says; package bitmap/etcdstore keeps them in etcd as
// kube-apiserver does, and only a program that imports it links the etcd client: IPAddressOnly
// mode, with package repair, links none.
//
// New takes a Config (the flag ranges, the bitmap stores, the Kubernetes client and an informer
// factory) and returns the Allocators; For gives the allocator.Interface of one IP family (and
// Bitmap, DualWrite and ServiceCIDRs its parts), Run keeps the ServiceCIDR-based allocators in
// step with their ServiceCIDRs, and WaitReady waits until every family can allocate, or says,
// with a *NotReadyError, what the first family that cannot is waiting for.
//
// In DualWrite mode a missing bitmap is created from the IPAddress objects already in its range,
// as when a cluster goes back from IPAddressOnly to DualWrite; see New.
//
// # Dual write
//
// A DualWriteAllocator keeps every address inside its bitmap mirror's window that the primary
// (servicecidr) allocator holds also set in the bitmap, which is all that Legacy peers read.
//
// The window is the set of addresses the bitmap has a slot for: the flag range without its
// network (and IPv4 broadcast) address, and for IPv6 only the first bitmap.MaxIPv6Slots of them.
// Addresses outside it (the rest of a wider IPv6 range, extra ServiceCIDRs) live in the primary
// alone (kubernetes#129797).
//
// Writes go in an order that never shows a Legacy peer a free bit for an address the primary
// holds: AllocateNext and Allocate set the bit first and then create the IPAddress, Release
// deletes the IPAddress first and then clears the bit. A bit is cleared again only when the
// create was definitely refused (the object exists already, the address is in no ready
// ServiceCIDR, a 4xx answer): an answer that leaves the outcome unknown (a 5xx such as a 504, a
// connection lost before the response, the caller's deadline) may come after the object was
// stored, so the bit stays. The object is then read back (see WithClient): if it exists for the
// owner, the allocation stands; otherwise the error is returned and the bit is left for repair,
// which frees it once it has seen no object for the address for its hold-off. The other way
// round, an IPAddress whose bit could not be set is always deleted again, since a bit that may
// have been set without an object is a leak, never a duplicate. So a crash between two writes,
// an ambiguous answer or a failed undo leaves an address in one store alone, as a bit without an
// object (a leak that repair frees). The one exception is an address inside the window that the
// primary chose itself (from a ServiceCIDR that contains the window, such as an IPv6 flag range
// wider than the bitmap): its object comes first, so a crash before its bit, or a failed delete
// after its bit was refused, leaves an object without a bit, which repair's ipaddress-only
// finding heals. A bit that is set without an IPAddress object belongs to a Legacy peer (or is
// stale): it is never taken over, and Allocate reports allocator.ErrAllocated for it.
//
// AllocateNext never sets, even for a moment, the bit of an address the primary holds (an object
// a peer has not deleted yet, or an IPAddress-only peer's): the bitmap passes such addresses over
// inside the compare-and-swap that takes a bit (bitmap.Persistent.AllocateNextSkipping), since
// another caller reading the bitmap meanwhile would find it taken, and the range full while an
// address is free. It answers allocator.ErrFull only when no address was free at some instant of
// the call: before it does, it reads the objects of the addresses it passed over (the primary's
// informer may not have shown their deletes yet) and the bitmap again (for bits a peer has given
// back since the primary offered their addresses), and tries the addresses those reads show free.
package clusterip
