package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/localcluster"
)

// versionInfo is what "clusterip version" prints; -o json and -o yaml print it as it marshals.
type versionInfo struct {
	// ClusteripVersion is the version of the module the command was built from: the release's
	// (v0.1.0) when installed with go install …@v0.1.0, "(devel)" when built from a work tree
	// without version control information, a pseudo-version when built from a clone with it, the
	// image's version in a container image's binary (stampedVersion).
	ClusteripVersion string `json:"clusteripVersion"`
	// GoVersion is the Go release the binary was built with.
	GoVersion string `json:"goVersion"`
	// Platform is the operating system and architecture the binary was built for, such as
	// "linux/amd64".
	Platform string `json:"platform"`
	// KubeAPIServer says which kube-apiserver releases the command speaks.
	KubeAPIServer kubeAPIServerVersions `json:"kubeAPIServer"`
}

// kubeAPIServerVersions are the kube-apiserver releases the command speaks, from package
// featuregate, and the one its demo starts.
type kubeAPIServerVersions struct {
	// Releases are the minor releases whose behaviour the library has, oldest first
	// (featuregate.SupportedReleases).
	Releases []string `json:"releases"`
	// Default is the release the library behaves as when it is not told otherwise
	// (featuregate.DefaultKubeVersion).
	Default string `json:"default"`
	// Newest is the newest build whose behaviour the library has, a pre-release until it ships
	// (featuregate.NewestKubeVersion).
	Newest string `json:"newest"`
	// Demo is the release "clusterip demo" and "clusterip bench" start.
	Demo string `json:"demo"`
}

// stampedVersion is the version an image build gives the binary at link time (go build -ldflags
// "-X main.stampedVersion=v0.1.0", as hack/image.sh and the Dockerfile do): their go build of a
// work tree records no module version ("(devel)"). Empty in any other build. It is set by the
// linker only and never changes while the program runs.
var stampedVersion string

// currentVersion returns the versions of this binary; build is its build information, if any,
// and stamped its stampedVersion, which takes the place of the main module's version when it is
// not empty.
func currentVersion(build *debug.BuildInfo, stamped string) versionInfo {
	v := versionInfo{
		ClusteripVersion: "(unknown)",
		GoVersion:        runtime.Version(),
		Platform:         runtime.GOOS + "/" + runtime.GOARCH,
		KubeAPIServer: kubeAPIServerVersions{
			Releases: featuregate.SupportedReleases(),
			Default:  featuregate.DefaultKubeVersion,
			Newest:   featuregate.NewestKubeVersion,
			Demo:     localcluster.KubeAPIServerVersion,
		},
	}
	switch {
	case stamped != "":
		v.ClusteripVersion = stamped
	case build != nil && build.Main.Version != "":
		v.ClusteripVersion = build.Main.Version
	}
	return v
}

// versionOutputs are the values of "clusterip version -o" besides the default, kubectl
// version's.
var versionOutputs = []string{"json", "yaml"}

// versionOptions are the flags of "clusterip version".
type versionOptions struct {
	output string // "", json or yaml
	json   bool   // deprecated: -o json
}

// validate checks the flags before anything is printed, and turns the deprecated --json into
// -o json with a warning on stderr.
func (o *versionOptions) validate(cmd *cobra.Command) error {
	if o.json {
		if cmd.Flags().Changed("output") {
			return fmt.Errorf("--json is the deprecated spelling of -o json: give one of them")
		}
		deprecated(cmd.ErrOrStderr(), "--json", "-o json")
		o.output = "json"
	}
	switch o.output {
	case "", "json", "yaml":
		return nil
	}
	return outputError(o.output, versionOutputs)
}

// print writes v to out as o.output asks: three lines of text by default.
func (o *versionOptions) print(out io.Writer, v versionInfo) error {
	if o.output == "" {
		k := v.KubeAPIServer
		_, err := fmt.Fprintf(out, "clusterip %s\ngo %s %s\nkube-apiserver %s (default %s, newest %s; the demo runs %s)\n",
			v.ClusteripVersion, v.GoVersion, v.Platform, strings.Join(k.Releases, ", "), k.Default, k.Newest, k.Demo)
		return err
	}
	return writeJSONOrYAML(out, v, o.output)
}

func newVersionCommand() *cobra.Command {
	var o versionOptions
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the clusterip version, the Go version and the kube-apiserver releases it speaks",
		Long: `Print the version of the clusterip module the command was built from, the Go release and
platform it was built with, and the kube-apiserver releases it speaks: the minor releases whose
behaviour it has, the one it behaves as by default, the newest build it knows and the one
"clusterip demo" starts.`,
		Example: `  clusterip version
  clusterip version -o json
  clusterip version -o yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.validate(cmd); err != nil {
				return err
			}
			build, _ := debug.ReadBuildInfo()
			return o.print(cmd.OutOrStdout(), currentVersion(build, stampedVersion))
		},
	}
	cmd.Flags().StringVarP(&o.output, "output", "o", "", "output format: one of "+strings.Join(versionOutputs, ", ")+" (default: text)")
	cmd.Flags().BoolVar(&o.json, "json", false, "deprecated: use -o json")
	_ = cmd.Flags().MarkHidden("json")
	completeOutputs(cmd, versionOutputs)
	return cmd
}
