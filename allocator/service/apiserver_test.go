package service_test

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-ipam/clusterip/internal/testenv"
)

var updateMatrix = flag.Bool("update-matrix", false, "rewrite ../../testdata/services-<release>.yaml from what real kube-apiservers of the release answer")

// stockRun is one way TestServiceMatrixKubeAPIServer starts a stock kube-apiserver of a release.
type stockRun struct {
	name   string
	legacy bool // Legacy mode: its texts may differ from the default mode's, its results not
	gates  string
	args   []string
}

// stockRuns returns the runs of release: its default mode; Legacy mode where the release reaches
// it (MultiCIDRServiceAllocator is locked on from 1.34, so v1.35 and v1.36 reach it only emulating
// 1.33, and v1.37 not at all); and for v1.37, DualWrite emulating 1.34, which must answer
// exactly as the default mode. v1.38 runs IPAddressOnly only (no bitmap, no dual write at any
// version it emulates), so its default mode is its one run. Where the emulated version would turn StrictIPCIDRValidation off,
// the run turns it on, as the release has it by default.
func stockRuns(release string) []stockRun {
	runs := []stockRun{{name: "default"}}
	switch release {
	case "v1.33.13":
		runs = append(runs, stockRun{name: "Legacy", legacy: true, gates: "MultiCIDRServiceAllocator=false"})
	case "v1.35.4":
		runs = append(runs, stockRun{name: "Legacy", legacy: true, gates: "MultiCIDRServiceAllocator=false", args: []string{"--emulated-version=1.33"}})
	case "v1.36.3":
		// StrictIPCIDRValidation is on by default at 1.36, not at the emulated 1.33.
		runs = append(runs, stockRun{name: "Legacy", legacy: true, gates: "MultiCIDRServiceAllocator=false,StrictIPCIDRValidation=true", args: []string{"--emulated-version=1.33"}})
	case "v1.37.2":
		runs = append(runs, stockRun{name: "DualWrite", gates: "DisableAllocatorDualWrite=false,StrictIPCIDRValidation=true", args: []string{"--emulated-version=1.34"}})
	}
	return runs
}

// hasLegacyRun reports whether release runs Legacy mode, whose texts the matrix records.
func hasLegacyRun(release string) bool {
	return slices.ContainsFunc(stockRuns(release), func(r stockRun) bool { return r.legacy })
}

// TestServiceMatrixKubeAPIServer runs every case of each release's Service matrix against a real
// stock kube-apiserver of that release per cluster shape, one at a time, in its default mode and
// in Legacy mode where the release runs it (see stockRuns), and checks that it answers what the
// matrix expects: results, status codes, reasons, field paths and texts. With -update-matrix it
// records the answers into the release's matrix instead: the default mode's, and the Legacy
// mode's texts where they differ (its results must not). A release not in
// those the tests build runs where its binary is at hand (see testenv.StockKubeAPIServer).
func TestServiceMatrixKubeAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping kube-apiserver test in -short mode")
	}
	for _, release := range matrixReleases {
		t.Run(release, func(t *testing.T) {
			if !stockMatrixSelected(release) {
				t.Skipf("the recorded matrix of %s is checked against its stock binary with $%s=all (or =%s); by default only the newest release's is", release, stockMatrixEnv, release)
			}
			testStockMatrix(t, release, testenv.SkipWithoutStock(t, release))
		})
	}
}

// stockMatrixEnv selects the releases whose recorded matrix TestServiceMatrixKubeAPIServer checks
// against a stock kube-apiserver: "all", or releases separated by commas. Unset, the newest
// release that has shipped (whose stock build the tests make when missing) and the pre-releases
// after it (v1.38's beta, checked where its build is at hand): the others' are recordings of
// pinned stock binaries, which answer the same until the inputs change, and then every release is
// recorded again (-update-matrix, which checks every release named by -run). Each release costs
// up to 8 kube-apiservers and about 2 000 case runs, minutes with the race detector.
const stockMatrixEnv = "CLUSTERIP_STOCK_MATRIX"

// stockMatrixSelected reports whether $CLUSTERIP_STOCK_MATRIX (or -update-matrix) selects release.
func stockMatrixSelected(release string) bool {
	v := os.Getenv(stockMatrixEnv)
	switch {
	case *updateMatrix || v == "all":
		return true
	case v == "":
		return slices.Index(matrixReleases, release) >= slices.Index(matrixReleases, newestShipped(matrixReleases))
	}
	return slices.Contains(strings.Split(v, ","), release)
}

