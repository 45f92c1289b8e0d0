// Command build-kube-apiserver builds the kube-apiserver binary that the
// integration tests run, unless it is cached already, and prints its path.
// CI runs it before "go test" so that the test timeout never covers the
// build, which takes about 7 minutes on 2 cores.
//
// With -fork it builds the kube-apiserver fork on clusterip instead, from
// the nested module internal/kubeapiserverfork: the same version with the
// module's patches and overlay files, cached beside the stock binary under a
// hash of its inputs.
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
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	build := localcluster.KubeAPIServerBinary
	if *fork {
		build = localcluster.KubeAPIServerForkBinary
	}
	path, err := build(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(path)
}
