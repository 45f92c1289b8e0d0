// Package localcluster runs the real components that clusterip is tested and
// demonstrated against, on 127.0.0.1 only: an etcd server embedded in the
// process ([StartEtcd]) and a real kube-apiserver v1.33 started as a child
// process against it ([StartKubeAPIServer]).
//
// It is the part of the test harness that the clusterip command shares with
// the tests, so it must not import package testing (cmd/clusterip checks that
// the shipped binary links no testing code). The test helpers that take a
// testing.TB live in internal/testenv, on top of this package.
//
// A kube-apiserver binary is built from source once per clone (about
// 7 minutes and 2 GiB of RAM on 2 cores) from the nested module
// internal/kubeapiserver and cached under .cache/ at the repository root; see
// [KubeAPIServerBinary]. Set $CLUSTERIP_KUBE_APISERVER ([KubeAPIServerEnv])
// to use another binary.
package localcluster
