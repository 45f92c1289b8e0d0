package kubeapiserverfork_test

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kube-ipam/clusterip/internal/localcluster"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

// upstreamEnv names the environment variable that selects upstream's integration test packages
// TestUpstreamIntegration runs against the fork, such as "servicecidr" or "servicecidr,dualstack"
// (packages of k8s.io/kubernetes/test/integration). Unset, the test is skipped: the packages take
// minutes to build and to run.
const upstreamEnv = "CLUSTERIP_FORK_UPSTREAM_TESTS"

// upstreamRunEnv optionally narrows them with a -run pattern.
const upstreamRunEnv = "CLUSTERIP_FORK_UPSTREAM_RUN"

// TestUpstreamIntegration runs kube-apiserver v1.33.13's own integration tests of Service
// ClusterIPs on the fork's code: they start kube-apiserver in-process, so they are built with the
// fork's patches and overlay, and they dial the embedded etcd this test starts
// (KUBE_INTEGRATION_ETCD_URL). Each upstream test's result is logged; any failure fails this test.
func TestUpstreamIntegration(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping upstream integration tests in -short mode")
	}
	pkgs := os.Getenv(upstreamEnv)
	if pkgs == "" {
		t.Skipf("set %s=servicecidr,dualstack to run upstream's integration tests against the fork", upstreamEnv)
	}
	dir, flags, err := localcluster.KubeAPIServerForkGoFlags(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// Built with -trimpath, kube-apiserver's test server finds its own source directory only
	// through Bazel's variables; point them at the module cache, which -trimpath names paths by.
	modCache, err := exec.Command("go", "env", "GOMODCACHE").Output()
	if err != nil {
		t.Fatalf("go env GOMODCACHE: %v", err)
	}
	etcd := testenv.NewEtcd(t)
	for _, pkg := range strings.Split(pkgs, ",") {
		pkg = strings.TrimSpace(pkg)
		t.Run(pkg, func(t *testing.T) {
			args := append([]string{"test", "-mod=mod"}, flags...)
			args = append(args, "-count=1", "-v", "-timeout=60m")
			if run := os.Getenv(upstreamRunEnv); run != "" {
				args = append(args, "-run", run)
			}
			args = append(args, "k8s.io/kubernetes/test/integration/"+pkg)
			cmd := exec.Command("go", args...)
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=", "KUBE_INTEGRATION_ETCD_URL="+etcd.Endpoints()[0],
				"TEST_SRCDIR="+strings.TrimSpace(string(modCache)), "TEST_WORKSPACE=.")
			log, err := os.CreateTemp("", "kubeapiserverfork-upstream-"+pkg+"-*.log")
			if err != nil {
				t.Fatal(err)
			}
			defer log.Close()
			logPath := log.Name()
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("the whole log is kept in %s", logPath)
				} else {
					os.Remove(logPath)
				}
			})
			cmd.Stdout, cmd.Stderr = log, log
			start := time.Now()
			runErr := cmd.Run()
			data, _ := os.ReadFile(logPath)
			results := regexp.MustCompile(`(?m)^(?:    )*--- (PASS|FAIL|SKIP): (\S+) \(([^)]*)\)`).FindAllStringSubmatch(string(data), -1)
			passed, failed := 0, 0
			for _, r := range results {
				if !strings.Contains(r[2], "/") {
					t.Logf("%s %s (%s)", r[1], r[2], r[3])
				}
				switch r[1] {
				case "PASS":
					passed++
				case "FAIL":
					failed++
				}
			}
			t.Logf("%s: %d passed, %d failed (tests and subtests) in %v", pkg, passed, failed, time.Since(start).Round(time.Second))
			if runErr != nil {
				s := bufio.NewScanner(strings.NewReader(string(data)))
				var fails []string
				for s.Scan() {
					if l := s.Text(); strings.Contains(l, "--- FAIL") || strings.Contains(l, "_test.go:") && strings.Contains(strings.ToLower(l), "error") {
						fails = append(fails, l)
					}
				}
				if len(fails) > 60 {
					fails = fails[:60]
				}
				t.Errorf("go test k8s.io/kubernetes/test/integration/%s: %v\n%s\n--- end of the log:\n%s", pkg, runErr, strings.Join(fails, "\n"), tailLines(string(data), 40))
			}
		})
	}
}

// tailLines returns the last n lines of s.
func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
