// Command clusterip runs the clusterip library's allocators against real components.
//
// Usage:
//
//	clusterip demo [flags]   allocate through two allocators sharing an (embedded) etcd
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/internal/demo"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "clusterip:", err)
		os.Exit(1)
	}
}

const usage = `usage: clusterip <command> [flags]

commands:
  demo    allocate Service IPs through two bitmap allocators that share one etcd key,
          in kube-apiserver's format (an embedded etcd unless -etcd is given)
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return fmt.Errorf("no command")
	}
	switch args[0] {
	case "demo":
		return runDemo(ctx, args[1:], stdout, stderr)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("unknown command %q", args[0])
}

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cidr := fs.String("cidr", "10.96.0.0/20", "Service CIDR to allocate from")
	count := fs.Int("n", 3000, "number of addresses to allocate")
	workers := fs.Int("workers", 4, "goroutines per allocator")
	etcd := fs.String("etcd", "", "comma-separated etcd endpoints (default: start an embedded etcd)")
	prefix := fs.String("etcd-prefix", "/registry", "etcd key prefix, as kube-apiserver's --etcd-prefix")
	if err := fs.Parse(args); err != nil {
		return err
	}
	p, err := allocator.ParsePrefix(*cidr)
	if err != nil {
		return err
	}
	opts := demo.Options{CIDR: p, Count: *count, Workers: *workers, Prefix: *prefix, Out: stdout}
	if *etcd != "" {
		opts.EtcdEndpoints = strings.Split(*etcd, ",")
	}
	return demo.Run(ctx, opts)
}
