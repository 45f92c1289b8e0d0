// Package ipaddress allocates Service ClusterIPs of one CIDR by keeping one networking.k8s.io/v1
// IPAddress object per allocated address, as kube-apiserver does since the MultiCIDRServiceAllocator
// feature (KEP-1880). It replaces the single bitmap object of package bitmap: the API server's
// uniqueness of object names is the lock, so any number of allocators, in any number of processes,
// can share a range, and ranges may be as large as an IPv4 /0 or an IPv6 /64.
//
// An Allocator reads the IPAddress objects through a shared informer and writes them with
// client-go. Its local view is a free index (internal/freeindex) fed by informer events and by
// its own successful writes, which it assumes until the informer shows them; AllocateNext picks a
// free address from it in a few map lookups at any fill, and Used and Free are counters, so no
// operation costs time proportional to the number of allocated addresses. The index is advisory:
// the API server decides, and an address the index thought free but the server already holds costs
// one more Create. An assumed write is dropped once the informer shows it or something newer, or
// after the assume timeout (a minute by default); an object the informer holds is never hidden by
// one of the Allocator's own deletes for more than a second unless it is the very object deleted.
//
// Each object is named after the canonical address (netip.Addr.String), labelled
// ipaddress.kubernetes.io/ip-family (IPv4 or IPv6) and ipaddress.kubernetes.io/managed-by
// (ipallocator.k8s.io by default, like kube-apiserver), and points at its owner with
// spec.parentRef.
package ipaddress
