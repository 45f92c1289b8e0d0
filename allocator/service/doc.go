// Package service gives Services their ClusterIPs as kube-apiserver's Service registry does, over one allocator.Interface per IP family: it is the layer a registry calls with a
// Service, where the allocators below it are called with addresses.
//
// [Allocator] defaults spec.ipFamilyPolicy and spec.ipFamilies from the cluster's families,
// fills spec.clusterIP and spec.clusterIPs (chosen addresses in any spelling kube-apiserver
// accepts, fresh ones from the family's allocator, "None" for a headless Service, nothing for an
// ExternalName one), applies the update rules (single to dual stack and back, immutability), and
// rejects what kube-apiserver rejects with the same 422 Invalid errors, built from a
// field.ErrorList, with the field paths and texts of the kube-apiserver release it is configured
// as (Options.Version; the newest supported release by default). Each Allocate or Update is one
// [Transaction]: the registry commits it once the Service is stored, or reverts it, and a failure
// in the second family releases what the first took before the call returns.
//
// Releases answer differently: from v1.35 a dynamic allocation error other than a full range is a
// 422 at spec.clusterIPs, from v1.36 the full range's 500 names the Service and a new ClusterIP
// with leading zeros or in IPv4-mapped form is refused (StrictIPCIDRValidation), and from v1.34
// field values are shown as JSON. Its expected answers are the Service matrices in the module's
// testdata/services-<release>.yaml, recorded from real stock kube-apiservers of each release on
// four cluster shapes and replayed against it by the tests. See ExampleAllocator.
//
// The root package builds one over the allocators of a mode (clusterip.Allocators.Services); New
// builds one over any allocators, such as in-memory bitmaps or a fork's own.
package service
