// Command clusterip runs the clusterip library's allocators against real components.
//
// Usage:
//
//	clusterip demo [flags]   allocate through two allocators sharing an (embedded) etcd
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"strings"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/cmd/clusterip/internal/demo"
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
  demo    allocate Service IPs through two bitmap allocators that share one etcd key per
          range, in kube-apiserver's format and at its keys (an embedded etcd unless -etcd
          is given)
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
	ranges := "10.96.0.0/20"
	const rangesUsage = "Service range(s) to allocate from, as kube-apiserver's --service-cluster-ip-range: one CIDR, or an IPv4 and an IPv6 CIDR separated by a comma; the first one's bitmap is stored at ranges/serviceips, the second's at ranges/secondaryserviceips"
	fs.StringVar(&ranges, "service-cluster-ip-range", ranges, rangesUsage)
	fs.StringVar(&ranges, "cidr", ranges, "short for -service-cluster-ip-range")
	count := fs.Int("n", 3000, "number of addresses to allocate in each range")
	workers := fs.Int("workers", 4, "goroutines per allocator")
	etcd := fs.String("etcd", "", "comma-separated etcd endpoints (default: start an embedded etcd)")
	prefix := fs.String("etcd-prefix", "/registry", "etcd key prefix, as kube-apiserver's --etcd-prefix")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil // the usage is printed
		}
		return err
	}
	var prefixes []netip.Prefix
	for _, r := range strings.Split(ranges, ",") {
		p, err := allocator.ParsePrefix(strings.TrimSpace(r))
		if err != nil {
			return err
		}
		prefixes = append(prefixes, p)
	}
	opts := demo.Options{Ranges: prefixes, Count: *count, Workers: *workers, Prefix: *prefix, Out: stdout}
	if *etcd != "" {
		opts.EtcdEndpoints = strings.Split(*etcd, ",")
	}
	return demo.Run(ctx, opts)
}
