package kubeapiserverfork_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/localcluster"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/repair"
)

// modeGate is an allocator mode and the flags that select it in kube-apiserver of one release.
type modeGate struct {
	mode  featuregate.Mode
	gates string   // --feature-gates
	args  []string // other flags, such as --emulated-version
}

// name names the mode and its flags in a subtest name.
func (mg modeGate) name() string {
	parts := []string{mg.mode.String()}
	if mg.gates != "" {
		parts = append(parts, strings.ReplaceAll(mg.gates, "=", "-"))
	}
	return strings.Join(append(parts, mg.args...), "/")
}

// options returns the options of a kube-apiserver bin in mode mg, serving the range cidr.
func (mg modeGate) options(bin, cidr string) testenv.KubeAPIServerOptions {
	return testenv.KubeAPIServerOptions{Binary: bin, ServiceClusterIPRange: cidr, FeatureGates: mg.gates, ExtraArgs: mg.args}
}

// releaseModes are, for each release with a fork, the flags of every gate combination that
// selects a mode, as its kube-apiserver reads them, the release's default first. A binary
// emulates down to its own minor minus 3: v1.35 and v1.36 reach Legacy only at
// --emulated-version=1.33 (where networking.k8s.io/v1 is served, which the tests read) and dual
// write at 1.33 or 1.34; a v1.37 binary emulates 1.34 at the lowest, where
// MultiCIDRServiceAllocator is locked on: it has no Legacy mode, and dual write only at 1.34. A
// v1.38 binary has neither gate nor bitmap allocator: IPAddressOnly only, at its own version and
// at each it emulates (1.35 to 1.37), where the library answers as those releases.
var releaseModes = map[string][]modeGate{
	"v1.33.13": {
		{featuregate.DualWrite, "", nil},
		{featuregate.Legacy, "MultiCIDRServiceAllocator=false", nil},
		{featuregate.Legacy, "MultiCIDRServiceAllocator=false,DisableAllocatorDualWrite=true", nil},
		{featuregate.IPAddressOnly, "DisableAllocatorDualWrite=true", nil},
	},
	"v1.35.4": laterModes(),
	"v1.36.3": laterModes(),
	"v1.37.2": {
		{featuregate.IPAddressOnly, "", nil},
		{featuregate.DualWrite, "DisableAllocatorDualWrite=false", []string{"--emulated-version=1.34"}},
	},
	localcluster.KubeAPIServerV138: {
		{featuregate.IPAddressOnly, "", nil},
		{featuregate.IPAddressOnly, "", []string{"--emulated-version=1.37"}},
		{featuregate.IPAddressOnly, "", []string{"--emulated-version=1.36"}},
		{featuregate.IPAddressOnly, "", []string{"--emulated-version=1.35"}},
	},
}

// laterModes are the gate combinations of v1.35 and v1.36 (see releaseModes).
func laterModes() []modeGate {
	return []modeGate{
		{featuregate.IPAddressOnly, "", nil},
		{featuregate.DualWrite, "DisableAllocatorDualWrite=false", []string{"--emulated-version=1.34"}},
		{featuregate.DualWrite, "", []string{"--emulated-version=1.33"}},
		{featuregate.Legacy, "MultiCIDRServiceAllocator=false", []string{"--emulated-version=1.33"}},
	}
}

// modeGates returns the modes of the release under test, failing t if the tests do not know its
// flags.
func modeGates(t *testing.T) []modeGate {
	t.Helper()
	mgs, ok := releaseModes[release()]
	if !ok {
		t.Fatalf("the tests know no feature gates of kube-apiserver %s (releaseModes)", release())
	}
	return mgs
}

// modeOf returns the first gate combination of mode in the release under test, and false if the
// release has none.
func modeOf(t *testing.T, mode featuregate.Mode) (modeGate, bool) {
	t.Helper()
	for _, mg := range modeGates(t) {
		if mg.mode == mode {
			return mg, true
		}
	}
	return modeGate{}, false
}

