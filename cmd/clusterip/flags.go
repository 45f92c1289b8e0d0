package main

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// The connection flags of every verb that talks to kube-apiserver (check, repair, and the
// reservations verbs, webhook included) are kubectl's, from cli-runtime's
// genericclioptions.ConfigFlags: --kubeconfig, --context, --cluster, --user, --server (-s),
// --tls-server-name, --certificate-authority, --client-certificate, --client-key, --token, --as,
// --as-group, --as-uid, --insecure-skip-tls-verify, --disable-compression and --request-timeout,
// with kubectl's loading rules and meanings. Two of kubectl's are left out: --namespace, since
// what the verbs read and write is cluster-scoped (the webhook's --namespace is its own flag), and
// --cache-dir, since no verb uses a discovery cache. --request-timeout defaults to 10s here, not
// kubectl's 0: check promises never to wait for ever on a silent server unless told to.

// kubeFlags are the connection flags of a verb. The zero value is not usable: see newKubeFlags.
type kubeFlags struct {
	*genericclioptions.ConfigFlags
	// timeout is --request-timeout. It is kept out of ConfigFlags, which would put it in the
	// kubeconfig overrides: client-go takes the in-cluster config only when the merged config
	// equals its default one, and any timeout but kubectl's default 0 makes them differ, so a
	// webhook Pod without a kubeconfig would not find its API server. kubeClient sets it on the
	// client's config instead.
	timeout string
}

// newKubeFlags returns the connection flags with this command's defaults. Each verb has its
// own: the command keeps no global state.
func newKubeFlags() *kubeFlags {
	f := genericclioptions.NewConfigFlags(false)
	f.CacheDir = nil
	f.Namespace = nil
	f.Timeout = nil
	return &kubeFlags{ConfigFlags: f, timeout: defaultRequestTimeout.String()}
}

// addFlags registers kube's flags on fs: ConfigFlags' and --request-timeout.
func (kube *kubeFlags) addFlags(fs *pflag.FlagSet) {
	kube.AddFlags(fs)
	fs.StringVar(&kube.timeout, "request-timeout", kube.timeout, "The length of time to wait before giving up on a single server request (and, for check and repair, on a call to etcd). Non-zero values should contain a corresponding time unit (e.g. 1s, 2m, 3h), or be whole seconds. A value of zero means don't timeout requests.")
}

// addKubeFlags registers kube's flags on fs, a flag set of cmd (its own or its persistent one),
// and the completion of --context, --cluster and --user from the kubeconfig the command line
// names.
func addKubeFlags(cmd *cobra.Command, fs *pflag.FlagSet, kube *kubeFlags) {
	kube.addFlags(fs)
	for flag, names := range map[string]func(*clientcmdapi.Config) []string{
		"context": func(c *clientcmdapi.Config) []string { return mapKeys(c.Contexts) },
		"cluster": func(c *clientcmdapi.Config) []string { return mapKeys(c.Clusters) },
		"user":    func(c *clientcmdapi.Config) []string { return mapKeys(c.AuthInfos) },
	} {
		_ = cmd.RegisterFlagCompletionFunc(flag, completeFromKubeconfig(kube, names))
	}
}

// mapKeys returns the keys of m, sorted.
func mapKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// completeFromKubeconfig completes a flag with the names names finds in the kubeconfig of kube's
// loading rules (--kubeconfig if given on the line being completed, else $KUBECONFIG, else
// ~/.kube/config) that start with what is typed, as kubectl completes --context. A kubeconfig
// that cannot be read completes nothing.
func completeFromKubeconfig(kube *kubeFlags, names func(*clientcmdapi.Config) []string) func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return func(_ *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		raw, err := kube.ToRawKubeConfigLoader().RawConfig()
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var out []string
		for _, n := range names(&raw) {
			if strings.HasPrefix(n, toComplete) {
				out = append(out, n)
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}

// requestTimeout returns kube's --request-timeout, read as kubectl reads it: a duration with a
// unit (10s, 2m), or whole seconds; 0 means no timeout.
func requestTimeout(kube *kubeFlags) (time.Duration, error) {
	d, err := clientcmd.ParseTimeout(kube.timeout)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("--request-timeout %q: want a duration with a unit (10s, 2m), whole seconds, or 0 for none", kube.timeout)
	}
	return d, nil
}

// errNoKubeconfig is the error of a command line that names no API server at all.
var errNoKubeconfig = errors.New("kubeconfig: none found ($KUBECONFIG is unset and ~/.kube/config is absent or empty, and no --server): give --kubeconfig or --server")

// kubeClient builds a client from kube's flags by kubectl's loading rules (--kubeconfig, else
// $KUBECONFIG, else ~/.kube/config, else the in-cluster config, with the other flags
// overriding), each call bounded by --request-timeout. It returns the client's config too, whose
// Host is the API server's address. A command line that names no API server at all is refused,
// not sent to kubectl's fallback of http://localhost:8080.
func kubeClient(kube *kubeFlags) (kubernetes.Interface, *rest.Config, error) {
	timeout, err := requestTimeout(kube)
	if err != nil {
		return nil, nil, err
	}
	loader := kube.ToRawKubeConfigLoader()
	restConfig, err := loader.ClientConfig()
	if clientcmd.IsEmptyConfig(err) {
		return nil, nil, errNoKubeconfig
	}
	if err != nil {
		return nil, nil, fmt.Errorf("kubeconfig: %w", err)
	}
	if restConfig.Host == clientcmd.ClusterDefaults.Server && (kube.APIServer == nil || *kube.APIServer == "") {
		// kubectl's default server: no kubeconfig named a cluster and no --server was given
		// (an in-cluster config has the Service's address).
		if raw, err := loader.RawConfig(); err == nil && len(raw.Clusters) == 0 {
			return nil, nil, errNoKubeconfig
		}
	}
	moveURLCredentials(restConfig)
	restConfig.Timeout = timeout
	restConfig.QPS, restConfig.Burst = 50, 100 // kubectl's QPS; repair makes a few calls per finding
	client, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		return nil, nil, fmt.Errorf("kubeconfig: %w", err)
	}
	return client, restConfig, nil
}

// outputError is kubectl's error for an -o value a verb cannot print, naming those it can.
func outputError(format string, allowed []string) error {
	return genericclioptions.NoCompatiblePrinterError{OutputFormat: &format, AllowedFormats: slices.Clone(allowed)}
}

// completeOutputs completes -o with the formats a verb prints.
func completeOutputs(cmd *cobra.Command, formats []string) {
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions(formats, cobra.ShellCompDirectiveNoFileComp))
}
