// Package metrics records the Prometheus metrics of ClusterIP allocators: kube-apiserver's own
// allocator metrics (kube_apiserver_clusterip_allocator_*, with its names, labels and buckets)
// and a few it does not have (not-ready refusals, dual-write undos, bitmap compare-and-swap
// contention), on a registry the caller
// passes. Nothing is registered globally.
//
// Counters and the duration histogram are recorded by a decorator over allocator.Interface
// (Recorder.Wrap); the allocated and available gauges are read from the wrapped allocator's
// Used and Free when the registry is scraped, so they are exact at every scrape, including the
// addresses other processes took, and are there from the moment the allocator is wrapped.
//
// The metrics, each with label cidr:
//
//	kube_apiserver_clusterip_allocator_allocated_ips          gauge      Used(), or per ServiceCIDR prefix
//	kube_apiserver_clusterip_allocator_available_ips          gauge      Free(), or per ServiceCIDR prefix
//	kube_apiserver_clusterip_allocator_allocation_total       counter    +scope: successful allocations
//	kube_apiserver_clusterip_allocator_allocation_errors_total counter   +scope: failed ones, ErrNotReady aside
//	kube_apiserver_clusterip_allocator_allocation_duration_seconds histogram (prometheus.DefBuckets), successes
//	clusterip_allocator_not_ready_total                       counter    +scope: refusals with ErrNotReady
//	clusterip_allocator_dualwrite_undo_total                  counter    dual-write first writes undone
//	clusterip_allocator_dualwrite_undo_errors_total           counter    undos that failed (a leak for repair)
//	clusterip_allocator_bitmap_batches_total                  counter    bitmap group-commit batches
//	clusterip_allocator_bitmap_cas_writes_total               counter    bitmap compare-and-swaps accepted
//	clusterip_allocator_bitmap_cas_conflicts_total            counter    bitmap compare-and-swaps refused (conflict)
//	clusterip_allocator_bitmap_cas_retries_total              counter    conflicts after which the batch was retried
//
// scope is "static" for Allocate and "dynamic" for AllocateNext, as in kube-apiserver.
//
// With Source.CIDRs set (the allocators of ServiceCIDRs), the gauges have one series per
// ServiceCIDR prefix, as kube-apiserver has one allocator per prefix: each counts the addresses
// its prefix contains, so an address in overlapping prefixes counts in each, and a prefix's
// series appear when its allocator is created and go when it is removed. With Source.LabelOf
// set, the counters and the histogram of an allocation are labelled with the prefix that served
// its address, as kube-apiserver labels them with the prefix of the allocator that made it; a
// failed AllocateNext, which has no address, counts under Source.Label.
package metrics
