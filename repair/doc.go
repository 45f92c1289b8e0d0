// Package repair audits and heals the ClusterIP state of a cluster: the Services, the ServiceCIDRs,
// the networking.k8s.io/v1 IPAddress objects and kube-apiserver's legacy bitmaps in etcd.
//
// Audit reads them all (from the API server and etcd, never from a cache) and returns a Report
// with one Finding per address that needs attention, of the first Class of the table in DESIGN §7
// that applies. It writes nothing. Upstream kube-apiserver offers no audit, and with the
// IPAddress allocator on it never repairs the bitmap (kubernetes#136475).
package repair
