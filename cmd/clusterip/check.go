package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	// Named cip: the tests of this package have a helper named clusterip.
	cip "github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/repair"
)

const checkLong = `Audit a live cluster's Service IP allocation, read-only unless --repair: Services, ServiceCIDRs,
IPAddress objects and, with --etcd-endpoints, the legacy bitmaps kube-apiserver keeps in etcd.
Without --etcd-endpoints the bitmaps are not read, and the output says so.

The Service CIDRs are found in the cluster: the ranges of the bitmaps' RangeAllocation objects
under --etcd-prefix, or without etcd the "kubernetes" ServiceCIDR. --mode auto judges by the mode
kube-apiserver runs in by default at its version (Legacy up to 1.32, DualWrite in 1.33,
IPAddressOnly from 1.34); give --mode if its feature gates differ.

-o json and -o yaml print the report alone; -o table adds the repair plan: what --repair does
about each finding. --repair repairs with compare-and-swap writes and preconditioned deletes,
passing again (a progress line on stderr) until no leak is held off by --leak-grace, then audits
again; that audit is printed and decides the exit code.

Every call to the API server and to etcd is bounded by --request-timeout (10s): an API server or
etcd that accepts the connection and stops answering makes check exit 2, never wait forever.
--repair as a whole, its passes and its waits for --leak-grace, is bounded by --repair-timeout
(10m), which should be longer than --leak-grace.

--leak-grace 0 frees a leak as soon as a pass sees it. An allocation in flight looks like a leak
for a moment: kube-apiserver and this library write the IPAddress object (and the bit) before
the Service, so between the two an IPAddress is held by no Service. With no hold-off --repair may
delete that record while its Service is being created, and the Service then holds an address
that another Service can be given. Use 0 only on a cluster where nothing allocates meanwhile
(kube-apiserver's own repair waits 60s); the default 1m covers an allocation in flight.

Permissions: check reads Services, ServiceCIDRs and IPAddress objects (get, list); --repair also
creates, updates and deletes IPAddress objects. The ClusterRoles clusterip-check and
clusterip-check-repair in deploy/rbac of the clusterip repository grant exactly that. Before it
reads anything, check asks the API server whether it has them (SelfSubjectAccessReview) and names
any it lacks.

Exit codes: 0 consistent; 1 inconsistencies found; 2 could not run (bad flags, no kubeconfig,
an unreachable or silent API server or etcd, no RangeAllocation under --etcd-prefix, missing RBAC
permissions, --repair past --repair-timeout), with one line on stderr saying why.`

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
	requestTimeout, repairTimeout time.Duration
}

var (
	checkModes   = []string{"auto", featuregate.Legacy.String(), featuregate.DualWrite.String(), featuregate.IPAddressOnly.String()}
	checkOutputs = []string{"table", "json", "yaml"}
)

func newCheckCommand() *cobra.Command {
	o := checkOptions{etcdPrefix: etcdstore.DefaultPrefix, mode: "auto", output: "table", leakGrace: time.Minute,
		requestTimeout: defaultRequestTimeout, repairTimeout: defaultRepairTimeout}
	cmd := &cobra.Command{
		Use:     "check",
		Short:   "Audit a live cluster's Service IP allocation (read-only unless --repair)",
		Long:    checkLong,
		Example: checkExample,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr())
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
	f.DurationVar(&o.leakGrace, "leak-grace", o.leakGrace, "with --repair, how long a leaked IP must stay leaked before it is freed; 0 frees at once, which can free the record of an allocation still in flight")
	f.DurationVar(&o.requestTimeout, "request-timeout", o.requestTimeout, "how long each call to the API server or etcd may take before check gives up (exit 2)")
	f.DurationVar(&o.repairTimeout, "repair-timeout", o.repairTimeout, "with --repair, how long the repair passes and their waits may take in all before check gives up (exit 2)")
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
	case o.requestTimeout <= 0:
		return fmt.Errorf("--request-timeout %v: want more than 0", o.requestTimeout)
	case o.repairTimeout <= 0:
		return fmt.Errorf("--repair-timeout %v: want more than 0", o.repairTimeout)
	case (o.etcdCert == "") != (o.etcdKey == ""):
		return errors.New("--etcd-cert and --etcd-key go together: give both or neither")
	case len(o.etcdEndpoints) == 0 && (o.etcdCACert != "" || o.etcdCert != ""):
		return errors.New("--etcd-cacert, --etcd-cert and --etcd-key need --etcd-endpoints")
	case !strings.HasPrefix(o.etcdPrefix, "/"):
		return fmt.Errorf("--etcd-prefix %q: want an absolute key prefix such as /registry", o.etcdPrefix)
	}
	return nil
}