// newestShipped returns the last of releases (oldest first) that is not a pre-release, such as
// "v1.37.2" before "v1.38.0-beta.0", or "" if all are.
func newestShipped(releases []string) string {
	for _, r := range slices.Backward(releases) {
		if !strings.Contains(r, "-") {
			return r
		}
	}
	return ""
}

// TestStockMatrixSelectedByDefault checks which releases' matrices TestServiceMatrixKubeAPIServer
// checks against stock when $CLUSTERIP_STOCK_MATRIX is unset: the newest release that has
// shipped and the pre-releases after it, so that a beta's matrix is checked beside the newest
// release's rather than in its place (CI builds no beta).
func TestStockMatrixSelectedByDefault(t *testing.T) {
	t.Setenv(stockMatrixEnv, "")
	shipped := newestShipped(matrixReleases)
	if shipped == "" {
		t.Fatalf("newestShipped(%v) = \"\", want a release", matrixReleases)
	}
	after := false
	for _, r := range matrixReleases {
		after = after || r == shipped
		if got := stockMatrixSelected(r); got != after {
			t.Errorf("stockMatrixSelected(%q) = %v, want %v (newest shipped %s)", r, got, after, shipped)
		}
	}
	tests := []struct {
		name     string
		releases []string
		want     string
	}{
		{"a beta after the newest", []string{"v1.36.3", "v1.37.2", "v1.38.0-beta.0"}, "v1.37.2"},
		{"the newest has shipped", []string{"v1.37.2", "v1.38.0"}, "v1.38.0"},
		{"only pre-releases", []string{"v1.38.0-beta.0"}, ""},
		{"none", nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := newestShipped(tt.releases); got != tt.want {
				t.Errorf("newestShipped(%v) = %q, want %q", tt.releases, got, tt.want)
			}
		})
	}
}

func testStockMatrix(t *testing.T, release, binary string) {
	m := &matrixFile{Clusters: matrixClusters, Cases: matrixInputs()}
	if !*updateMatrix {
		m = loadMatrix(t, release)
	}
	etcd := testenv.NewEtcd(t)
	runs, agreed := 0, 0
	for _, cl := range m.Clusters {
		for _, run := range stockRuns(release) {
			mode := run.name
			t.Run(cl.Name+"/"+mode, func(t *testing.T) {
				ranges := clusterRanges(t, cl)
				api := testenv.NewKubeAPIServer(t, etcd, testenv.KubeAPIServerOptions{
					Binary:                binary,
					ServiceClusterIPRange: strings.Join(cl.Ranges, ","),
					EtcdPrefix:            "/registry-" + cl.Name + "-" + strings.ToLower(mode),
					FeatureGates:          run.gates,
					ExtraArgs:             run.args,
				})
				ctx := context.Background()
				waitForDefaultNamespace(t, ctx, api.Client)
				if v, err := api.Client.Discovery().ServerVersion(); err != nil || v.GitVersion != release {
					t.Fatalf("the kube-apiserver is %v (%v), want %s", v, err, release)
				}
				for i := range m.Cases {
					tc := &m.Cases[i]
					got := runCaseOnAPIServer(t, ctx, api.Client, ranges, fmt.Sprintf("m%d", i), *tc)
					if *updateMatrix && (run.name == "default" || run.legacy) {
						recordExpect(t, tc, cl.Name, run.legacy, got)
						continue
					}
					runs++
					want, ok := tc.Expect[cl.Name]
					if !ok {
						t.Errorf("%s: no expectation for cluster %s", tc.Name, cl.Name)
						continue
					}
					want = expectIn(want, run.legacy)
					if diff := cmp.Diff(want, got); diff != "" {
						t.Errorf("%s: kube-apiserver disagrees with the matrix (-want +got):\n%s", tc.Name, diff)
						continue
					}
					agreed++
				}
			})
		}
	}
	if *updateMatrix {
		if err := writeMatrix(m, release, "a real kube-apiserver "+release+" per cluster shape"); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s: %d cases × %d clusters", matrixPathFor(release), len(m.Cases), len(m.Clusters))
		return
	}
	t.Logf("%d of %d case runs (%d cases × %d clusters × %d modes) agree with kube-apiserver %s",
		agreed, runs, len(m.Cases), len(m.Clusters), len(stockRuns(release)), release)
}

