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
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	// Named cip: the tests of this package have a helper named clusterip.
	cip "github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/repair"
)

const checkLong = `Audit a live cluster's Service IP allocation. check only reads, ever: Services, ServiceCIDRs,
IPAddress objects and, with --etcd-servers, the legacy bitmaps kube-apiserver keeps in etcd.
Without --etcd-servers the bitmaps are not read, and the output says so. To repair what check
finds, run "clusterip repair" with the same flags.

The etcd flags are kube-apiserver's (--etcd-servers, --etcd-cafile, --etcd-certfile,
--etcd-keyfile, --etcd-prefix): copy their values from its command line.

The Service CIDRs are found in the cluster: the ranges of the bitmaps' RangeAllocation objects
under --etcd-prefix, or without etcd (or in IPAddressOnly mode, when no bitmap is left) the
"kubernetes" ServiceCIDR. --mode auto judges by the mode kube-apiserver runs in by default at its
version (Legacy up to 1.32, DualWrite in 1.33, IPAddressOnly from 1.34); give --mode if its
feature gates differ (in any case: ipaddressonly is IPAddressOnly). In IPAddressOnly mode the
bitmaps a Legacy or DualWrite era left are listed as stale; "clusterip repair
--remove-stale-bitmaps" removes them.

check also makes the pre-flight of an upgrade to kube-apiserver 1.38, which has no bitmaps and no
dual write: every server must have left Legacy and DualWrite before a 1.38 one joins. It counts
the live kube-apiservers by their identity Leases in kube-system and reads each one's /version
with the kubeconfig's credentials, as "clusterip repair --remove-stale-bitmaps" does (at the peer
addresses the Leases advertise, else at the URLs of --apiserver-endpoints, one per server), and
judges the server the kubeconfig reaches too. "Upgrade to 1.38" then says blocked (naming each
server that can still write the bitmaps: a binary below 1.38 emulating below 1.35, and the
feature gates that would make it), unknown (naming a server whose /version could not be read,
or why the servers could not all be counted), or ready. A 1.38 server already live beside a
bitmap writer is a hazard, reported as a finding is (exit 1). A user who may not list the Leases
gets a note on stderr, not a failure. -o json and -o yaml carry it as the report's "upgrade".

-o json and -o yaml print the report alone; -o table adds the repair plan: what "clusterip repair"
does about each finding, with the hold-off of --leak-grace.

The connection flags are kubectl's (--kubeconfig, --context, --server, --token, --as and the
rest; see docs/cli.md). Every call to the API server and to etcd is bounded by --request-timeout
(10s; 0 means none, as in kubectl): an API server or etcd that accepts the connection and stops
answering makes check exit 2, never wait forever.

Permissions: check reads Services, ServiceCIDRs and IPAddress objects (get, list), which the
ClusterRole clusterip-check in deploy/rbac of the clusterip repository grants. Before it reads
anything, check asks the API server whether it has them (SelfSubjectAccessReview) and names any
it lacks. The upgrade pre-flight also lists leases.coordination.k8s.io in kube-system, which the
Role clusterip-remove-stale-bitmaps there grants; without it, check asks first and skips the
Leases with a note.

Exit codes: 0 consistent; 1 inconsistencies found (or a 1.38 kube-apiserver live beside one
that can write the bitmaps); 2 could not run (bad flags, no kubeconfig,
an unreachable or silent API server or etcd, no RangeAllocation under --etcd-prefix outside
IPAddressOnly mode, missing RBAC
permissions), with one line on stderr saying why.

Deprecated, working until the next release with a warning on stderr: --repair (use "clusterip
repair"), and --etcd-endpoints, --etcd-cacert, --etcd-cert and --etcd-key (use --etcd-servers,
--etcd-cafile, --etcd-certfile and --etcd-keyfile).`

const checkExample = `  # Audit the cluster of the current kubeconfig context; the bitmaps are not read
  clusterip check

  # Audit another context, the bitmaps too, as JSON, with kube-apiserver's etcd flags
  clusterip check --context prod --etcd-servers https://10.0.0.2:2379 \
      --etcd-cafile ca.crt --etcd-certfile client.crt --etcd-keyfile client.key -o json

  # Judge by IPAddressOnly, for a cluster whose feature gates make it so (any case will do)
  clusterip check --mode ipaddressonly

  # The upgrade pre-flight of three kube-apiservers whose identity Leases advertise no peer address
  clusterip check --apiserver-endpoints https://10.0.0.2:6443,https://10.0.0.3:6443,https://10.0.0.4:6443`

