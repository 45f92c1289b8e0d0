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
// With -fork it builds the kube-apiserver fork on clusterip of the release
// instead, from its folder forks/<release>: the same release with the fork's
// patches and new files, cached beside the stock binary under a hash of its
// inputs. With -fork -check it only applies the patches and compiles the
// packages they change, in a temporary directory, and prints those packages:
//
//	go run ./internal/localcluster/cmd/build-kube-apiserver -fork -release v1.37.2
//	go run ./internal/localcluster/cmd/build-kube-apiserver -fork -check -release v1.35.4
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
	check := flag.Bool("check", false, "with -fork: apply the fork's patches and compile the packages they change, without building kube-apiserver")
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
	if *check && !*fork {
		fmt.Fprintln(os.Stderr, "build-kube-apiserver: -check needs -fork")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	build := func(ctx context.Context) (string, error) {
		return localcluster.KubeAPIServerReleaseBinary(ctx, *release)
	}
	switch {
	case *check:
		build = func(ctx context.Context) (string, error) {
			pkgs, err := localcluster.CheckKubeAPIServerFork(ctx, *release)
			return strings.Join(pkgs, "\n"), err
		}
	case *fork:
		build = func(ctx context.Context) (string, error) {
			return localcluster.KubeAPIServerForkReleaseBinary(ctx, *release)
		}
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
