// Package kubeapiserverfork holds the tests of the kube-apiserver v1.33.13 fork whose Service
// ClusterIP allocators are clusterip's; its module builds that fork.
//
// The fork is the pristine k8s.io/kubernetes module at v1.33.13 plus what this directory holds:
//
//   - patches/*.patch: unified diffs of the upstream files that change.
//     storage_core.go.patch makes newServiceIPAllocators build clusterip's allocators (the
//     ClusterIP seam) and starts clusterip's repair controller in place of kube-apiserver's;
//     alloc.go.patch makes the Service registry hand the Service to any allocator that takes
//     one, instead of only kube-apiserver's MetaAllocator, so that IPAddress objects name it.
//   - _overlay/: new files added to upstream packages. _overlay/pkg/registry/core/rest/clusterip.go
//     is the adapter from clusterip's allocator.Interface to kube-apiserver's
//     ipallocator.Interface: net.IP to unmapped netip.Addr, the Service as the owner, each error
//     mapped to kube-apiserver's own (so clients read v1.33's messages), each call under a
//     timeout, and the start of the allocators and of repair from the PostStartHook
//     start-service-ip-repair-controllers, which keeps waiting for the first repair pass.
//     _overlay/pkg/registry/core/rest/clusterip_ipaddresses.go gives the allocators a clientset
//     whose IPAddress creates and deletes go to the IPAddress registry in the process.
//
// Where clusterip alone would behave otherwise than kube-apiserver v1.33, the adapter does as
// kube-apiserver does: the allocators are built in the hook (clusterip.New may list IPAddress
// objects, which needs the server serving); a Service holding a ClusterIP without an IPAddress
// object (a Legacy peer's) gets a repair pass within seconds, not at the next interval; and a
// bitmap stored for another range than the flags does not stop start-up (DualWrite allocates
// from ServiceCIDRs only, Legacy rewrites the bitmap for the flag's range from the Services).
//
// One difference is the fork's own choice: stock kube-apiserver sends each IPAddress create and
// delete of its allocators to itself through the loopback client; the fork calls the IPAddress
// registry in its process, as kube-apiserver writes its bitmaps. The objects, their storage,
// validation and watch events are the same; the writes skip TLS and HTTP, admission (webhooks
// and policies on ipaddresses do not see them), audit (no entries) and field management (the
// objects have no managedFields). TestForkIPAddressObjectsMatchStock compares the objects.
//
// Node ports, and everything else, stay kube-apiserver's. Build the fork with
//
//	go run ./internal/localcluster/cmd/build-kube-apiserver -fork
//
// from the repository root: it applies each patch to the pristine file (a patch that does not
// apply exactly fails the build, naming the line), writes an -overlay file and builds
// k8s.io/kubernetes/cmd/kube-apiserver into .cache/kube-apiserver-v1.33.13-fork-<hash>/, cached
// by a hash of the patches, the overlay files, this module's go.mod and go.sum and the library's
// sources, and prints the binary's path.
//
// The tests (skipped with -short) run from this directory with GOWORK=off, because this module
// is not in the repository's go.work:
//
//	cd internal/kubeapiserverfork && GOWORK=off go test -v .
//
// TestUpstreamIntegration also runs kube-apiserver's own integration tests of Service
// ClusterIPs on the stock code and on the fork's, side by side (they start kube-apiserver
// in-process, built the same way, the fork's with its patches and overlay), and tables each
// test's result on both; about 20 minutes:
//
//	CLUSTERIP_FORK_UPSTREAM_TESTS=servicecidr,dualstack GOWORK=off go test -v -timeout 90m -run TestUpstreamIntegration .
//
// TestStockVsFork measures stock and the fork side by side in each mode (churn and scale),
// never in CI; about 20 minutes:
//
//	CLUSTERIP_FORK_BENCH=churn,scale GOWORK=off go test -v -timeout 90m -run TestStockVsFork .
package kubeapiserverfork
