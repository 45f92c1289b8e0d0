// Command clusterip runs the clusterip library's allocators against real components: a demo on
// an embedded etcd, benchmarks with a chart, and an audit and a repair of a live cluster.
//
// Usage:
//
//	clusterip demo [flags]        walk a cluster through the allocator upgrade on an (embedded) etcd
//	clusterip bench [flags]       measure the allocators over range sizes and fill levels
//	clusterip check [flags]       audit a live cluster's Service IPs; only reads
//	clusterip repair [flags]      repair what check finds, then audit again (--dry-run: change nothing)
//	clusterip version             print the module and Go versions and the kube-apiserver releases it speaks
//	clusterip completion SHELL    print a shell completion script
//
// As kubectl's, the verbs that read never write: check reads, repair writes. The etcd flags are
// kube-apiserver's (--etcd-servers, --etcd-cafile, --etcd-certfile, --etcd-keyfile, --etcd-prefix).
// A spelling this release replaced works until the next, with a warning on stderr.
//
// Built with -tags clusterip_slim,grpcnotrace (the container image's binary, see Dockerfile and
// hack/image), it has neither demo nor bench: it links no etcd server, no plotting code and no
// grpc tracing, and its help lists only the verbs it has.
//
// Installed as kubectl-clusterip on PATH, it is a kubectl plugin: kubectl clusterip check, and its
// help says so.
//
// Exit codes: 0 the command did its job, 1 it ran and found a problem, 2 it could not run (bad
// flags included), with one line on stderr saying why (after any deprecation warning).
package main