// modeOrSkip returns the first gate combination of mode in the release under test. It skips t
// when the release has no such mode by design (from v1.38, kube-apiserver has no bitmap
// allocator: neither Legacy nor DualWrite), and fails t when the tests merely lack its flags.
func modeOrSkip(t *testing.T, mode featuregate.Mode) modeGate {
	t.Helper()
	mg, ok := modeOf(t, mode)
	switch {
	case ok:
		return mg
	case mode != featuregate.IPAddressOnly && version.MustParseSemantic(release()).Minor() >= 38:
		t.Skipf("kube-apiserver %s has no %s mode: its bitmap allocator is gone", release(), mode)
	default:
		t.Fatalf("kube-apiserver %s has no %s mode", release(), mode)
	}
	return modeGate{}
}

// releaseEnv names the environment variable that selects the release whose fork the tests run,
// beside stock kube-apiserver of the same release, such as "v1.37.2". Defaults to
// localcluster.KubeAPIServerVersion.
const releaseEnv = "CLUSTERIP_FORK_RELEASE"

// release returns the release the tests run, from releaseEnv.
func release() string {
	if r := os.Getenv(releaseEnv); r != "" {
		return r
	}
	return localcluster.KubeAPIServerVersion
}

// forkBinary returns the fork's binary, building it if needed; it skips t in -short mode.
func forkBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping kube-apiserver fork test in -short mode")
	}
	bin, err := localcluster.KubeAPIServerForkReleaseBinary(context.Background(), release())
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// stockBinary returns stock kube-apiserver of the same release, building it if needed.
func stockBinary(t *testing.T) string {
	t.Helper()
	bin, err := localcluster.KubeAPIServerReleaseBinary(context.Background(), release())
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

func TestForkAnswersVersion(t *testing.T) {
	bin := forkBinary(t)
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s --version: %v\n%s", bin, err, out)
	}
	if got, want := strings.TrimSpace(string(out)), "Kubernetes "+release(); got != want {
		t.Errorf("--version = %q, want %q", got, want)
	}
}

const (
	v4Range = "10.96.0.0/24"
	v6Range = "fd00:10:96::/112"
)

