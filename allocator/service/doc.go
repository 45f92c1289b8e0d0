// Package service gives Services their ClusterIPs as kube-apiserver v1.33's Service registry
// does, over one allocator.Interface per IP family: it is the layer a registry calls with a
// Service, where the allocators below it are called with addresses.
//
// [Allocator] defaults spec.ipFamilyPolicy and spec.ipFamilies from the cluster's families,
// fills spec.clusterIP and spec.clusterIPs (chosen addresses in any spelling kube-apiserver
// accepts, fresh ones from the family's allocator, "None" for a headless Service, nothing for an
// ExternalName one), applies the update rules (single to dual stack and back, immutability), and
// rejects what kube-apiserver rejects with the same 422 Invalid errors, built from a
// field.ErrorList, with v1.33's field paths and texts. Each Allocate or Update is one
// [Transaction]: the registry commits it once the Service is stored, or reverts it, and a failure
// in the second family releases what the first took before the call returns.
//
// Its expected answers are the Service matrix in the module's testdata/services.yaml, recorded
// from real kube-apiservers on four cluster shapes and replayed against it by the tests, which
// also put the same requests to a real kube-apiserver v1.33.13 beside it. See ExampleAllocator.
//
// The root package builds one over the allocators of a mode (clusterip.Allocators.Services); New
// builds one over any allocators, such as in-memory bitmaps or a fork's own.
package service
