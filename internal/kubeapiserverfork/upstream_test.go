package kubeapiserverfork_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kube-ipam/clusterip/internal/localcluster"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

// upstreamEnv names the environment variable that selects upstream's integration test packages
// TestUpstreamIntegration runs against the fork and against stock, such as "servicecidr" or
// "servicecidr,dualstack" (packages of k8s.io/kubernetes/test/integration). Unset, the test is
// skipped: the packages take minutes to build and to run.
const upstreamEnv = "CLUSTERIP_FORK_UPSTREAM_TESTS"

// upstreamRunEnv optionally narrows them with a -run pattern.
const upstreamRunEnv = "CLUSTERIP_FORK_UPSTREAM_RUN"

// upstreamSidesEnv optionally names the sides to run, "stock", "fork" or "stock,fork" (the
// default). With one side only there is nothing to compare, only the fork's failures to report.
const upstreamSidesEnv = "CLUSTERIP_FORK_UPSTREAM_SIDES"

// upstreamTableEnv optionally names a file the side-by-side table is written to, as Markdown.
const upstreamTableEnv = "CLUSTERIP_FORK_UPSTREAM_TABLE"

// upstreamDifferences lists the upstream tests whose result on the fork must differ from
// stock's, with the reason; docs/upstream-tests.md lists the same. A test not listed here that
// fails on the fork, or whose result differs from stock's, fails TestUpstreamIntegration.
var upstreamDifferences = map[string]string{}

// The results go test -v prints, and the tests it starts.
var (
	resultLine = regexp.MustCompile(`(?m)^\s*--- (PASS|FAIL|SKIP): (\S+) \(([^)]*)\)`)
	runLine    = regexp.MustCompile(`(?m)^=== RUN\s+(\S+)`)
)

// upstreamRun is the outcome of one side's go test of one upstream package.
type upstreamRun struct {
	results map[string]string // test name (with subtests) to PASS, FAIL, SKIP or "none" (started, no result)
	times   map[string]string // test name to the time go test gave its result
	order   []string          // names in the order go test started or reported them
	elapsed time.Duration
	err     error
	log     string // path of the kept log
}

// count returns the number of results with status st.
func (r *upstreamRun) count(st string) int {
	n := 0
	for _, s := range r.results {
		if s == st {
			n++
		}
	}
	return n
}

