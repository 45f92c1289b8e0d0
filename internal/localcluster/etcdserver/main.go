// Command etcdserver runs one etcd member for the tests: the embedded etcd server of
// go.etcd.io/etcd/server/v3 (see package embedded), in a process of its own, so that the server
// and its dependencies stay out of the library's module graph. package localcluster builds it
// and runs it as a child process (see localcluster.EtcdBinary); it is not meant to be run by
// hand.
//
// Its one argument is the member's configuration as JSON (see package embedded). It logs nothing
// but a failure, on stderr; once the member serves clients it prints "ready" on stdout. It stops
// on SIGTERM or SIGINT, closing the server; a SIGKILL loses nothing that an fsync covered, so a
// new process on the same data directory carries on.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/kube-ipam/clusterip/internal/localcluster/etcdserver/embedded"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: etcdserver CONFIG-JSON")
		os.Exit(2)
	}
	// Handle the signals before the server starts, so that one sent while it starts still
	// closes it.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	m, err := embedded.Start([]byte(os.Args[1]))
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcdserver:", err)
		os.Exit(1)
	}
	select {
	case <-m.Ready():
		fmt.Println("ready")
	case <-m.Done():
		fmt.Fprintln(os.Stderr, "etcdserver:", m.Err())
		os.Exit(1)
	case <-sig:
		m.Close()
		return
	}
	select {
	case <-m.Done():
		fmt.Fprintln(os.Stderr, "etcdserver:", m.Err())
		os.Exit(1)
	case <-sig:
		m.Close()
	}
}
