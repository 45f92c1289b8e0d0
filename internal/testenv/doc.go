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
// binary is built once per clone (about 7 minutes on 2 cores) and cached
// under .cache/ at the repository root; see KubeAPIServerBinary.
//
// Deadlines: a test starts its own deadlines (context.WithTimeout and the
// like) only after NewEtcd, NewKubeAPIServer or Shared.KubeAPIServer has
// returned, so that neither a first build nor start-up counts against them,
// and a package that starts a kube-apiserver runs its tests through Main, so
// that a first build does not count against the test binary's -timeout either.
package testenv
