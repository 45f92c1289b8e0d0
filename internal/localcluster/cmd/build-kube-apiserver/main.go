// Command build-kube-apiserver builds the kube-apiserver binary that the
// integration tests run, unless it is cached already, and prints its path.
// CI runs it before "go test" so that the test timeout never covers the
// build, which takes about 7 minutes on 2 cores.
//
// With -fork it builds the kube-apiserver fork on clusterip instead, from
// the nested module internal/kubeapiserverfork: the same version with the
// module's patches and overlay files, cached beside the stock binary under a
// hash of its inputs.
//
// With -etcd it builds the etcd server that the tests and the demo run instead, from the nested
// module internal/localcluster/etcdserver (see localcluster.EtcdBinary).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"

	"github.com/kube-ipam/clusterip/internal/localcluster"
)

func main() {
	fork := flag.Bool("fork", false, "build the kube-apiserver fork on clusterip instead of the stock kube-apiserver")
	etcd := flag.Bool("etcd", false, "build the etcd server of the tests instead of kube-apiserver")
	flag.Parse()
	if *fork && *etcd {
		fmt.Fprintln(os.Stderr, "build-kube-apiserver: -fork and -etcd exclude each other")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	build := localcluster.KubeAPIServerBinary
	switch {
	case *fork:
		build = localcluster.KubeAPIServerForkBinary
	case *etcd:
		build = localcluster.EtcdBinary
	}
	path, err := build(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(path)
}
