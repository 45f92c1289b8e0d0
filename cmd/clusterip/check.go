package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
)

const checkLong = `Audit a live cluster's Service IP allocation, read-only unless --repair: Services, ServiceCIDRs,
IPAddress objects and, with --etcd-endpoints, the legacy bitmaps kube-apiserver keeps in etcd.

Exit codes: 0 consistent; 1 inconsistencies found; 2 could not run (bad flags, no kubeconfig,
an unreachable API server or etcd, no RangeAllocation under --etcd-prefix), with one line on
stderr saying why.

Not finished: the flags, the connections and the mode are checked, but the audit itself waits
for the repair package; until it lands, check exits 2 after its connection checks, saying so.`

const checkExample = `  # Audit the cluster of the current kubeconfig context; the bitmaps are not read
  clusterip check

  # Audit another context, the bitmaps too, as JSON
  clusterip check --context prod --etcd-endpoints https://10.0.0.2:2379 \
      --etcd-cacert ca.crt --etcd-cert client.crt --etcd-key client.key -o json

  # Repair what the audit finds, freeing leaks held for 5 minutes or more
  clusterip check --repair --leak-grace 5m`

// checkOptions are the flags of "clusterip check".
type checkOptions struct {
	kubeconfig, context           string
	etcdEndpoints                 []string
	etcdCACert, etcdCert, etcdKey string
	etcdPrefix, mode, output      string
	repair                        bool
	leakGrace                     time.Duration
}

var (
	checkModes   = []string{"auto", featuregate.Legacy.String(), featuregate.DualWrite.String(), featuregate.IPAddressOnly.String()}
	checkOutputs = []string{"table", "json", "yaml"}
)

