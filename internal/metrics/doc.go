// Package metrics records the Prometheus metrics of ClusterIP allocators: kube-apiserver's own
// allocator metrics (kube_apiserver_clusterip_allocator_*, with its names, labels and buckets)
// and a few it does not have (not-ready refusals, dual-write undos), on a registry the caller
// passes. Nothing is registered globally.
//
// Counters and the duration histogram are recorded by a decorator over allocator.Interface
// (Recorder.Wrap); the allocated and available gauges are read from the wrapped allocator's
// Used and Free when the registry is scraped, so they are exact at every scrape, including the
// addresses other processes took, and are there from the moment the allocator is wrapped.
//
// The metrics, each with label cidr:
//
//	kube_apiserver_clusterip_allocator_allocated_ips          gauge      Used()
//	kube_apiserver_clusterip_allocator_available_ips          gauge      Free()
//	kube_apiserver_clusterip_allocator_allocation_total       counter    +scope: successful allocations
//	kube_apiserver_clusterip_allocator_allocation_errors_total counter   +scope: failed ones, ErrNotReady aside
//	kube_apiserver_clusterip_allocator_allocation_duration_seconds histogram (prometheus.DefBuckets), successes
//	clusterip_allocator_not_ready_total                       counter    +scope: refusals with ErrNotReady
//	clusterip_allocator_dualwrite_undo_total                  counter    dual-write first writes undone
//	clusterip_allocator_dualwrite_undo_errors_total           counter    undos that failed (a leak for repair)
//
// scope is "static" for Allocate and "dynamic" for AllocateNext, as in kube-apiserver.
package metrics
