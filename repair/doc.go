// Package repair audits and heals the ClusterIP state of a cluster: the Services, the ServiceCIDRs,
// the networking.k8s.io/v1 IPAddress objects and kube-apiserver's legacy bitmaps in etcd.
//
// [Audit] reads them all (from the API server and etcd, never from a cache) and returns a
// [Report] with one [Finding] per address that needs attention, of the first [Class] that
// applies, in the order of the table in docs/design.md: invalid, duplicate-owner, out-of-range,
// wrong-parent, missing, leaked, bitmap-only, ipaddress-only. It writes nothing. Upstream
// kube-apiserver offers no audit, and with the IPAddress allocator on it never repairs the bitmap
// (kubernetes#136475).
//
// A [Controller] acts on an audit's findings as the mode allows. A decision that cannot be
// undone, freeing a leaked address, is confirmed against live state first (a Get of the object,
// then a delete with its UID and resourceVersion as preconditions, or a compare-and-swap of the
// bitmap), and held off for [Options.LeakGrace].
//
// IPAddress objects that another controller manages (their managed-by label is not
// [ipaddress.DefaultManagedBy]) are left alone, as kube-apiserver's repair leaves them: they are
// never reported leaked and never deleted.
package repair