// recordExpect records got, what a server of the mode answered to tc on cluster: the default
// mode's answer whole, the Legacy mode's texts where they differ from it. A Legacy result that
// differs fails t, as the matrix holds one result per cluster.
func recordExpect(t *testing.T, tc *matrixCase, cluster string, legacy bool, got matrixExpect) {
	t.Helper()
	if tc.Expect == nil {
		tc.Expect = map[string]matrixExpect{}
	}
	if !legacy {
		tc.Expect[cluster] = got
		return
	}
	e := tc.Expect[cluster]
	if diff := cmp.Diff(e.Create, got.Create); diff != "" {
		t.Errorf("%s: Legacy mode's create result differs from the default mode's (-default +Legacy):\n%s", tc.Name, diff)
	}
	if diff := cmp.Diff(e.Update, got.Update); diff != "" {
		t.Errorf("%s: Legacy mode's update result differs from the default mode's (-default +Legacy):\n%s", tc.Name, diff)
	}
	e.CreateText = withLegacy(e.CreateText, got.CreateText)
	e.UpdateText = withLegacy(e.UpdateText, got.UpdateText)
	tc.Expect[cluster] = e
}

// withLegacy returns def with legacy as its Legacy text when the two differ.
func withLegacy(def, legacy *matrixText) *matrixText {
	if def == nil || legacy == nil || cmp.Equal(def, legacy) {
		return def
	}
	out := *def
	out.Legacy = legacy
	return &out
}

// expectIn returns e with the texts of the mode.
func expectIn(e matrixExpect, legacy bool) matrixExpect {
	e.CreateText = e.CreateText.In(legacy)
	e.UpdateText = e.UpdateText.In(legacy)
	return e
}

// runCaseOnAPIServer creates (and updates) the case's Service through the API and returns what
// the server answered, then deletes everything it created.
func runCaseOnAPIServer(t *testing.T, ctx context.Context, c kubernetes.Interface, ranges []netip.Prefix, name string, tc matrixCase) matrixExpect {
	t.Helper()
	services := c.CoreV1().Services("default")
	defer func() {
		for _, n := range []string{name, name + "-taken-0", name + "-taken-1"} {
			_ = services.Delete(ctx, n, metav1.DeleteOptions{})
		}
	}()
	served := map[corev1.IPFamily]bool{}
	for _, p := range ranges {
		served[familyOfPrefix(p)] = true
	}
	for i, ip := range tc.Taken {
		a := netip.MustParseAddr(ip)
		if !served[familyOfPrefix(netip.PrefixFrom(a, 0))] {
			continue
		}
		single := corev1.IPFamilyPolicySingleStack
		blocker := matrixService(fmt.Sprintf("%s-taken-%d", name, i), matrixSpec{})
		blocker.Spec.IPFamilyPolicy = &single
		blocker.Spec.ClusterIP, blocker.Spec.ClusterIPs = ip, []string{ip}
		if _, err := services.Create(ctx, blocker, metav1.CreateOptions{}); err != nil {
			t.Fatalf("%s: create the Service holding %s: %v", tc.Name, ip, err)
		}
	}
	var got matrixExpect
	created, err := services.Create(ctx, matrixService(name, tc.Create), metav1.CreateOptions{})
	got.Create = resultOf(t, tc, ranges, created, nil, err)
	got.CreateText = textOf(t, tc, ranges, nil, err)
	if err != nil || tc.Update == nil {
		return got
	}
	svc := created.DeepCopy()
	applySpec(svc, *tc.Update, created)
	updated, err := services.Update(ctx, svc, metav1.UpdateOptions{})
	r := resultOf(t, tc, ranges, updated, created, err)
	got.Update = &r
	got.UpdateText = textOf(t, tc, ranges, created, err)
	return got
}

func familyOfPrefix(p netip.Prefix) corev1.IPFamily {
	if p.Addr().Is4() {
		return corev1.IPv4Protocol
	}
	return corev1.IPv6Protocol
}

// waitForDefaultNamespace waits until the apiserver's bootstrap has created the default
// namespace, which it does shortly after it reports ready.
func waitForDefaultNamespace(t *testing.T, ctx context.Context, c kubernetes.Interface) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := c.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{})
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("namespace default: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