// checkOptions are the flags of "clusterip check" and "clusterip repair", and which of the two
// runs.
type checkOptions struct {
	kube                                  *kubeFlags // kubectl's connection flags
	etcdServers                           []string
	etcdCAFile, etcdCertFile, etcdKeyFile string
	etcdPrefix, mode, output              string
	leakGrace                             time.Duration
	requestTimeout                        time.Duration // --request-timeout, read by validate; 0 means none
	repairTimeout                         time.Duration

	repair bool // repair, then audit again ("clusterip repair", or the deprecated "check --repair")
	dryRun bool // with repair, audit and print the plan but change nothing

	removeStaleBitmaps bool     // with repair, remove the stale bitmaps once no server can write them
	apiserverEndpoints []string // with removeStaleBitmaps, the servers' endpoints, for Leases without peer addresses
}

var (
	checkModes   = []string{"auto", featuregate.Legacy.String(), featuregate.DualWrite.String(), featuregate.IPAddressOnly.String()}
	checkOutputs = []string{"table", "json", "yaml"}
)

// newCheckOptions returns the flags' defaults.
func newCheckOptions() *checkOptions {
	return &checkOptions{kube: newKubeFlags(), etcdPrefix: etcdstore.DefaultPrefix, mode: "auto", output: "table", leakGrace: time.Minute,
		requestTimeout: defaultRequestTimeout, repairTimeout: defaultRepairTimeout}
}

