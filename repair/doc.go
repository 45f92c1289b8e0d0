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
// Every finding is keyed by address: a Service's ClusterIP as kube-apiserver v1.33 reads it
// (allocator.ParseClusterIP: "10.96.0.010", "::ffff:10.96.0.11" and "FD00::A" hold 10.96.0.10,
// 10.96.0.11 and fd00::a, whose IPAddress objects and bits are theirs). An address is in range
// in any ServiceCIDR, ready or terminating, as kube-apiserver's repair counts them. A missing
// record is confirmed with live reads before it is reported, so an allocation that completes
// while the audit reads is not taken for one.
//
// A [Controller] acts on an audit's findings as the mode allows. A decision that cannot be
// undone, freeing a leaked address, is confirmed against live state first (a Get of the object,
// then a delete with its UID and resourceVersion as preconditions, or a compare-and-swap of the
// bitmap), and held off for [Options.LeakGrace] (and, for an IPAddress newer than the Service it
// names, at least 5 s, as kube-apiserver since kubernetes#132906). [Controller.Run] makes a
// level-based pass every [Options.Interval] and, between passes, retries single addresses whose
// repair failed or was held off, each with its own backoff, through one typed rate-limited
// workqueue; it never blocks its caller on a cluster that is down. Outside Legacy mode, given the
// Config's informers, Run also follows Services as kube-apiserver's IPAddress repair loop does: a
// Service that still holds a ClusterIP without an IPAddress object a second after it was seen
// (a Legacy peer's, in the skew window) brings the next pass forward, at most one pass per 10 s
// however many Services are followed, and none for an address a pass reported it cannot fix
// (out of every ServiceCIDR, say). [Controller.FirstPass] is
// closed by the first pass that succeeds, for a server that must not be ready before it.
//
// IPAddress objects that another controller manages (their managed-by label is not
// [ipaddress.DefaultManagedBy]) are left alone, as kube-apiserver's repair leaves them: they are
// never reported leaked and never deleted. An IPAddress whose parentRef names the Service that
// holds its IP but whose labels are not the allocator's (ip-family, managed-by) is a
// [WrongParent] finding, and repair updates its labels in place, as kube-apiserver's repair fixes
// wrong labels too.
//
// # What the Controller repairs
//
//   - IPAddressOnly: creates the IPAddress of a Service that has none, deletes an IPAddress no
//     Service holds once it is older than the hold-off, recreates one whose parentRef names the
//     wrong Service. Every decision is confirmed with a live Get first, and every delete carries a
//     UID and resourceVersion precondition, so a repair racing an allocation cannot undo it.
//   - Legacy: rebuilds each bitmap from the Services and writes it back with a compare-and-swap
//     on the revision it read before listing the Services, so a concurrent allocation makes the
//     write fail instead of being undone. A leaked bit is kept until it has been seen leaked on 3
//     passes and for the hold-off, as kube-apiserver does; a missing bitmap is created. A bitmap
//     stored for another range (--service-cluster-ip-range changed) is first rewritten to the
//     flag range, keeping the bits inside it, as kube-apiserver's repair does on its first pass.
//   - DualWrite: both, and the bitmap from the IPAddress objects and Services, which
//     kube-apiserver does not do (kubernetes#136475): a Service's bit that is clear is set, a
//     stale bit (no IPAddress, no Service) is cleared once seen so for the hold-off and a live Get
//     finds no IPAddress, and the bit of a leaked IPAddress goes with it.
//
// # Stale bitmaps
//
// An IPAddressOnly audit given the bitmaps' store reports the bitmaps a Legacy or DualWrite era
// left behind ([Report.StaleBitmaps]); the Controller leaves them. [RemoveStaleBitmaps] deletes
// them, each with a compare-and-delete at the revision the audit read, once
// [CheckBitmapWriters] has found that no live kube-apiserver can write them again: every server
// that [LiveAPIServers] lists from its identity Lease is accounted for by a /version
// ([ReadServerVersions]) that cannot write them ([ServerVersion.CanWriteBitmaps]): a 1.38 or
// later binary, which has no bitmaps, or one that emulates 1.35 or later, where both allocator
// gates are locked on.
//
// # Upgrading to 1.38
//
// kube-apiserver 1.38 has no bitmaps and no dual write, so every server must have left Legacy and
// DualWrite before a 1.38 one joins. [CheckUpgrade] judges that from the same evidence
// ([LiveAPIServers], and [ReadEachServerVersion], which names each server it could not read):
// [UpgradeBlocked], naming each server that can still write the bitmaps, with a hazard if a 1.38
// server is already live beside one; [UpgradeUnknown]; or [UpgradeReady]. [Report.Upgrade]
// carries it for "clusterip check".
//
// Invalid, duplicate and out-of-range ClusterIPs only get an Event. Each cause of an Event (the
// object, the address and the reason) is reported once, while passes keep finding it, and again
// if it comes back after a pass that did not find it (see [Options.Recorder]).
//
// # Metrics
//
// With [Options.Registerer] (never the Config's) the Controller keeps kube-apiserver's repair metrics, counted per pass
// as kube-apiserver's repair loop counts them (the type label of
// apiserver_clusterip_repair_ip_errors_total):
//
//	invalid     each Service holding an invalid ClusterIP (and each invalid IPAddress name)
//	duplicate   each Service holding an IP another Service holds, after the first
//	outOfRange  each out-of-range ClusterIP
//	repair      each record repair writes for an IP a Service holds: a missing IPAddress or
//	            bit, a recreated wrong parent, fixed labels, an ipaddress-only bit
//	leak        each leaked IPAddress or bit repair frees, once its hold-off is over
//	unknown     each bit of a Service's IP that could not be set for an unexpected reason
//	full        never: a bitmap rebuilt from its own snapshot has room for every missing bit
//
// apiserver_clusterip_repair_reconcile_errors_total counts the passes (RunOnce, or Run's) that
// returned an error, except those cut short because their ctx was done.
// clusterip_repair_drift_addresses{family,kind} holds, after each audit, the number of
// bitmap-only and ipaddress-only findings of each IP family (0 outside DualWrite).
package repair
