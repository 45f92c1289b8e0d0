//go:build !clusterip_slim

package main

import (
	"encoding/json"
	"io"
	"os"
	"strings"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"golang.org/x/term"
	"k8s.io/klog/v2"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/cmd/clusterip/internal/demo"
)

const demoLong = `Walk one cluster through the upgrade of its Service IP allocators, as kube-apiserver 1.32 → 1.33 →
1.34 would, with two kube-apiservers played by this process on one etcd:

  1. Legacy: both allocate ClusterIPs from the bitmaps in etcd, at kube-apiserver's keys.
  2. DualWrite beside Legacy: one is upgraded and writes an IPAddress object as well as the bit,
     while the other still writes bits only (the version-skew window).
  3. IPAddressOnly: a repair pass migrates the addresses only the bitmaps record to IPAddress
     objects, then both allocate IPAddress objects only.

In each phase their workers create and delete Services concurrently for --duration, with a
progress bar on a terminal (plain lines otherwise); a table then gives, per phase, kube-apiserver
and IP family, the Services allocated and released, conflicts retried, undo operations, the p50
and p99 latency of an allocation, and the audit of package repair after each phase. Every address
handed out is checked against those held: duplicates must be 0.

An embedded etcd is started unless --etcd-servers is given (kube-apiserver's flag; --etcd, its
previous spelling, works until the next release with a warning). Services, ServiceCIDRs and IPAddress objects
go to a real kube-apiserver v1.33 if its binary is already built ($CLUSTERIP_KUBE_APISERVER, or the
repository's .cache/) or --kube-apiserver is given, else to client-go's fake clientset; the first
line says which. Exits 0 when every check holds, 2 when the demo could not run or a check failed.`

const demoExample = `  # The upgrade walk on an embedded etcd, about a minute
  clusterip demo

  # With a real kube-apiserver v1.33 storing the Services and IPAddress objects
  clusterip demo --kube-apiserver .cache/kube-apiserver-v1.33.13/kube-apiserver

  # A shorter walk over one IPv4 range, as one JSON document
  clusterip demo --service-cluster-ip-range 10.96.0.0/22 --duration 3s -n 300 --json

  # Against your own etcd, under a test prefix
  clusterip demo --etcd-servers http://127.0.0.1:2379 --etcd-prefix /clusterip-demo`

func newDemoCommand() *cobra.Command {
	ranges := "10.96.0.0/20,fd00:10:96::/112"
	var opts demo.Options
	var etcdServers []string
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "demo",
		Short:   "Walk a cluster through the allocator upgrade: Legacy, DualWrite beside Legacy, IPAddressOnly",
		Long:    demoLong,
		Example: demoExample,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := warnOldSpellings(cmd, cmd.ErrOrStderr()); err != nil {
				return err
			}
			for _, r := range strings.Split(ranges, ",") {
				p, err := allocator.ParsePrefix(strings.TrimSpace(r))
				if err != nil {
					return err
				}
				opts.Ranges = append(opts.Ranges, p)
			}
			opts.EtcdEndpoints = etcdServers
			out := cmd.OutOrStdout()
			opts.Out = out
			if isTerminal(out) {
				opts.Progress = out
			}
			if asJSON {
				opts.Out, opts.Progress = nil, nil // the summary alone, as JSON
				if isTerminal(cmd.ErrOrStderr()) {
					opts.Progress = cmd.ErrOrStderr()
				}
			}
			if !klog.V(1).Enabled() {
				// The informers of client-go and the allocators log their start at level 0,
				// and not all through the context's logger; the demo's own lines say what
				// matters, so the library's logs show from -v 1 on.
				klog.SetLogger(logr.Discard())
			}
			sum, err := demo.Measure(cmd.Context(), opts)
			if asJSON && sum != nil {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				if eerr := enc.Encode(sum); eerr != nil && err == nil {
					err = eerr
				}
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&ranges, "service-cluster-ip-range", ranges, "Service range(s), as kube-apiserver's --service-cluster-ip-range: one CIDR, or an IPv4 and an IPv6 CIDR separated by a comma")
	f.StringVar(&ranges, "cidr", ranges, "short for --service-cluster-ip-range")
	f.IntVarP(&opts.Hold, "services", "n", 1000, "about how many Services the workload keeps")
	f.IntVar(&opts.Workers, "workers", 4, "goroutines per kube-apiserver played")
	f.DurationVar(&opts.PhaseDuration, "duration", 15e9, "how long each of the three phases creates and deletes Services")
	f.StringSliceVar(&etcdServers, "etcd-servers", nil, "etcd servers (scheme://ip:port, comma-separated), as kube-apiserver's --etcd-servers (default: start an embedded etcd)")
	f.StringVar(&opts.Prefix, "etcd-prefix", "/registry", "etcd key prefix of the bitmaps, as kube-apiserver's --etcd-prefix")
	addOldSpelling(cmd, "etcd", "etcd-servers")
	f.StringVar(&opts.KubeAPIServer, "kube-apiserver", "", "path of a kube-apiserver v1.33 binary to store the objects in (default: the tests' build if it is there, else a fake clientset)")
	f.BoolVar(&opts.FakeAPI, "fake-api", false, "use client-go's fake clientset even if a kube-apiserver binary is there")
	f.BoolVar(&asJSON, "json", false, "print what the demo saw as one JSON document instead of lines of text and a table")
	return cmd
}

// isTerminal reports whether w is a terminal with a width, where progress bars can be drawn.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return false
	}
	width, _, err := term.GetSize(int(f.Fd()))
	return err == nil && width > 0
}
