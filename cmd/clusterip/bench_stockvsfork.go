//go:build !clusterip_slim

package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/kube-ipam/clusterip/cmd/clusterip/internal/bench"
	"github.com/kube-ipam/clusterip/internal/forkbench"
)

const stockVsForkLong = `Draw the rows of the stock-vs-fork benchmark (TestStockVsFork in internal/kubeapiserverfork,
which writes them to $CLUSTERIP_FORK_BENCH_ROWS as JSON) as grouped bars, stock kube-apiserver
v1.33.13 against the fork in each allocator mode: churn create+delete pairs/s, scale creates/s,
and the scale p99 of the first and the last 1000 creates. Nothing is measured here.`

const stockVsForkExample = `  # Measure, then chart
  (cd internal/kubeapiserverfork && CLUSTERIP_FORK_BENCH=churn,scale CLUSTERIP_FORK_BENCH_ROWS=$PWD/rows.json \
      GOWORK=off go test -v -timeout 90m -run TestStockVsFork .)
  clusterip bench stock-vs-fork internal/kubeapiserverfork/rows.json --svg stock-vs-fork.svg

  # The chart of docs/benchmarks.md, from the rows it quotes
  clusterip bench stock-vs-fork cmd/clusterip/internal/bench/testdata/stock-vs-fork-2026-11-25.json \
      --svg docs/stock-vs-fork.svg`

func newStockVsForkCommand() *cobra.Command {
	var svg, png string
	cmd := &cobra.Command{
		Use:     "stock-vs-fork ROWS.json",
		Short:   "Chart the stock-vs-fork benchmark's rows: stock kube-apiserver against the fork, per mode",
		Long:    stockVsForkLong,
		Example: stockVsForkExample,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if svg == "" && png == "" {
				return fmt.Errorf("nothing to draw: give --svg or --png")
			}
			for _, file := range []string{svg, png} {
				if file != "" && filepath.Ext(file) == "" {
					return fmt.Errorf("chart file %q has no extension to choose a format by (.svg, .png, .pdf)", file)
				}
			}
			f, err := os.Open(args[0])
			if err != nil {
				return err
			}
			defer f.Close()
			rows, err := forkbench.Parse(f)
			if err != nil {
				return fmt.Errorf("%s: %w", args[0], err)
			}
			for _, file := range []string{svg, png} {
				if file != "" {
					if err := bench.SaveStockVsForkChart(file, rows); err != nil {
						return err
					}
					fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: %d churn and %d scale rows\n", file, len(rows.Churn), len(rows.Scale))
				}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&svg, "svg", "", "draw the chart into this SVG file")
	f.StringVar(&png, "png", "", "draw the chart into this PNG file")
	return cmd
}
