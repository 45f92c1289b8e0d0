//go:build !clusterip_slim

package main

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/cmd/clusterip/internal/bench"
)

const benchLong = `Measure the library's allocators over range sizes and fill levels: one AllocateNext+Release pair
at steady fill (at 100% fill, one AllocateNext that fails with ErrFull), as ns/op, allocs/op and
B/op. Five allocators:

  bitmap               the legacy bitmap in memory (bitmap.New)
  bitmap+etcd          the bitmap persisted in an embedded etcd (bitmap.NewPersistent over
                       etcdstore), one compare-and-swap per operation
  ipaddress+fake       the IPAddress-object allocator (ipaddress.New) over client-go's fake
                       clientset: the allocator and the fake's object tracker, without a
                       network or an API server
  ipaddress+apiserver  the IPAddress-object allocator through a real kube-apiserver v1.33 on the
                       embedded etcd: one IPAddress create and one delete per operation
  dualwrite+apiserver  clusterip.New in DualWrite mode through that kube-apiserver: the
                       servicecidr allocator's IPAddress objects and a bitmap mirror in etcd

The two +apiserver allocators run when a kube-apiserver binary is at hand: --kube-apiserver,
else $CLUSTERIP_KUBE_APISERVER, else the one the tests built into .cache/ (never built here);
without one the table says they were skipped and why. Each of their fill levels is made of
IPAddress objects created one per address through the server, so their ranges are small.

Pass an empty list to leave an allocator out. IPv6 bitmaps hold at most 65535 addresses, as in
kube-apiserver. The table goes to stdout (or JSON with --json); --svg and --png draw ns/op by
fill level, one line per allocator and range. "clusterip bench stock-vs-fork" charts the rows of
the stock-vs-fork kube-apiserver benchmark instead.`

const benchExample = `  # Everything, with a chart
  clusterip bench --svg bench.svg

  # A quick run: the in-memory bitmap only, three fills, 50ms per measurement
  clusterip bench --ranges 10.0.0.0/12 --persistent-ranges "" --ipaddress-ranges "" \
      --apiserver-ranges "" --fills 0,99.9,100 --duration 50ms

  # Through a kube-apiserver binary of your own
  clusterip bench --kube-apiserver ./kube-apiserver --png bench.png

  # JSON for a script
  clusterip bench --json > bench.json`

func newBenchCommand() *cobra.Command {
	var (
		bitmapRanges     = []string{"10.0.0.0/24", "10.0.0.0/16", "10.0.0.0/12", "fd00::/108", "fd00::/64"}
		persistentRanges = []string{"10.0.0.0/24", "10.0.0.0/16"}
		ipaddressRanges  = []string{"10.0.0.0/24", "10.0.0.0/20"}
		apiServerRanges  = []string{"10.0.0.0/24", "10.0.0.0/20"}
		kubeAPIServer    string
		fills            = []float64{0, 50, 99, 99.9, 100}
		duration         = 200 * time.Millisecond
		svg, png         string
		asJSON           bool
	)
	cmd := &cobra.Command{
		Use:     "bench",
		Short:   "Measure the allocators over range sizes and fill levels, and draw a chart",
		Long:    benchLong,
		Example: benchExample,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts := bench.Options{Fills: fills, Duration: duration, Progress: cmd.ErrOrStderr()}
			var err error
			if opts.Bitmap, err = parsePrefixes("--ranges", bitmapRanges); err != nil {
				return err
			}
			if opts.Persistent, err = parsePrefixes("--persistent-ranges", persistentRanges); err != nil {
				return err
			}
			if opts.IPAddress, err = parsePrefixes("--ipaddress-ranges", ipaddressRanges); err != nil {
				return err
			}
			if opts.APIServer, err = parsePrefixes("--apiserver-ranges", apiServerRanges); err != nil {
				return err
			}
			if len(opts.Bitmap)+len(opts.Persistent)+len(opts.IPAddress)+len(opts.APIServer) == 0 {
				return fmt.Errorf("no range to measure: --ranges, --persistent-ranges, --ipaddress-ranges and --apiserver-ranges are all empty")
			}
			if kubeAPIServer != "" {
				if _, err := os.Stat(kubeAPIServer); err != nil {
					return fmt.Errorf("--kube-apiserver: %w", err)
				}
				opts.KubeAPIServer = kubeAPIServer
			}
			if len(fills) == 0 {
				return fmt.Errorf("no fill level to measure: --fills is empty")
			}
			for _, file := range []string{svg, png} {
				if file != "" && filepath.Ext(file) == "" {
					return fmt.Errorf("chart file %q has no extension to choose a format by (.svg, .png, .pdf)", file)
				}
			}
			if duration <= 0 {
				return fmt.Errorf("--duration %v: want a positive duration", duration)
			}
			results, err := bench.Run(cmd.Context(), opts)
			if err != nil {
				return err
			}
			for _, file := range []string{svg, png} {
				if file != "" {
					if err := bench.SaveChart(file, results); err != nil {
						return err
					}
				}
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(results)
			}
			return bench.WriteTable(out, results)
		},
	}
	cmd.AddCommand(newStockVsForkCommand())
	f := cmd.Flags()
	f.StringSliceVar(&bitmapRanges, "ranges", bitmapRanges, "ranges of the in-memory bitmap allocator")
	f.StringSliceVar(&persistentRanges, "persistent-ranges", persistentRanges, "ranges of the etcd-backed bitmap allocator (starts an embedded etcd)")
	f.StringSliceVar(&ipaddressRanges, "ipaddress-ranges", ipaddressRanges, "ranges of the IPAddress allocator over the fake clientset")
	f.StringSliceVar(&apiServerRanges, "apiserver-ranges", apiServerRanges, "ranges of the IPAddress and DualWrite allocators through a real kube-apiserver (at most 65536 addresses each)")
	f.StringVar(&kubeAPIServer, "kube-apiserver", "", "kube-apiserver v1.33 binary for the --apiserver-ranges (default: $CLUSTERIP_KUBE_APISERVER, else the cached test build; never built)")
	f.Float64SliceVar(&fills, "fills", fills, "fill levels in percent of each range's usable addresses")
	f.DurationVar(&duration, "duration", duration, "how long each measurement runs, after filling")
	f.StringVar(&svg, "svg", "", "draw ns/op by fill level into this SVG file")
	f.StringVar(&png, "png", "", "draw ns/op by fill level into this PNG file")
	f.BoolVar(&asJSON, "json", false, "print the results as JSON instead of a table")
	return cmd
}

// parsePrefixes parses the CIDRs given to flag name.
func parsePrefixes(name string, cidrs []string) ([]netip.Prefix, error) {
	var ps []netip.Prefix
	for _, c := range cidrs {
		if c == "" {
			continue
		}
		p, err := allocator.ParsePrefix(c)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		ps = append(ps, p)
	}
	return ps, nil
}
