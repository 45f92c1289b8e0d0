// Package testenv gives tests real components, started for a test and stopped when it ends: an
// etcd server in a child process ([NewEtcd]) and a real kube-apiserver v1.33
// ([NewKubeAPIServer], or one per package with [Shared]), as thin testing.TB helpers over
// [localcluster], which the clusterip command uses too.
//
// The client-go fake clientset keeps no resourceVersion, ignores delete preconditions and
// validates nothing, so optimistic concurrency, validation and interoperation with the upstream
// Service IP allocators are tested against the real thing. Everything listens on 127.0.0.1 only.
//
// Deadlines: a test starts its own deadlines (context.WithTimeout and the like) only after
// [NewEtcd], [NewKubeAPIServer] or [Shared.KubeAPIServer] has returned, so that neither start-up
// nor the first build of kube-apiserver (about 7 minutes on 2 cores, once per clone; see
// [localcluster.KubeAPIServerBinary]) counts against them; and a package that starts a
// kube-apiserver runs its tests through [Main], so that a first build does not count against the
// test binary's -timeout either. [WaitFor] polls for a condition with a bound of its own.
package testenv
