// Package kubeapiserverfork holds the tests of the kube-apiserver forks whose Service ClusterIP
// allocators are clusterip's. The forks themselves live in forks/<release> at the repository
// root, one folder per release, each with its guide (README.md), its build module and the whole
// change as one patch file; this module only tests them, starting their binaries.
//
// A fork is the pristine k8s.io/kubernetes module at its release plus what its folder holds,
// forks/<release>:
//
//   - patches/*.patch: unified diffs of the upstream files that change.
//     storage_core.go.patch makes newServiceIPAllocators build clusterip's allocators (the
//     ClusterIP seam) and starts clusterip's repair controller in place of kube-apiserver's;
//     alloc.go.patch makes the Service registry hand the Service to any allocator that takes
//     one, instead of only kube-apiserver's MetaAllocator, so that IPAddress objects name it.
//   - files/: the new file only that release adds, pkg/registry/core/rest/clusterip_release.go:
//     the mode its feature gates select and what its storage adds to the bitmaps' etcd client
//     (gRPC metrics, tracing and the wait for the connection).
//   - and forks/common/files: the new files every release adds, kept once.
//     pkg/registry/core/rest/clusterip.go builds clusterip's allocators in place of
//     kube-apiserver's; clusterip_ipallocator.go is the adapter from clusterip's
//     allocator.Interface to kube-apiserver's ipallocator.Interface: net.IP to unmapped
//     netip.Addr, the Service as the owner, each error mapped to kube-apiserver's own (so clients
//     read its messages), each call under a timeout; clusterip_repair.go starts the allocators
//     and repair from the PostStartHook start-service-ip-repair-controllers, which keeps waiting
//     for the first repair pass; clusterip_etcd.go builds the bitmaps' etcd client as every
//     release's storage builds its own.
//     clusterip_ipaddresses.go chooses how the allocators write their IPAddress objects (below),
//     and clusterip_reservations.go turns reservations on (CLUSTERIP_RESERVATIONS=on).
//
// Where clusterip alone would behave otherwise than kube-apiserver of the fork's release, the
// adapter does as kube-apiserver does: the allocators are built in the hook (clusterip.New may list IPAddress
// objects, which needs the server serving); a Service holding a ClusterIP without an IPAddress
// object (a Legacy peer's) gets a repair pass within seconds, not at the next interval; and a
// bitmap stored for another range than the flags does not stop start-up (DualWrite allocates
// from ServiceCIDRs only, Legacy rewrites the bitmap for the flag's range from the Services).
// The bitmaps' etcd client is built as kube-apiserver's storage builds its own: the etcd TLS
// files, the egress selector's dialer for etcd (--egress-selector-config-file), tracing when
// APIServerTracing is on, and the same timeouts.
//
// The allocators write their IPAddress objects as stock kube-apiserver does, by default: each
// create and delete is a request to the server itself through its loopback client, so it is
// authenticated as system:apiserver, audited, admitted (webhooks and admission policies on
// ipaddresses see it), field-managed, and stored through the served resource with its encryption
// at rest. An operator may choose, with CLUSTERIP_IPADDRESS_WRITES=registry in kube-apiserver's
// environment, to have them call the IPAddress registry in the process instead, as
// kube-apiserver writes its bitmaps: the objects, their storage (encryption at rest included:
// the registry is built from the server's REST options, with their transformers), validation
// and watch events are the same, but those writes skip admission, audit and field management
// (the objects have no managedFields). Any other value stops the server at start-up.
// TestForkIPAddressObjectsMatchStock, TestForkAuditsAndAdmitsIPAddressWritesAsStock and
// TestForkEncryptsIPAddressesAsStock compare both paths with stock.
//
// Answers that differ from stock's on purpose, in every release: a dry-run create of a Service asking for
// a ClusterIP that is already allocated is refused as the real create is (422, "failed to
// allocate IP …: provided IP is already allocated"), where stock's dry run admits it
// (TestForkErrorsMatchStock).
//
// Node ports, and everything else, stay kube-apiserver's. Build the fork of a release with
//
//	go run ./internal/localcluster/cmd/build-kube-apiserver -fork -release v1.33.13
//
// from the repository root: it applies each patch to the pristine file (a patch that does not
// apply exactly fails the build, naming the line), writes an -overlay file and builds
// k8s.io/kubernetes/cmd/kube-apiserver into .cache/kube-apiserver-<release>-fork-<hash>/, cached
// by a hash of the patches, the new files, the fork's go.mod and go.sum and the library's
// sources, and prints the binary's path. forks/patches.sh checks that each whole-change patch
// is what its folder makes and that git apply takes it.
//
// The tests (skipped with -short) run from this directory with GOWORK=off, because this module
// is not in the repository's go.work. They test the fork of one release beside stock
// kube-apiserver of the same release, v1.33.13 unless CLUSTERIP_FORK_RELEASE names another, in
// each gate combination of that release (releaseModes; a v1.37 binary, for one, has no Legacy
// mode and dual writes only at --emulated-version=1.34):
//
//	cd internal/kubeapiserverfork && GOWORK=off go test -v .
//	cd internal/kubeapiserverfork && CLUSTERIP_FORK_RELEASE=v1.37.2 GOWORK=off go test -v .
//
// TestUpstreamIntegration also runs kube-apiserver's own integration tests of Service
// ClusterIPs on the stock code and on the fork's, side by side (they start kube-apiserver
// in-process, built the same way, the fork's with its patches and new files), and tables each
// test's result on both; about 20 minutes:
//
//	CLUSTERIP_FORK_UPSTREAM_TESTS=servicecidr,dualstack GOWORK=off go test -v -timeout 90m -run TestUpstreamIntegration .
//
// TestStockVsFork measures stock and the fork side by side in each mode (churn and scale),
// never in CI; about 20 minutes:
//
//	CLUSTERIP_FORK_BENCH=churn,scale GOWORK=off go test -v -timeout 90m -run TestStockVsFork .
package kubeapiserverfork