// TestForkAllocatesInEveryMode starts the fork in each mode with a dual-stack range and checks
// that single- and dual-stack Services get addresses from the flag ranges, that a chosen free
// address is granted and a taken one refused with kube-apiserver's message, and that a Service's delete
// frees its addresses for reuse.
func TestForkAllocatesInEveryMode(t *testing.T) {
	t.Parallel()
	bin := forkBinary(t)
	ranges, err := clusterip.ParseRanges(v4Range + "," + v6Range)
	if err != nil {
		t.Fatal(err)
	}
	for _, mg := range modeGates(t) {
		t.Run(mg.name(), func(t *testing.T) {
			etcd := testenv.NewEtcd(t)
			s := testenv.NewKubeAPIServer(t, etcd, mg.options(bin, v4Range+","+v6Range))
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			svcs := s.Client.CoreV1().Services(metav1.NamespaceDefault)

			var got []*corev1.Service
			for i := range 10 {
				svc := testenv.ClusterIPService(fmt.Sprintf("single-%d", i), "")
				if i%2 == 1 {
					svc.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol}
				}
				created, err := svcs.Create(ctx, svc, metav1.CreateOptions{})
				if err != nil {
					t.Fatalf("create %s: %v", svc.Name, err)
				}
				got = append(got, created)
			}
			for i := range 5 {
				svc := testenv.ClusterIPService(fmt.Sprintf("dual-%d", i), "")
				svc.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyRequireDualStack)
				created, err := svcs.Create(ctx, svc, metav1.CreateOptions{})
				if err != nil {
					t.Fatalf("create %s: %v", svc.Name, err)
				}
				if len(created.Spec.ClusterIPs) != 2 {
					t.Errorf("%s: clusterIPs = %v, want one of each family", svc.Name, created.Spec.ClusterIPs)
				}
				got = append(got, created)
			}
			seen := map[netip.Addr]string{}
			for _, svc := range got {
				for _, s := range svc.Spec.ClusterIPs {
					ip, err := netip.ParseAddr(s)
					if err != nil {
						t.Fatalf("%s: clusterIP %q: %v", svc.Name, s, err)
					}
					if !slices.ContainsFunc(ranges, func(p netip.Prefix) bool { return p.Contains(ip) }) {
						t.Errorf("%s: clusterIP %s is in no range of %v", svc.Name, ip, ranges)
					}
					if other, dup := seen[ip]; dup {
						t.Errorf("%s and %s both got %s", other, svc.Name, ip)
					}
					seen[ip] = svc.Name
				}
			}

			// Single to dual stack, then back.
			up := got[0].DeepCopy()
			up.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyRequireDualStack)
			up.Spec.IPFamilies = append(up.Spec.IPFamilies, corev1.IPv6Protocol)
			up, err := svcs.Update(ctx, up, metav1.UpdateOptions{})
			if err != nil {
				t.Fatalf("upgrade %s to dual stack: %v", got[0].Name, err)
			}
			if len(up.Spec.ClusterIPs) != 2 || up.Spec.ClusterIPs[0] != got[0].Spec.ClusterIPs[0] {
				t.Errorf("upgrade to dual stack: clusterIPs %v, want %s and an IPv6 address", up.Spec.ClusterIPs, got[0].Spec.ClusterIPs[0])
			} else if seen[netip.MustParseAddr(up.Spec.ClusterIPs[1])] != "" {
				t.Errorf("upgrade to dual stack: %s got %s, which %s holds", up.Name, up.Spec.ClusterIPs[1], seen[netip.MustParseAddr(up.Spec.ClusterIPs[1])])
			}
			down := up.DeepCopy()
			down.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicySingleStack)
			down.Spec.IPFamilies = down.Spec.IPFamilies[:1]
			down.Spec.ClusterIPs = down.Spec.ClusterIPs[:1]
			if _, err := svcs.Update(ctx, down, metav1.UpdateOptions{}); err != nil {
				t.Fatalf("downgrade %s to single stack: %v", got[0].Name, err)
			}
			// The released IPv6 address can be taken again.
			if _, err := svcs.Create(ctx, testenv.ClusterIPService("after-downgrade", up.Spec.ClusterIPs[1]), metav1.CreateOptions{}); err != nil {
				t.Errorf("create with the IP the downgrade released: %v", err)
			}

			// A chosen free address, then the same address again.
			if _, err := svcs.Create(ctx, testenv.ClusterIPService("chosen", "10.96.0.5"), metav1.CreateOptions{}); err != nil {
				t.Fatalf("create with a free chosen IP: %v", err)
			}
			_, err = svcs.Create(ctx, testenv.ClusterIPService("taken", "10.96.0.5"), metav1.CreateOptions{})
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "failed to allocate IP 10.96.0.5: provided IP is already allocated") {
				t.Errorf("create with a taken IP: %v, want 422 Invalid with %q", err, "failed to allocate IP 10.96.0.5: provided IP is already allocated")
			}

			// Release, then reuse.
			if err := svcs.Delete(ctx, "chosen", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			if _, err := svcs.Create(ctx, testenv.ClusterIPService("reused", "10.96.0.5"), metav1.CreateOptions{}); err != nil {
				t.Errorf("create with a released IP: %v", err)
			}
			t.Logf("%s: %d Services, %d ClusterIPs, none duplicated; dual-stack upgrade and downgrade", mg.mode, len(got)+1, len(seen)+1)
		})
	}
}

// pickedAddress is the address an IPAddress refusal names, which each allocator picks itself.
var pickedAddress = regexp.MustCompile(`IPAddress\.networking\.k8s\.io "[0-9a-f.:]+"`)

