// Package clustertest holds the helpers of the system tests under test/integration that run
// clusterip's allocators against a real etcd and kube-apiserver v1.33: start the allocators of a
// Config ([StartAllocators]) or a cluster of a test's own ([StartOwnCluster]), and read what the
// two stores hold, the bitmaps from etcd ([EtcdBits]) and the IPAddress objects from the API
// server ([APIIPAddresses]), as sets of addresses (apimachinery's sets.Set).
//
// The helpers that need no clusterip package (etcd, kube-apiserver, Service churn, polling) are
// in internal/testenv, which the library's own tests use too.
package clustertest
