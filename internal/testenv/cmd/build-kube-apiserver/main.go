// Command build-kube-apiserver builds the kube-apiserver binary that the
// integration tests run, unless it is cached already, and prints its path.
// CI runs it before "go test" so that the test timeout never covers the
// build, which takes about 6 minutes.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"

	"github.com/kube-ipam/clusterip/internal/testenv"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	path, err := testenv.KubeAPIServerBinary(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(path)
}