// TestForkErrorsMatchStock asks the fork and stock kube-apiserver of its release, in the same mode,
// for the same refused ClusterIPs, and compares the messages.
func TestForkErrorsMatchStock(t *testing.T) {
	t.Parallel()
	fork := forkBinary(t)
	stock := stockBinary(t)
	cases := []struct {
		name, first, ip string
		dryRun          bool
		// improved is the fork's answer where it knowingly differs from stock: stock's dry
		// run admits a taken ClusterIP that the real request then refuses.
		improved string
		// nameless creates the Service without a name: stock's allocator creates an IPAddress
		// object whose parentRef has no name, and the server refuses it naming the address
		// it picked (which the comparison does not compare).
		nameless bool
	}{
		{"taken", "10.96.0.7", "10.96.0.7", false, "", false},
		{"taken, dry run", "", "10.96.0.7", true, "failed to allocate IP 10.96.0.7: provided IP is already allocated", false},
		{"out of range", "", "10.97.0.7", false, "", false},
		{"network address", "", "10.96.0.0", false, "", false},
		{"broadcast address", "", "10.96.0.255", false, "", false},
		{"other family", "", "fd00::7", false, "", false},
		{"no name", "", "", false, "", true},
	}
	for _, mg := range modeGates(t) {
		t.Run(mg.name(), func(t *testing.T) {
			messages := map[string][]string{}
			for _, bin := range []string{stock, fork} {
				etcd := testenv.NewEtcd(t)
				s := testenv.NewKubeAPIServer(t, etcd, mg.options(bin, v4Range))
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				svcs := s.Client.CoreV1().Services(metav1.NamespaceDefault)
				for i, c := range cases {
					if c.first != "" {
						if _, err := svcs.Create(ctx, testenv.ClusterIPService(fmt.Sprintf("first-%d", i), c.first), metav1.CreateOptions{}); err != nil {
							t.Fatalf("%s: %v", c.name, err)
						}
					}
					opts := metav1.CreateOptions{}
					if c.dryRun {
						opts.DryRun = []string{metav1.DryRunAll}
					}
					svc := testenv.ClusterIPService(fmt.Sprintf("svc-%d", i), c.ip)
					if c.nameless {
						svc.Name = ""
					}
					_, err := svcs.Create(ctx, svc, opts)
					msg := "<nil>"
					if err != nil {
						msg = pickedAddress.ReplaceAllString(err.Error(), `IPAddress.networking.k8s.io "<picked>"`)
					}
					messages[bin] = append(messages[bin], msg)
				}
				cancel()
				s.Stop()
			}
			for i, c := range cases {
				if c.improved != "" {
					if got := messages[fork][i]; !strings.Contains(got, c.improved) {
						t.Errorf("%s (%s): fork: %s, want %q", c.name, c.ip, got, c.improved)
					}
					t.Logf("%s: fork: %s; stock %s: %s", c.name, messages[fork][i], release(), messages[stock][i])
					continue
				}
				if got, want := messages[fork][i], messages[stock][i]; got != want {
					t.Errorf("%s (%s):\nfork:  %s\nstock: %s", c.name, c.ip, got, want)
				} else {
					t.Logf("%s: %s", c.name, got)
				}
			}
		})
	}
}

// TestForkFullRangeMatchesStock fills a /29 (6 addresses, 1 the kubernetes Service's) through
// the fork and through stock kube-apiserver of its release in each mode and compares how many
// Services each admits and the refusal that follows.
func TestForkFullRangeMatchesStock(t *testing.T) {
	t.Parallel()
	fork := forkBinary(t)
	stock := stockBinary(t)
	for _, mg := range modeGates(t) {
		t.Run(mg.name(), func(t *testing.T) {
			type outcome struct {
				admitted int
				refusal  string
			}
			got := map[string]outcome{}
			for _, bin := range []string{stock, fork} {
				etcd := testenv.NewEtcd(t)
				s := testenv.NewKubeAPIServer(t, etcd, mg.options(bin, "10.96.0.0/29"))
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				testenv.WaitForKubernetesService(t, s.Client)
				var o outcome
				for i := range 10 {
					_, err := s.Client.CoreV1().Services(metav1.NamespaceDefault).Create(ctx, testenv.ClusterIPService(fmt.Sprintf("svc-%d", i), ""), metav1.CreateOptions{})
					if err != nil {
						o.refusal = err.Error()
						break
					}
					o.admitted++
				}
				cancel()
				s.Stop()
				got[bin] = o
			}
			if got[fork] != got[stock] {
				t.Errorf("fork admitted %d, then: %s\nstock admitted %d, then: %s", got[fork].admitted, got[fork].refusal, got[stock].admitted, got[stock].refusal)
			} else {
				t.Logf("both admitted %d, then: %s", got[fork].admitted, got[fork].refusal)
			}
		})
	}
}

