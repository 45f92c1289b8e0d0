// Command build-kube-apiserver builds the kube-apiserver binary that the
// integration tests run, unless it is cached already, and prints its path.
// CI runs it before "go test" so that the test timeout never covers the
// build, which takes about 7 minutes on 2 cores.
//
// With -release it builds stock kube-apiserver of that release instead of
// v1.33.13, from the nested module internal/kubeapiserver/<release>, into
// .cache/kube-apiserver-<release>/; "-release list" prints the releases it
// builds. The binary answers --version with its release:
//
//	go run ./internal/localcluster/cmd/build-kube-apiserver -release v1.37.2
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
	"strings"

	"github.com/kube-ipam/clusterip/internal/localcluster"
)

func main() {
	fork := flag.Bool("fork", false, "build the kube-apiserver fork on clusterip instead of the stock kube-apiserver")
	etcd := flag.Bool("etcd", false, "build the etcd server of the tests instead of kube-apiserver")
	release := flag.String("release", localcluster.KubeAPIServerVersion,
		"the kube-apiserver release to build, one of "+strings.Join(localcluster.KubeAPIServerReleases(), ", ")+`; "list" prints them`)
	flag.Parse()
	if *release == "list" {
		fmt.Println(strings.Join(localcluster.KubeAPIServerReleases(), "\n"))
		return
	}
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "build-kube-apiserver: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	if *fork && *etcd {
		fmt.Fprintln(os.Stderr, "build-kube-apiserver: -fork and -etcd exclude each other")
		os.Exit(2)
	}
	if *etcd && *release != localcluster.KubeAPIServerVersion {
		fmt.Fprintln(os.Stderr, "build-kube-apiserver: -etcd and -release exclude each other")
		os.Exit(2)
	}
	if *fork && *release != localcluster.KubeAPIServerVersion {
		fmt.Fprintf(os.Stderr, "build-kube-apiserver: the fork is built for %s only\n", localcluster.KubeAPIServerVersion)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	build := func(ctx context.Context) (string, error) {
		return localcluster.KubeAPIServerReleaseBinary(ctx, *release)
	}
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