// run audits the cluster, repairs it first with --repair, prints the report to stdout and
// returns nil if it is consistent, an *exitError with exitProblem if not, and any other error
// (exitCouldNotRun) if the audit could not run. Progress and notes go to stderr.
func (o *checkOptions) run(ctx context.Context, stdout, stderr io.Writer) error {
	if err := o.validate(); err != nil {
		return err
	}
	client, host, err := o.kubeClient()
	if err != nil {
		return err
	}
	var etcd *clientv3.Client
	if len(o.etcdEndpoints) > 0 {
		if etcd, err = o.etcdClient(ctx); err != nil {
			return err
		}
		defer etcd.Close()
	}
	info, err := client.Discovery().ServerVersion()
	if err != nil {
		return apiError(host, err)
	}
	mode, err := o.modeFor(info.GitVersion)
	if err != nil {
		return err
	}
	cfg := cip.Config{Mode: mode, Client: client}
	if etcd != nil {
		cfg.Bitmaps = etcdstore.Stores{Client: etcd, Prefix: o.etcdPrefix}
	}
	var note string
	if etcd == nil {
		switch mode {
		case featuregate.Legacy:
			return fmt.Errorf("in Legacy mode (kube-apiserver %s, --mode %s) the allocations are only in the bitmaps: give --etcd-endpoints to read them", info.GitVersion, o.mode)
		case featuregate.DualWrite:
			cfg.Mode = featuregate.IPAddressOnly
			note = fmt.Sprintf("the bitmaps were not read (no --etcd-endpoints): DualWrite mode (kube-apiserver %s, --mode %s) audited as IPAddressOnly, the IPAddress objects only", info.GitVersion, o.mode)
		}
	}
	what := "check"
	if o.repair {
		what = "check --repair"
	}
	need := neededPermissions(cfg.Mode, o.repair, etcd != nil)
	if err := checkAccess(ctx, client, host, fmt.Sprintf("%s in %s mode", what, cfg.Mode), need); err != nil {
		return err
	}
	if cfg.Ranges, err = o.flagRanges(ctx, client, etcd, host); err != nil {
		return err
	}
	if o.repair {
		rctx, cancel := context.WithTimeout(ctx, o.repairTimeout)
		err := o.repairUntilDone(rctx, cfg, stderr)
		cancel()
		if err != nil {
			return apiError(host, err)
		}
	}
	rep, err := repair.Audit(ctx, cfg)
	if err != nil {
		return apiError(host, err)
	}
	if err := o.print(stdout, stderr, rep, cfg.Mode, note); err != nil {
		return fmt.Errorf("print the report: %w", err)
	}
	if !rep.Consistent {
		return &exitError{code: exitProblem}
	}
	return nil
}

// kubeClient builds a client from the kubeconfig by kubectl's loading rules: --kubeconfig, else
// $KUBECONFIG, else ~/.kube/config, with --context. It returns the API server's address too.
func (o *checkOptions) kubeClient() (kubernetes.Interface, string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = o.kubeconfig
	kubeConfig := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: o.context})
	restConfig, err := kubeConfig.ClientConfig()
	if clientcmd.IsEmptyConfig(err) {
		return nil, "", errors.New("kubeconfig: none found ($KUBECONFIG is unset and ~/.kube/config is absent or empty): give --kubeconfig")
	}
	if err != nil {
		return nil, "", fmt.Errorf("kubeconfig: %w", err)
	}
	moveURLCredentials(restConfig)
	restConfig.Timeout = o.requestTimeout
	restConfig.QPS, restConfig.Burst = 50, 100 // kubectl's QPS; repair makes a few calls per finding
	client, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		return nil, "", fmt.Errorf("kubeconfig: %w", err)
	}
	return client, restConfig.Host, nil
}

// moveURLCredentials moves a user name and password written into the server URL
// (https://user:password@host) to the config's basic-auth fields, where client-go sends them
// just the same but masks them in what it logs, and so that no message of check, which names
// the server, prints them. If the config has a user name or password already, the URL's are
// dropped: client-go sends those of the config. A token set as well is then refused by client-go,
// as for any config with both.
func moveURLCredentials(c *rest.Config) {
	u, err := url.Parse(c.Host)
	if err != nil || u.User == nil {
		return // client-go reports a bad URL itself
	}
	if c.Username == "" && c.Password == "" {
		c.Username = u.User.Username()
		c.Password, _ = u.User.Password()
	}
	u.User = nil
	c.Host = u.String()
}