// TestForkBesideStockNoDuplicates runs the fork beside a stock kube-apiserver of its release on
// one etcd (forkPeers: v1.33.13's fork in DualWrite beside stock in Legacy mode and then in its
// default dual write; v1.37.2's, both in DualWrite at --emulated-version=1.34, then both in
// IPAddressOnly; v1.35.4's and v1.36.3's, the three; v1.38's in IPAddressOnly), creating and deleting Services from both
// as besideStock does: no two Services may ever get the same ClusterIP.
func TestForkBesideStockNoDuplicates(t *testing.T) {
	t.Parallel()
	fork := forkBinary(t)
	stock := stockBinary(t)
	peers, ok := forkPeers[release()]
	if !ok {
		t.Fatalf("the tests know no peers of the kube-apiserver %s fork (forkPeers)", release())
	}
	for _, peer := range peers {
		t.Run("fork-"+peer.fork.mode.String()+"/stock-"+peer.stock.mode.String(), func(t *testing.T) {
			besideStock(t, fork, stock, peer)
		})
	}
}

// TestForkBesidePreviousReleaseNoDuplicates runs the fork beside stock kube-apiserver of the
// previous minor release on one etcd, the skew of the rolling upgrade a user does next (skewPeers:
// v1.37.2's fork beside stock v1.36.3, both in their default IPAddressOnly, then both in dual
// write at --emulated-version=1.34; v1.38's beside stock v1.37.2, both in IPAddressOnly, the
// skew of the upgrade to v1.38), as TestForkBesideStockNoDuplicates does beside its own release,
// and then one repair pass of the fork's mode must leave an audit with no finding.
func TestForkBesidePreviousReleaseNoDuplicates(t *testing.T) {
	t.Parallel()
	skew, ok := skewPeers[release()]
	if !ok {
		t.Skipf("no previous release is paired with the kube-apiserver %s fork (skewPeers)", release())
	}
	fork := forkBinary(t)
	stock, err := localcluster.KubeAPIServerReleaseBinary(context.Background(), skew.stock)
	if err != nil {
		t.Fatal(err)
	}
	for _, peer := range skew.peers {
		t.Run("fork-"+release()+"-"+peer.fork.name()+"/stock-"+skew.stock+"-"+peer.stock.name(), func(t *testing.T) {
			etcd, f := besideStock(t, fork, stock, peer)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			rng, _ := clusterip.ParseRanges(v4Range)
			cfg := clusterip.Config{Mode: peer.fork.mode, Ranges: rng, Client: f.Client}
			if peer.fork.mode != featuregate.IPAddressOnly {
				cfg.Bitmaps = etcdstore.Stores{Client: etcd.TestClient(t)}
			}
			c, err := repair.NewController(cfg, repair.Options{LeakGrace: -1})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.RunOnce(ctx); err != nil {
				t.Errorf("one repair pass: %v", err)
			}
			if rep := audit(ctx, t, peer.fork.mode, etcd, f.Client); !rep.Consistent {
				t.Errorf("after one repair pass: %d findings %v, want none", len(rep.Findings), rep.Counts)
			}
		})
	}
}

// skewPeers are, for a release with a fork, the stock release of the previous minor and the
// pairs TestForkBesidePreviousReleaseNoDuplicates runs: the fork's modes and the stock's.
var skewPeers = map[string]struct {
	stock string
	peers []forkPeer
}{
	"v1.37.2": {"v1.36.3", []forkPeer{
		{releaseModes["v1.37.2"][0], releaseModes["v1.36.3"][0], true}, // IPAddressOnly, both defaults
		{releaseModes["v1.37.2"][1], releaseModes["v1.36.3"][1], true}, // DualWrite at emulated 1.34
	}},
	// The upgrade to v1.38: every server has left dual write before a v1.38 one joins.
	localcluster.KubeAPIServerV138: {"v1.37.2", []forkPeer{
		{releaseModes[localcluster.KubeAPIServerV138][0], releaseModes["v1.37.2"][0], true}, // IPAddressOnly, both defaults
	}},
}

