// Package testenv runs real components for integration tests and for
// "clusterip demo": an etcd server embedded in the process and a real
// kube-apiserver v1.33 started as a child process against it.
//
// The client-go fake clientset keeps no resourceVersion, ignores delete
// preconditions and validates nothing, so optimistic concurrency, validation
// and interoperation with the upstream Service IP allocators are tested here,
// against the real thing. Everything listens on 127.0.0.1 only.
//
// NewEtcd and NewKubeAPIServer are the test helpers; StartEtcd and
// StartKubeAPIServer are for callers without a testing.TB. A kube-apiserver
// binary is built once per machine (about 6 minutes) and cached under
// .cache/ at the repository root; see KubeAPIServerBinary.
package testenv