func newCheckCommand() *cobra.Command {
	o := checkOptions{etcdPrefix: etcdstore.DefaultPrefix, mode: "auto", output: "table", leakGrace: time.Minute}
	cmd := &cobra.Command{
		Use:     "check",
		Short:   "Audit a live cluster's Service IP allocation (read-only unless --repair)",
		Long:    checkLong,
		Example: checkExample,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "path to the kubeconfig file (default: kubectl's loading rules, $KUBECONFIG then ~/.kube/config)")
	f.StringVar(&o.context, "context", "", "the kubeconfig context to use (default: its current context)")
	f.StringSliceVar(&o.etcdEndpoints, "etcd-endpoints", nil, "etcd endpoints (URL[,URL]) to read the legacy bitmaps from; without them the bitmaps are not read")
	f.StringVar(&o.etcdCACert, "etcd-cacert", "", "CA bundle to verify the etcd server's certificate with")
	f.StringVar(&o.etcdCert, "etcd-cert", "", "client certificate for etcd (with --etcd-key)")
	f.StringVar(&o.etcdKey, "etcd-key", "", "client key for etcd (with --etcd-cert)")
	f.StringVar(&o.etcdPrefix, "etcd-prefix", o.etcdPrefix, "etcd key prefix, as kube-apiserver's --etcd-prefix")
	f.StringVar(&o.mode, "mode", o.mode, "allocation mode: auto (kube-apiserver's default for its version), "+strings.Join(checkModes[1:], ", "))
	f.StringVarP(&o.output, "output", "o", o.output, "output format: "+strings.Join(checkOutputs, ", "))
	f.BoolVar(&o.repair, "repair", false, "repair what the audit finds, then audit again")
	f.DurationVar(&o.leakGrace, "leak-grace", o.leakGrace, "with --repair, how long a leaked IP must stay leaked before it is freed; 0 frees at once")
	_ = cmd.RegisterFlagCompletionFunc("mode", cobra.FixedCompletions(checkModes, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions(checkOutputs, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

// validate checks the flags on their own, before anything is contacted.
func (o *checkOptions) validate() error {
	switch {
	case !slices.Contains(checkModes, o.mode):
		return fmt.Errorf("--mode %q: want one of %s", o.mode, strings.Join(checkModes, ", "))
	case !slices.Contains(checkOutputs, o.output):
		return fmt.Errorf("-o %q: want one of %s", o.output, strings.Join(checkOutputs, ", "))
	case o.leakGrace < 0:
		return fmt.Errorf("--leak-grace %v: want 0 or more", o.leakGrace)
	case (o.etcdCert == "") != (o.etcdKey == ""):
		return errors.New("--etcd-cert and --etcd-key go together: give both or neither")
	case len(o.etcdEndpoints) == 0 && (o.etcdCACert != "" || o.etcdCert != ""):
		return errors.New("--etcd-cacert, --etcd-cert and --etcd-key need --etcd-endpoints")
	case !strings.HasPrefix(o.etcdPrefix, "/"):
		return fmt.Errorf("--etcd-prefix %q: want an absolute key prefix such as /registry", o.etcdPrefix)
	}
	return nil
}

func (o *checkOptions) run(ctx context.Context) error {
	if err := o.validate(); err != nil {
		return err
	}
	// kubectl's loading rules: --kubeconfig, else $KUBECONFIG, else ~/.kube/config.
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = o.kubeconfig
	kubeConfig := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: o.context})
	restConfig, err := kubeConfig.ClientConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	restConfig.Timeout = 10 * time.Second
	client, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	if len(o.etcdEndpoints) > 0 {
		etcd, err := o.etcdClient(ctx)
		if err != nil {
			return err
		}
		defer etcd.Close()
	}
	info, err := client.Discovery().ServerVersion()
	if err != nil {
		return fmt.Errorf("API server at %s: %w", restConfig.Host, err)
	}
	mode, err := o.modeFor(info.GitVersion)
	if err != nil {
		return err
	}
	// TODO(issue 12): audit with repair.Audit (and, with --repair, repair.NewController and
	// RunOnce until nothing is held off) once the repair package lands; print the report as
	// -o asks and exit 0 or 1 by Report.Consistent.
	return fmt.Errorf("check: connected to kube-apiserver %s (mode %s) but cannot audit yet: the audit waits for the repair package", info.GitVersion, mode)
}

// modeFor returns the --mode asked for, or with auto the default mode of kube-apiserver at
// version v.
func (o *checkOptions) modeFor(v string) (featuregate.Mode, error) {
	if o.mode != "auto" {
		return featuregate.ParseMode(o.mode)
	}
	mode, err := featuregate.ModeFor(v)
	if err != nil {
		return 0, fmt.Errorf("--mode auto: %w; give --mode", err)
	}
	return mode, nil
}

// etcdClient connects to --etcd-endpoints and checks that the bitmaps are under --etcd-prefix.
func (o *checkOptions) etcdClient(ctx context.Context) (*clientv3.Client, error) {
	cfg := clientv3.Config{Endpoints: o.etcdEndpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
	if o.etcdCACert != "" || o.etcdCert != "" {
		tlsInfo := transport.TLSInfo{CertFile: o.etcdCert, KeyFile: o.etcdKey, TrustedCAFile: o.etcdCACert}
		tlsConfig, err := tlsInfo.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("etcd TLS: %w", err)
		}
		cfg.TLS = tlsConfig
	}
	client, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcd at %s: %w", strings.Join(o.etcdEndpoints, ","), err)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	key := etcdstore.ServiceIPsKey(o.etcdPrefix)
	resp, err := client.Get(ctx, key, clientv3.WithCountOnly())
	if err != nil {
		client.Close()
		return nil, fmt.Errorf("etcd at %s unreachable: %w", strings.Join(o.etcdEndpoints, ","), err)
	}
	if resp.Count == 0 {
		client.Close()
		return nil, fmt.Errorf("etcd at %s has no RangeAllocation at %s: is --etcd-prefix %s kube-apiserver's?", strings.Join(o.etcdEndpoints, ","), key, o.etcdPrefix)
	}
	return client, nil
}