// besideStock runs kube-apiserver binaries fork and stock in peer's modes on one etcd. In each
// of 3 rounds both create Services concurrently until the range is nearly full, and no two
// Services may get the same ClusterIP; between rounds the Services are deleted (see
// forkPeer.crossDelete). Then it audits the cluster as "clusterip check" does until the fork's
// repair has created the IPAddress objects of a Legacy peer's Services, stops the fork while
// stock creates more, and audits right after the fork is ready again: it reports ready only
// after its first repair pass, so nothing may be missing then. It returns the etcd and the fork,
// running.
func besideStock(t *testing.T, fork, stock string, peer forkPeer) (*testenv.Etcd, *testenv.KubeAPIServer) {
	t.Helper()
	const (
		perServer = 120 // of the 254 addresses of the /24, 1 taken by the kubernetes Service
		workers   = 8
		rounds    = 3
	)
	etcd := testenv.NewEtcd(t)
	f := testenv.NewKubeAPIServer(t, etcd, peer.fork.options(fork, v4Range))
	s := testenv.NewKubeAPIServer(t, etcd, peer.stock.options(stock, v4Range))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	servers := []server{{"fork", f.Client}, {"stock", s.Client}}

	created, dups := 0, 0
	for round := range rounds {
		start := time.Now()
		names := map[string][]string{}
		for _, srv := range servers {
			for i := range perServer {
				names[srv.name] = append(names[srv.name], fmt.Sprintf("%s-%d-%d", srv.name, round, i))
			}
		}
		parallel(t, workers, servers, names, func(ctx context.Context, c kubernetes.Interface, name string) error {
			_, err := c.CoreV1().Services(metav1.NamespaceDefault).Create(ctx, testenv.ClusterIPService(name, ""), metav1.CreateOptions{})
			return err
		})
		created += 2 * perServer
		n, d := countDuplicates(ctx, t, f.Client)
		dups += d
		t.Logf("round %d: %d Services created by each server with %d workers each in %v; %d Services hold %d duplicated ClusterIPs",
			round, perServer, workers, time.Since(start).Round(time.Millisecond), n, d)
		if round == rounds-1 {
			break
		}
		deleters := []server{{"fork", f.Client}, {"stock", f.Client}}
		if peer.crossDelete {
			deleters = []server{{"fork", s.Client}, {"stock", f.Client}}
		}
		parallel(t, workers, deleters, names, func(ctx context.Context, c kubernetes.Interface, name string) error {
			return c.CoreV1().Services(metav1.NamespaceDefault).Delete(ctx, name, metav1.DeleteOptions{})
		})
	}
	t.Logf("%d Services created in %d rounds, %d duplicate ClusterIPs", created, rounds, dups)

	// Audit as "clusterip check" does, in the fork's mode. A Legacy peer's Services
	// have no IPAddress objects: the fork's repair creates them within seconds.
	start := time.Now()
	for rep := audit(ctx, t, peer.fork.mode, etcd, f.Client); rep.Counts[string(repair.Missing)] > 0; rep = audit(ctx, t, peer.fork.mode, etcd, f.Client) {
		if time.Since(start) > 20*time.Second {
			t.Fatalf("the fork left %d Services' IPs without IPAddress objects for 20 s", rep.Counts[string(repair.Missing)])
		}
		time.Sleep(time.Second)
	}
	t.Logf("no IPAddress object missing %v after the last create", time.Since(start).Round(100*time.Millisecond))

	// Stop the fork, let stock create Services meanwhile, and start the fork again:
	// ready means its first repair pass is done, so nothing is missing then.
	f.Stop()
	for i := range 10 {
		if _, err := s.Client.CoreV1().Services(metav1.NamespaceDefault).Create(ctx, testenv.ClusterIPService(fmt.Sprintf("while-fork-down-%d", i), ""), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	f = testenv.NewKubeAPIServer(t, etcd, peer.fork.options(fork, v4Range))
	rep := audit(ctx, t, peer.fork.mode, etcd, f.Client)
	if n := rep.Counts[string(repair.Missing)]; n != 0 {
		t.Errorf("right after the fork's restart: %d Services' IPs missing, want 0 (its first repair pass creates them before it is ready)", n)
	}
	if _, d := countDuplicates(ctx, t, f.Client); d != 0 {
		t.Errorf("%d duplicates after the restart", d)
	}
	return etcd, f
}

// forkPeer is a mode of the fork and one of the stock server beside it on one etcd.
type forkPeer struct {
	fork, stock modeGate
	// crossDelete makes the stock server delete the fork's Services between rounds, and the
	// fork the stock's; otherwise the fork deletes all. A Legacy peer's delete of a fork's
	// Service clears the bit and leaves its IPAddress object until repair frees it after its
	// hold-off, so the next round would find the range full of such objects, as it would
	// with a stock dual-writing server instead of the fork.
	crossDelete bool
}

// forkPeers are, for each release with a fork, the pairs TestForkBesideStockNoDuplicates runs.
var forkPeers = map[string][]forkPeer{
	"v1.33.13": {
		{releaseModes["v1.33.13"][0], releaseModes["v1.33.13"][1], false}, // DualWrite, Legacy
		{releaseModes["v1.33.13"][0], releaseModes["v1.33.13"][0], true},  // DualWrite, DualWrite
	},
	"v1.35.4": laterPeers("v1.35.4"),
	"v1.36.3": laterPeers("v1.36.3"),
	"v1.37.2": {
		{releaseModes["v1.37.2"][1], releaseModes["v1.37.2"][1], true}, // DualWrite at emulated 1.34
		{releaseModes["v1.37.2"][0], releaseModes["v1.37.2"][0], true}, // IPAddressOnly
	},
	localcluster.KubeAPIServerV138: {
		{releaseModes[localcluster.KubeAPIServerV138][0], releaseModes[localcluster.KubeAPIServerV138][0], true}, // IPAddressOnly
	},
}

// laterPeers are the pairs of v1.35 and v1.36: the fork in dual write at emulated 1.33 beside
// stock in Legacy at emulated 1.33 (the skew of an upgrade from Legacy), both in dual write at
// emulated 1.34, and both in IPAddressOnly.
func laterPeers(rel string) []forkPeer {
	m := releaseModes[rel]
	return []forkPeer{{m[2], m[3], false}, {m[1], m[1], true}, {m[0], m[0], true}}
}

// server is a kube-apiserver under test, by name.
type server struct {
	name   string
	client kubernetes.Interface
}

// parallel calls op for each name of names[srv.name] through srv's client, from workers
// goroutines per server, all servers at once, and fails t with each error.
func parallel(t *testing.T, workers int, servers []server, names map[string][]string, op func(context.Context, kubernetes.Interface, string) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for _, srv := range servers {
		next := make(chan string)
		go func() {
			defer close(next)
			for _, n := range names[srv.name] {
				next <- n
			}
		}()
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for name := range next {
					if err := op(ctx, srv.client, name); err != nil {
						mu.Lock()
						errs = append(errs, fmt.Errorf("%s: %s: %w", srv.name, name, err))
						mu.Unlock()
					}
				}
			}()
		}
	}
	wg.Wait()
	for _, err := range errs {
		t.Error(err)
	}
}

