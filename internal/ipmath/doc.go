// Package ipmath does the address arithmetic Service CIDR allocators need: offsets of usable
// addresses inside a prefix, 128-bit sums for IPv6, range sizes that saturate instead of
// overflowing, and the static/dynamic band split of KEP-3070, all with kube-apiserver's exact values.
//
// Offsets count usable addresses: offset 0 is the address right after the network address. Every
// function takes valid, masked, unzoned prefixes (see allocator.CheckPrefix); given anything else it
// returns a zero or false result rather than panicking.
package ipmath
