package main

import (
	"encoding/json"
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/kube-ipam/clusterip/internal/localcluster"
)

// versionInfo is what "clusterip version" prints.
type versionInfo struct {
	// Module is the clusterip module's version, "(devel)" when built from a work tree.
	Module string `json:"module"`
	// Go is the Go release the binary was built with.
	Go string `json:"go"`
	// KubeAPIServer is the kube-apiserver version the tests, the demo and bench run against.
	KubeAPIServer string `json:"kubeAPIServer"`
}

func currentVersion() versionInfo {
	v := versionInfo{Module: "(unknown)", Go: runtime.Version(), KubeAPIServer: localcluster.KubeAPIServerVersion}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		v.Module = bi.Main.Version
	}
	return v
}

func newVersionCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the clusterip module version, the Go version and the kube-apiserver version tested against",
		Example: `  clusterip version
  clusterip version --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v := currentVersion()
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(v)
			}
			_, err := fmt.Fprintf(out, "clusterip %s\ngo %s\nkube-apiserver %s (tested against)\n", v.Module, v.Go, v.KubeAPIServer)
			return err
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the versions as one JSON object")
	return cmd
}