// countDuplicates lists every Service and returns how many there are and how many ClusterIPs
// more than one of them holds, failing t with each.
func countDuplicates(ctx context.Context, t *testing.T, c kubernetes.Interface) (services, dups int) {
	t.Helper()
	list, err := c.CoreV1().Services(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	owners := map[string][]string{}
	for _, svc := range list.Items {
		for _, ip := range svc.Spec.ClusterIPs {
			owners[ip] = append(owners[ip], svc.Namespace+"/"+svc.Name)
		}
	}
	for ip, o := range owners {
		if len(o) > 1 {
			dups++
			t.Errorf("ClusterIP %s held by %v", ip, o)
		}
	}
	return len(list.Items), dups
}

// audit runs repair.Audit in mode, logs the report in short and fails t for a duplicate owner.
func audit(ctx context.Context, t *testing.T, mode featuregate.Mode, etcd *testenv.Etcd, c kubernetes.Interface) *repair.Report {
	t.Helper()
	rng, _ := clusterip.ParseRanges(v4Range)
	cfg := clusterip.Config{Mode: mode, Ranges: rng, Client: c}
	if mode != featuregate.IPAddressOnly {
		cfg.Bitmaps = etcdstore.Stores{Client: etcd.TestClient(t)}
	}
	rep, err := repair.Audit(ctx, cfg)
	if err != nil {
		t.Fatalf("audit: %v", err)
	}
	t.Logf("audit: consistent=%v counts=%v", rep.Consistent, rep.Counts)
	for i, fd := range rep.Findings {
		if fd.Class == repair.DuplicateOwner {
			t.Errorf("audit: %s %s %s: %s", fd.IP, fd.Class, fd.Service, fd.Detail)
		} else if i < 5 {
			t.Logf("audit finding: %s %s %s: %s", fd.IP, fd.Class, fd.Service, fd.Detail)
		}
	}
	return rep
}

// TestForkIPAddressObjectsMatchStock creates the same Service on stock and on the fork, with each
// of its write paths, in DualWrite and IPAddressOnly mode, and compares the IPAddress objects, the
// watch event of their creation and their delete with the Service. With the default (loopback)
// writes the objects are the same but for uid, resourceVersion, creation time and the times of
// their managedFields; the registry path writes no managedFields.
func TestForkIPAddressObjectsMatchStock(t *testing.T) {
	t.Parallel()
	sides := forkSides(t)
	const ip = "10.96.0.9"
	for _, mode := range []featuregate.Mode{featuregate.DualWrite, featuregate.IPAddressOnly} {
		t.Run(mode.String(), func(t *testing.T) {
			mg := modeOrSkip(t, mode)
			objs := map[string]*networkingv1.IPAddress{}
			for _, side := range sides {
				etcd := testenv.NewEtcd(t)
				opts := mg.options(side.bin, v4Range)
				opts.Env = side.env
				s := testenv.NewKubeAPIServer(t, etcd, opts)
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				ipas := s.Client.NetworkingV1().IPAddresses()
				w, err := ipas.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + ip})
				if err != nil {
					t.Fatalf("%s: watch IPAddress %s: %v", side.name, ip, err)
				}
				svcs := s.Client.CoreV1().Services(metav1.NamespaceDefault)
				if _, err := svcs.Create(ctx, testenv.ClusterIPService("chosen", ip), metav1.CreateOptions{}); err != nil {
					t.Fatalf("%s: create Service with ClusterIP %s: %v", side.name, ip, err)
				}
				ev := <-w.ResultChan()
				if watched, ok := ev.Object.(*networkingv1.IPAddress); ev.Type != watch.Added || !ok || watched.Name != ip {
					t.Errorf("%s: first watch event %s %T, want ADDED IPAddress %s", side.name, ev.Type, ev.Object, ip)
				}
				obj, err := ipas.Get(ctx, ip, metav1.GetOptions{})
				if err != nil {
					t.Fatalf("%s: get IPAddress %s: %v", side.name, ip, err)
				}
				objs[side.name] = obj
				if err := svcs.Delete(ctx, "chosen", metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
				for ev := range w.ResultChan() {
					if ev.Type == watch.Deleted {
						break
					}
				}
				if _, err := ipas.Get(ctx, ip, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
					t.Errorf("%s: IPAddress %s after its Service's delete: %v, want NotFound", side.name, ip, err)
				}
				w.Stop()
				cancel()
				s.Stop()
			}
			st := objs["stock"]
			if len(st.ManagedFields) == 0 {
				t.Errorf("stock's IPAddress has no managedFields; the fork's are compared with them")
			}
			if reg := objs["fork/registry"]; len(reg.ManagedFields) != 0 {
				t.Errorf("the registry path's IPAddress has managedFields %+v, want none (its documented difference)", reg.ManagedFields)
			}
			for _, o := range objs {
				o.UID, o.ResourceVersion, o.CreationTimestamp, o.Generation = "", "", metav1.Time{}, 0
				for i := range o.ManagedFields {
					o.ManagedFields[i].Time = nil
				}
			}
			if diff := cmp.Diff(st, objs["fork"]); diff != "" {
				t.Errorf("IPAddress %s, stock (-) against the fork (+), but for uid, resourceVersion, creation and managedFields times:\n%s", ip, diff)
			}
			objs["fork/registry"].ManagedFields = st.ManagedFields
			if diff := cmp.Diff(st, objs["fork/registry"]); diff != "" {
				t.Errorf("IPAddress %s, stock (-) against the fork's registry path (+), but for uid, resourceVersion, creation and managedFields:\n%s", ip, diff)
			}
		})
	}
}
