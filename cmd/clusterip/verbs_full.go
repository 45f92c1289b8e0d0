//go:build !clusterip_slim

package main

import "github.com/spf13/cobra"

// buildLong is the sentence of the root command's help that says what this build is for.
const buildLong = `This command shows the library at work on real components it starts itself.`

// buildVerbs returns the verbs that only the full build has: demo, which runs an etcd server in
// this process, and bench, which draws charts with gonum. The slim build (-tags clusterip_slim,
// the container image's binary) leaves them out, and with them those dependencies.
func buildVerbs() []*cobra.Command {
	return []*cobra.Command{newDemoCommand(), newBenchCommand()}
}

// rootDemoExample and rootBenchExample are the demo's and bench's part of the root command's
// examples (rootExample).
const (
	rootDemoExample = `  # Walk a cluster through the allocator upgrade (Legacy, DualWrite, IPAddressOnly)
  clusterip demo

`
	rootBenchExample = `  # Measure the in-memory bitmap at three fill levels and draw the chart
  clusterip bench --ranges 10.0.0.0/24,10.0.0.0/12 --fills 0,50,99.9 --svg bench.svg

`
)