// TestUpstreamIntegration runs kube-apiserver's own integration tests of Service ClusterIPs, of
// the release under test (CLUSTERIP_FORK_RELEASE), on the fork's code and on the stock code, side
// by side: they start kube-apiserver in-process, so each side is built with the same go command,
// module file and -trimpath, the fork's with the fork's patches and new files (-overlay) and
// stock's without; both dial the embedded etcd this test starts (KUBE_INTEGRATION_ETCD_URL). It
// logs a table of every test and subtest, stock's result beside the fork's, and the counts of
// each side (passed, failed, skipped, started without a result). A test that fails on the fork,
// or whose result differs from stock's, fails this test unless upstreamDifferences lists it.
func TestUpstreamIntegration(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping upstream integration tests in -short mode")
	}
	pkgs := os.Getenv(upstreamEnv)
	if pkgs == "" {
		t.Skipf("set %s=servicecidr,dualstack to run upstream's integration tests against the fork and stock", upstreamEnv)
	}
	sides := []string{"stock", "fork"}
	if s := os.Getenv(upstreamSidesEnv); s != "" {
		sides = nil
		for _, side := range strings.Split(s, ",") {
			side = strings.TrimSpace(side)
			if side != "stock" && side != "fork" {
				t.Fatalf("%s=%q: want stock, fork or stock,fork", upstreamSidesEnv, s)
			}
			sides = append(sides, side)
		}
	}
	dir, forkFlags, err := localcluster.KubeAPIServerForkGoFlags(context.Background(), release(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// Stock's build: the same flags without -overlay, so the same pristine module directory,
	// compiled as it is.
	var stockFlags []string
	for i := 0; i < len(forkFlags); i++ {
		if forkFlags[i] == "-overlay" {
			i++
			continue
		}
		stockFlags = append(stockFlags, forkFlags[i])
	}
	flags := map[string][]string{"stock": stockFlags, "fork": forkFlags}
	// Built with -trimpath, kube-apiserver's test server finds its own source directory only
	// through Bazel's variables; point them at the module cache, which -trimpath names paths by.
	modCache, err := exec.Command("go", "env", "GOMODCACHE").Output()
	if err != nil {
		t.Fatalf("go env GOMODCACHE: %v", err)
	}
	var table strings.Builder
	for _, pkg := range strings.Split(pkgs, ",") {
		pkg = strings.TrimSpace(pkg)
		t.Run(pkg, func(t *testing.T) {
			runs := map[string]*upstreamRun{}
			for _, side := range sides {
				etcd := testenv.NewEtcd(t)
				runs[side] = runUpstream(t, dir, flags[side], pkg, side, etcd.Endpoints()[0], strings.TrimSpace(string(modCache)))
			}
			tbl := sideBySide(pkg, sides, runs)
			t.Log("\n" + tbl)
			table.WriteString(tbl + "\n")
			for _, side := range sides {
				r := runs[side]
				t.Logf("%s on %s: %d passed, %d failed, %d skipped, %d without a result (tests and subtests) in %v; go test: %v",
					pkg, side, r.count("PASS"), r.count("FAIL"), r.count("SKIP"), r.count("none"), r.elapsed.Round(time.Second), r.err)
			}
			fork, stock := runs["fork"], runs["stock"]
			var bad []string
			check := func(name, why string) {
				if reason, ok := upstreamDifferences[name]; ok {
					t.Logf("%s: %s, as listed: %s", name, why, reason)
					return
				}
				bad = append(bad, name+": "+why)
			}
			if fork != nil {
				for _, name := range fork.order {
					switch st := fork.results[name]; {
					case st == "FAIL" || st == "none":
						check(name, "fork "+st)
					case stock != nil && stock.results[name] == "FAIL" && st == "PASS":
						// Stock's own failure, the fork's pass: stock v1.33 has flakes of its own
						// (TestServiceAllocation/IP_allocator_only once answered "range is full" in
						// a range with room), which are stock's to fix, not a difference of the fork.
						t.Logf("%s: stock FAIL, fork PASS (see stock's log)", name)
					case stock != nil && stock.results[name] != st:
						check(name, fmt.Sprintf("stock %s, fork %s", orNotRun(stock.results[name]), st))
					}
				}
				if fork.err != nil && len(bad) == 0 && fork.count("FAIL") == 0 {
					bad = append(bad, fmt.Sprintf("go test on the fork: %v", fork.err))
				}
			}
			for _, side := range sides {
				if len(runs[side].results) == 0 {
					bad = append(bad, fmt.Sprintf("no test ran on %s: a -run pattern that matches nothing, or a build failure (%v)", side, runs[side].err))
				}
			}
			if stock != nil && fork != nil {
				for _, name := range stock.order {
					if _, ok := fork.results[name]; !ok {
						check(name, "stock "+stock.results[name]+", not run on the fork")
					}
				}
			}
			for _, side := range sides {
				if runs[side].err != nil || len(bad) > 0 {
					t.Logf("%s's whole log is kept in %s", side, runs[side].log)
				} else {
					os.Remove(runs[side].log)
				}
			}
			if len(bad) > 0 {
				t.Errorf("%s: %d upstream tests differ on the fork and are not listed in upstreamDifferences:\n%s", pkg, len(bad), strings.Join(bad, "\n"))
			}
		})
	}
	if p := os.Getenv(upstreamTableEnv); p != "" {
		if err := os.WriteFile(p, []byte(table.String()), 0o644); err != nil {
			t.Error(err)
		}
	}
}

// runUpstream runs go test -v on k8s.io/kubernetes/test/integration/<pkg> with flags from dir,
// against the etcd at etcdURL, and returns its results.
func runUpstream(t *testing.T, dir string, flags []string, pkg, side, etcdURL, modCache string) *upstreamRun {
	t.Helper()
	args := append([]string{"test", "-mod=mod"}, flags...)
	args = append(args, "-count=1", "-v", "-timeout=60m")
	if run := os.Getenv(upstreamRunEnv); run != "" {
		args = append(args, "-run", run)
	}
	args = append(args, "k8s.io/kubernetes/test/integration/"+pkg)
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	// The fork module's go: GOWORK=off, no GOFLAGS, and its toolchain (v1.38's Go 1.27).
	env, err := localcluster.NestedGoEnv(dir)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Env = append(env, "KUBE_INTEGRATION_ETCD_URL="+etcdURL, "TEST_SRCDIR="+modCache, "TEST_WORKSPACE=.")
	log, err := os.CreateTemp("", "kubeapiserverfork-upstream-"+pkg+"-"+side+"-*.log")
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	cmd.Stdout, cmd.Stderr = log, log
	start := time.Now()
	r := &upstreamRun{results: map[string]string{}, times: map[string]string{}, log: log.Name()}
	r.err = cmd.Run()
	r.elapsed = time.Since(start)
	data, _ := os.ReadFile(log.Name())
	for _, m := range runLine.FindAllStringSubmatch(string(data), -1) {
		if _, ok := r.results[m[1]]; !ok {
			r.results[m[1]] = "none"
			r.order = append(r.order, m[1])
		}
	}
	for _, m := range resultLine.FindAllStringSubmatch(string(data), -1) {
		if _, ok := r.results[m[2]]; !ok {
			r.order = append(r.order, m[2])
		}
		r.results[m[2]] = m[1]
		r.times[m[2]] = m[3]
	}
	t.Logf("%s on %s: go test in %v: %v", pkg, side, r.elapsed.Round(time.Second), r.err)
	return r
}

// sideBySide returns a Markdown table of every test of pkg with each side's result, then each
// side's counts.
func sideBySide(pkg string, sides []string, runs map[string]*upstreamRun) string {
	var names []string
	for _, side := range sides {
		for _, n := range runs[side].order {
			if !slices.Contains(names, n) {
				names = append(names, n)
			}
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "| %s test | %s | %s | differs |\n|---|%s%s---|\n", pkg, strings.Join(sides, " | "),
		strings.Join(sides, " time | ")+" time", strings.Repeat("---|", len(sides)), strings.Repeat("---:|", len(sides)))
	for _, n := range names {
		var sts, times []string
		for _, side := range sides {
			sts = append(sts, orNotRun(runs[side].results[n]))
			times = append(times, runs[side].times[n])
		}
		differs := ""
		if len(sts) > 1 && slices.ContainsFunc(sts, func(s string) bool { return s != sts[0] }) {
			differs = "**yes**"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", n, strings.Join(sts, " | "), strings.Join(times, " | "), differs)
	}
	for _, st := range []string{"PASS", "FAIL", "SKIP", "none"} {
		var cs []string
		for _, side := range sides {
			cs = append(cs, fmt.Sprint(runs[side].count(st)))
		}
		fmt.Fprintf(&b, "| **%s total** | %s |%s |\n", st, strings.Join(cs, " | "), strings.Repeat(" |", len(sides)))
	}
	return b.String()
}

func orNotRun(s string) string {
	if s == "" {
		return "not run"
	}
	return s
}
