//go:build clusterip_slim

package main

import "github.com/spf13/cobra"

// buildLong is the sentence of the root command's help that says what this build is for.
const buildLong = `This is its slim build, the container image's: it audits, repairs and guards a
cluster, and has no demo and no bench (they start components of their own; the full build, go
install github.com/kube-ipam/clusterip/cmd/clusterip, has them).`

// buildVerbs returns no verb: the slim build has neither demo nor bench, so it links no etcd
// server and no plotting code (deps_test.go checks that).
func buildVerbs() []*cobra.Command { return nil }

// rootDemoExample and rootBenchExample are empty: the slim build has neither verb.
const (
	rootDemoExample  = ""
	rootBenchExample = ""
)
