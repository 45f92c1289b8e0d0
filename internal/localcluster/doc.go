// Package localcluster runs the real components that clusterip is tested and
// demonstrated against, on 127.0.0.1 only, each as a child process that the
// kernel kills if this process dies first (on Linux): an etcd server, one member
// ([StartEtcd]) or several ([StartEtcdCluster]), and a real kube-apiserver v1.33
// against it ([StartKubeAPIServer]).
//
// It is the part of the test harness that the clusterip command shares with
// the tests, so it must not import package testing (cmd/clusterip checks that
// the shipped binary links no testing code). The test helpers that take a
// testing.TB live in internal/testenv, on top of this package.
//
// A kube-apiserver binary is built from source once per clone (about
// 7 minutes and 2 GiB of RAM on 2 cores) from the nested module
// internal/kubeapiserver/v1.33.13 and cached under .cache/ at the repository
// root; see [KubeAPIServerBinary]. Set $CLUSTERIP_KUBE_APISERVER
// ([KubeAPIServerEnv]) to use another binary. Every other supported release
// ([KubeAPIServerReleases]) is built the same way from its own nested module
// when a caller asks for it ([KubeAPIServerReleaseBinary],
// [KubeAPIServerOptions.Release]).
//
// The etcd server is go.etcd.io/etcd/server/v3 v3.5.21's embedded server
// wrapped in a small command, the nested module internal/localcluster/etcdserver,
// built the same way into .cache/ (a minute or two on 2 cores; see [EtcdBinary];
// $CLUSTERIP_ETCD, [EtcdEnv], names another build of it). It runs in a process of
// its own so that the etcd server and its dependencies stay out of the
// library's module graph: the library module requires only etcd's client.
// The clusterip command, whose module may require the server and which must run
// without a clone of the repository, starts the same server in its own process
// instead ([EtcdOptions.Start], [EtcdStarter]); package embedded of that nested
// module configures it in both cases.
package localcluster