// Defaults of --request-timeout, which bounds each call to the API server and etcd, and of
// --repair-timeout, which bounds --repair as a whole.
const (
	defaultRequestTimeout = 10 * time.Second
	defaultRepairTimeout  = 10 * time.Minute
)

// defaultServiceCIDR is the name of the ServiceCIDR kube-apiserver creates from its
// --service-cluster-ip-range flag.
const defaultServiceCIDR = "kubernetes"

// flagRanges finds kube-apiserver's --service-cluster-ip-range: the ranges of the bitmaps'
// RangeAllocation objects in etcd, primary first, or without etcd the CIDRs of the "kubernetes"
// ServiceCIDR.
func (o *checkOptions) flagRanges(ctx context.Context, client kubernetes.Interface, etcd *clientv3.Client, host string) ([]netip.Prefix, error) {
	var cidrs []string
	var from string
	if etcd != nil {
		for _, key := range []string{etcdstore.ServiceIPsKey(o.etcdPrefix), etcdstore.SecondaryServiceIPsKey(o.etcdPrefix)} {
			snap, rev, err := etcdstore.New(etcd, key).Get(ctx)
			if err != nil {
				return nil, fmt.Errorf("etcd: read the RangeAllocation at %s: %w", key, err)
			}
			if rev != 0 {
				cidrs = append(cidrs, snap.Range)
			}
		}
		from = "the RangeAllocation objects under --etcd-prefix " + o.etcdPrefix
	} else {
		sc, err := client.NetworkingV1().ServiceCIDRs().Get(ctx, defaultServiceCIDR, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("API server at %s has no ServiceCIDR %q to read the Service CIDRs from: give --etcd-endpoints to read them from the bitmaps", host, defaultServiceCIDR)
		}
		if err != nil {
			return nil, apiError(host, err)
		}
		cidrs = sc.Spec.CIDRs
		from = fmt.Sprintf("ServiceCIDR %q", defaultServiceCIDR)
	}
	ranges, err := cip.ParseRanges(strings.Join(cidrs, ","))
	if err != nil {
		return nil, fmt.Errorf("the Service CIDRs %q of %s: %w", cidrs, from, err)
	}
	return ranges, nil
}

// apiError says what an error of the API server means for check, in one line: credentials the
// server rejects, permissions RBAC lacks, or the error as it is.
func apiError(host string, err error) error {
	switch {
	case apierrors.IsUnauthorized(err):
		return fmt.Errorf("API server at %s rejects the kubeconfig's credentials: %w", host, err)
	case apierrors.IsForbidden(err):
		return fmt.Errorf("missing RBAC permission at API server %s: %w; check needs get and list on services, and on servicecidrs and ipaddresses of networking.k8s.io (ClusterRole %s), and --repair also create, update and delete on ipaddresses (ClusterRole %s)", host, err, checkRole, checkRepairRole)
	case errors.Is(err, context.Canceled):
		return err
	}
	var status apierrors.APIStatus
	var urlErr *url.Error
	if errors.As(err, &status) || errors.As(err, &urlErr) {
		return fmt.Errorf("API server at %s: %w", host, err)
	}
	return err
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
// Every call of the client it returns is bounded by --request-timeout.
func (o *checkOptions) etcdClient(ctx context.Context) (*clientv3.Client, error) {
	cfg := clientv3.Config{Endpoints: o.etcdEndpoints, DialTimeout: o.requestTimeout, Logger: zap.NewNop()}
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
	client.KV = boundedKV{KV: client.KV, d: o.requestTimeout}
	key := etcdstore.ServiceIPsKey(o.etcdPrefix)
	resp, err := client.Get(ctx, key, clientv3.WithCountOnly())
	if err != nil {
		client.Close()
		if tlsErr := etcdTLSProblem(o.etcdEndpoints, cfg.TLS, o.requestTimeout); tlsErr != nil {
			return nil, tlsErr
		}
		return nil, fmt.Errorf("etcd at %s unreachable: %w", strings.Join(o.etcdEndpoints, ","), err)
	}
	if resp.Count == 0 {
		client.Close()
		return nil, fmt.Errorf("etcd at %s has no RangeAllocation at %s: is --etcd-prefix %s kube-apiserver's?", strings.Join(o.etcdEndpoints, ","), key, o.etcdPrefix)
	}
	return client, nil
}
