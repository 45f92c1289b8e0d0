// Package allocator defines the one interface every Service ClusterIP allocator in this module
// implements, the errors they return, and the address checks they share.
//
// An allocator hands out addresses of one IP family from one Service CIDR (or, for the multi-CIDR
// allocator in package servicecidr, from every ServiceCIDR of a family). Addresses are
// [netip.Addr] values and prefixes are [netip.Prefix] values; an IPv4-mapped IPv6 address, a
// zoned address, a prefix that leaves no usable address, or an IPv6 prefix overlapping the
// IPv4-mapped block ::ffff:0:0/96 (such as ::/80) is rejected with a typed error that matches
// [ErrInvalid] and changes nothing. Every constructor checks its range with [CheckPrefix];
// allocators that record owners reject an [Owner] without a Resource or a Name with [CheckOwner].
//
// The implementations of [Interface] are:
//   - bitmap.Allocator and bitmap.Persistent, the legacy bitmap kept by kube-apiserver in etcd;
//   - ipaddress.Allocator, which keeps one networking.k8s.io/v1 IPAddress object per address;
//   - servicecidr.Allocator, one ipaddress.Allocator per ServiceCIDR.
//
// Package allocatortest holds the conformance suite they all pass, and the checks it is made of.
//
// Package allocator/service gives Services their ClusterIPs over one Interface per family, as
// kube-apiserver's Service registry does; the contract here knows only addresses and owners.
package allocator