func newCheckCommand() *cobra.Command {
	o := newCheckOptions()
	cmd := &cobra.Command{
		Use:     "check",
		Short:   "Audit a live cluster's Service IP allocation; read-only",
		Long:    checkLong,
		Example: checkExample,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.repair {
				deprecated(cmd.ErrOrStderr(), `"check --repair"`, `"clusterip repair", which takes the same flags`)
			}
			return o.run(cmd, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	o.addFlags(cmd)
	f := cmd.Flags()
	f.StringSliceVar(&o.apiserverEndpoints, "apiserver-endpoints", nil, "for the upgrade pre-flight, the URL of every kube-apiserver (comma-separated, one per server, not a load balancer), where the identity Leases are not readable or carry no peer addresses")
	f.BoolVar(&o.repair, "repair", false, `deprecated: use "clusterip repair"`)
	_ = f.MarkHidden("repair")
	_ = f.MarkHidden("repair-timeout") // repair's; check --repair takes it until the next release
	return cmd
}

// addFlags registers the flags check and repair share on cmd.
func (o *checkOptions) addFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	addKubeFlags(cmd, f, o.kube)
	f.StringSliceVar(&o.etcdServers, "etcd-servers", nil, "etcd servers (scheme://ip:port, comma-separated) holding the legacy bitmaps, as kube-apiserver's --etcd-servers; without them the bitmaps are not read")
	f.StringVar(&o.etcdCAFile, "etcd-cafile", "", "CA bundle to verify etcd's serving certificate with, as kube-apiserver's --etcd-cafile")
	f.StringVar(&o.etcdCertFile, "etcd-certfile", "", "client certificate for etcd (with --etcd-keyfile), as kube-apiserver's --etcd-certfile")
	f.StringVar(&o.etcdKeyFile, "etcd-keyfile", "", "client key for etcd (with --etcd-certfile), as kube-apiserver's --etcd-keyfile")
	f.StringVar(&o.etcdPrefix, "etcd-prefix", o.etcdPrefix, "etcd key prefix, as kube-apiserver's --etcd-prefix")
	f.StringVar(&o.mode, "mode", o.mode, "allocation mode, in any case: auto (kube-apiserver's default for its version), "+strings.Join(checkModes[1:], ", "))
	f.StringVarP(&o.output, "output", "o", o.output, "output format: "+strings.Join(checkOutputs, ", "))
	f.DurationVar(&o.leakGrace, "leak-grace", o.leakGrace, "how long a leaked IP must stay leaked before repair frees it; 0 frees at once, which can free the record of an allocation still in flight")
	f.DurationVar(&o.repairTimeout, "repair-timeout", o.repairTimeout, "how long repair's passes and their waits may take in all before it gives up (exit 2)")
	for _, r := range renamedEtcdFlags {
		addOldSpelling(cmd, r.old, r.current)
	}
	_ = cmd.RegisterFlagCompletionFunc("mode", cobra.FixedCompletions(checkModes, cobra.ShellCompDirectiveNoFileComp))
	completeOutputs(cmd, checkOutputs)
}

// renamedEtcdFlags are the etcd flags of check and repair before they took kube-apiserver's
// names.
var renamedEtcdFlags = []struct{ old, current string }{
	{"etcd-endpoints", "etcd-servers"},
	{"etcd-cacert", "etcd-cafile"},
	{"etcd-cert", "etcd-certfile"},
	{"etcd-key", "etcd-keyfile"},
}

// validate checks the flags on their own, before anything is contacted, and puts --mode in its
// canonical spelling.
func (o *checkOptions) validate() error {
	mode, modeOK := modeFlag(o.mode)
	timeout, timeoutErr := requestTimeout(o.kube)
	switch {
	case !slices.Contains(checkOutputs, o.output):
		return outputError(o.output, checkOutputs)
	case !modeOK:
		return fmt.Errorf("--mode %q: want one of %s, in any case", o.mode, strings.Join(checkModes, ", "))
	case o.leakGrace < 0:
		return fmt.Errorf("--leak-grace %v: want 0 or more", o.leakGrace)
	case timeoutErr != nil:
		return timeoutErr
	case o.repairTimeout <= 0:
		return fmt.Errorf("--repair-timeout %v: want more than 0", o.repairTimeout)
	case (o.etcdCertFile == "") != (o.etcdKeyFile == ""):
		return errors.New("--etcd-certfile and --etcd-keyfile go together: give both or neither")
	case len(o.etcdServers) == 0 && (o.etcdCAFile != "" || o.etcdCertFile != ""):
		return errors.New("--etcd-cafile, --etcd-certfile and --etcd-keyfile need --etcd-servers")
	case !strings.HasPrefix(o.etcdPrefix, "/"):
		return fmt.Errorf("--etcd-prefix %q: want an absolute key prefix such as /registry", o.etcdPrefix)
	case o.removeStaleBitmaps && len(o.etcdServers) == 0:
		return errors.New("--remove-stale-bitmaps needs --etcd-servers: the bitmaps are in etcd")
	case len(o.apiserverEndpoints) > 0 && o.repair && !o.removeStaleBitmaps:
		return errors.New("--apiserver-endpoints goes with --remove-stale-bitmaps: it names the servers whose versions decide it")
	}
	if err := checkEndpoints(o.apiserverEndpoints); err != nil {
		return err
	}
	o.mode = mode
	o.requestTimeout = timeout
	return nil
}

// modeFlag returns the --mode value s names, whatever its case, in its canonical spelling (auto,
// or a featuregate.Mode's String), and whether it names one. featuregate.ParseMode, the
// library's, stays exact: the folding is the command line's convenience.
func modeFlag(s string) (string, bool) {
	for _, m := range checkModes {
		if strings.EqualFold(s, m) {
			return m, true
		}
	}
	return "", false
}

// verb names what the command does, for messages: "clusterip check", "clusterip repair" or
// "clusterip repair --dry-run".
func (o *checkOptions) verb() string {
	switch {
	case o.repair && o.dryRun:
		return "clusterip repair --dry-run"
	case o.repair:
		return "clusterip repair"
	}
	return "clusterip check"
}

// run audits the cluster, repairs it first with o.repair (unless o.dryRun), prints the report
// to stdout and returns nil if it is consistent, an *exitError with exitProblem if not, and any
// other error (exitCouldNotRun) if the command could not run. Progress, notes and warnings go to
// stderr.
func (o *checkOptions) run(cmd *cobra.Command, stdout, stderr io.Writer) error {
	if err := warnOldSpellings(cmd, stderr); err != nil {
		return err
	}
	if err := o.validate(); err != nil {
		return err
	}
	ctx := cmd.Context()
	client, restConfig, err := o.kubeClient()
	if err != nil {
		return err
	}
	host := restConfig.Host
	var etcd *clientv3.Client
	if len(o.etcdServers) > 0 {
		if etcd, err = o.etcdClient(ctx); err != nil {
			return err
		}
		defer etcd.Close()
	}
	info, err := client.Discovery().ServerVersion()
	if err != nil {
		return apiError(host, err)
	}
	mode, err := o.modeFor(emulatedVersion(info))
	if err != nil {
		return err
	}
	if o.removeStaleBitmaps && mode != featuregate.IPAddressOnly {
		return fmt.Errorf("--remove-stale-bitmaps needs an IPAddressOnly audit, and kube-apiserver %s with --mode %s is audited in %s mode, where the bitmaps are in use", info.GitVersion, o.mode, mode)
	}
	cfg := cip.Config{Mode: mode, Client: client}
	if etcd != nil {
		cfg.Bitmaps = etcdstore.Stores{Client: etcd, Prefix: o.etcdPrefix}
	}
	var note string
	if etcd == nil {
		switch mode {
		case featuregate.Legacy:
			return fmt.Errorf("in Legacy mode (kube-apiserver %s, --mode %s) the allocations are only in the bitmaps: give --etcd-servers to read them", info.GitVersion, o.mode)
		case featuregate.DualWrite:
			cfg.Mode = featuregate.IPAddressOnly
			note = fmt.Sprintf("the bitmaps were not read (no --etcd-servers): DualWrite mode (kube-apiserver %s, --mode %s) audited as IPAddressOnly, the IPAddress objects only", info.GitVersion, o.mode)
		}
	}
	var bitmapCIDRs []string
	if etcd != nil {
		if bitmapCIDRs, err = o.bitmapRanges(ctx, etcd); err != nil {
			return err
		}
		if bitmapCIDRs == nil && cfg.Mode != featuregate.IPAddressOnly {
			return fmt.Errorf("etcd at %s has no RangeAllocation at %s, which kube-apiserver keeps in %s mode: is --etcd-prefix %s kube-apiserver's?",
				strings.Join(o.etcdServers, ","), etcdstore.ServiceIPsKey(o.etcdPrefix), cfg.Mode, o.etcdPrefix)
		}
	}
	write := o.repair && !o.dryRun
	need := neededPermissions(cfg.Mode, write, bitmapCIDRs != nil)
	if err := checkAccess(ctx, client, host, fmt.Sprintf("%s in %s mode", o.verb(), cfg.Mode), need); err != nil {
		return err
	}
	if cfg.Ranges, err = o.flagRanges(ctx, client, bitmapCIDRs, host); err != nil {
		return err
	}
	// Before anything changes: whether a kube-apiserver may still write the bitmaps.
	var writers *bitmapWriters
	if o.removeStaleBitmaps {
		if writers, err = o.checkBitmapWriters(ctx, client, restConfig); err != nil {
			return err
		}
		if writers.refusal != nil && !o.dryRun {
			return writers.refusal
		}
	}
	if write {
		rctx, cancel := context.WithTimeout(ctx, o.repairTimeout)
		err := o.repairUntilDone(rctx, cfg, stderr)
		cancel()
		if err != nil {
			return apiError(host, err)
		}
		if o.removeStaleBitmaps {
			// Again, right before: the passes may have taken minutes, and a server may have come.
			if writers, err = o.checkBitmapWriters(ctx, client, restConfig); err != nil {
				return err
			}
			if writers.refusal != nil {
				return writers.refusal
			}
			if err := removeStaleBitmaps(ctx, cfg, writers, stderr); err != nil {
				return apiError(host, err)
			}
		}
	}
	rep, err := repair.Audit(ctx, cfg)
	if err != nil {
		return apiError(host, err)
	}
	if !o.repair {
		rep.Upgrade = o.checkUpgrade(ctx, client, restConfig, info, stderr)
	}
	if err := o.print(stdout, stderr, rep, cfg.Mode, note); err != nil {
		return fmt.Errorf("print the report: %w", err)
	}
	if o.dryRun {
		fmt.Fprintf(stderr, "clusterip: dry run: nothing was changed; %s\n", o.dryRunSummary(rep))
		if o.removeStaleBitmaps {
			if err := dryRunStaleBitmaps(rep, writers, stderr); err != nil {
				return err
			}
			if len(rep.StaleBitmaps) > 0 {
				return &exitError{code: exitProblem}
			}
		}
	}
	if !rep.Consistent || upgradeHazard(rep) {
		return &exitError{code: exitProblem}
	}
	return nil
}

// kubeClient builds a client from the connection flags (see kubeClient, the function).
func (o *checkOptions) kubeClient() (kubernetes.Interface, *rest.Config, error) {
	return kubeClient(o.kube)
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

// bitmapRanges returns the ranges of the bitmaps' RangeAllocation objects in etcd, primary
// first, or nil if there is no primary one: an IPAddressOnly cluster may have none, never having
// had a dual-write era or its stale bitmaps having been removed.
func (o *checkOptions) bitmapRanges(ctx context.Context, etcd *clientv3.Client) ([]string, error) {
	var cidrs []string
	for i, key := range []string{etcdstore.ServiceIPsKey(o.etcdPrefix), etcdstore.SecondaryServiceIPsKey(o.etcdPrefix)} {
		snap, rev, err := etcdstore.New(etcd, key).Get(ctx)
		if err != nil {
			return nil, fmt.Errorf("etcd: read the RangeAllocation at %s: %w", key, err)
		}
		if rev == 0 && i == 0 {
			return nil, nil
		}
		if rev != 0 {
			cidrs = append(cidrs, snap.Range)
		}
	}
	return cidrs, nil
}

// flagRanges finds kube-apiserver's --service-cluster-ip-range: bitmapCIDRs, the ranges of the
// bitmaps' RangeAllocation objects in etcd (see bitmapRanges), or without them the CIDRs of the
// "kubernetes" ServiceCIDR.
func (o *checkOptions) flagRanges(ctx context.Context, client kubernetes.Interface, bitmapCIDRs []string, host string) ([]netip.Prefix, error) {
	cidrs := bitmapCIDRs
	from := "the RangeAllocation objects under --etcd-prefix " + o.etcdPrefix
	if cidrs == nil {
		sc, err := client.NetworkingV1().ServiceCIDRs().Get(ctx, defaultServiceCIDR, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("API server at %s has no ServiceCIDR %q to read the Service CIDRs from: give --etcd-servers to read them from the bitmaps", host, defaultServiceCIDR)
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
		return fmt.Errorf("missing RBAC permission at API server %s: %w; clusterip check needs get and list on services, and on servicecidrs and ipaddresses of networking.k8s.io (ClusterRole %s), and clusterip repair also create, update and delete on ipaddresses (ClusterRole %s)", host, err, checkRole, checkRepairRole)
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

// emulatedVersion returns the version whose defaults kube-apiserver runs with: the one it
// emulates (--emulated-version, which /version reports from 1.31), else its own.
func emulatedVersion(info *version.Info) string {
	return repair.ServerVersion{Info: *info}.Emulated()
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

// etcdClient connects to --etcd-servers and checks that --etcd-prefix is kube-apiserver's: that
// the primary bitmap is under it, or, as on an IPAddressOnly cluster without bitmaps, some other
// key. Every call of the client it returns is bounded by --request-timeout.
func (o *checkOptions) etcdClient(ctx context.Context) (*clientv3.Client, error) {
	cfg := clientv3.Config{Endpoints: o.etcdServers, DialTimeout: o.requestTimeout, Logger: zap.NewNop()}
	if o.etcdCAFile != "" || o.etcdCertFile != "" {
		tlsInfo := transport.TLSInfo{CertFile: o.etcdCertFile, KeyFile: o.etcdKeyFile, TrustedCAFile: o.etcdCAFile}
		tlsConfig, err := tlsInfo.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("etcd TLS: %w", err)
		}
		cfg.TLS = tlsConfig
	}
	client, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcd at %s: %w", strings.Join(o.etcdServers, ","), err)
	}
	client.KV = boundedKV{KV: client.KV, d: o.requestTimeout}
	key := etcdstore.ServiceIPsKey(o.etcdPrefix)
	resp, err := client.Get(ctx, key, clientv3.WithCountOnly())
	if err != nil {
		client.Close()
		if tlsErr := etcdTLSProblem(o.etcdServers, cfg.TLS, o.requestTimeout); tlsErr != nil {
			return nil, tlsErr
		}
		return nil, fmt.Errorf("etcd at %s unreachable: %w", strings.Join(o.etcdServers, ","), err)
	}
	if resp.Count == 0 {
		// An IPAddressOnly cluster may have no bitmap; a kube-apiserver's prefix has other keys.
		resp, err := client.Get(ctx, strings.TrimSuffix(o.etcdPrefix, "/")+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(1))
		if err != nil || len(resp.Kvs) == 0 {
			client.Close()
			return nil, fmt.Errorf("etcd at %s has no RangeAllocation at %s: is --etcd-prefix %s kube-apiserver's?", strings.Join(o.etcdServers, ","), key, o.etcdPrefix)
		}
	}
	return client, nil
}
