//go:build !clusterip_slim

package main

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kube-ipam/clusterip/internal/localcluster"
)

// demoSummary is the part of demo --json the tests read.
type demoSummary struct {
	API    string
	Phases []struct {
		Name       string
		Allocators []struct {
			Allocator, Mode, Family string
			Allocations, Errors     int
			FirstError              string
		}
		Repair *struct{ Counts map[string]int }
		Audit  struct {
			Mode       string
			Consistent bool
			Counts     map[string]int
		}
		Duplicates int
	}
	Duplicates int
}

// withoutEtcdBinary makes the commands t runs fail if they use the tests' etcd binary: the command
// starts its etcd in its own process, as it must when installed with "go install", without a
// clone of the repository and its .cache/.
func withoutEtcdBinary(t *testing.T) {
	t.Helper()
	t.Setenv(localcluster.EtcdEnv, filepath.Join(t.TempDir(), "no-etcd-binary"))
}

// runDemoJSON runs demo --json with args, without the tests' etcd binary (see withoutEtcdBinary),
// and decodes what it printed.
func runDemoJSON(t *testing.T, args ...string) demoSummary {
	t.Helper()
	withoutEtcdBinary(t)
	r := clusterip(t, append([]string{"demo", "--json"}, args...)...)
	if r.code != 0 {
		t.Fatalf("demo --json %q: exit %d\nstdout:\n%s\nstderr:\n%s", args, r.code, r.stdout, r.stderr)
	}
	var sum demoSummary
	if err := json.Unmarshal([]byte(r.stdout), &sum); err != nil {
		t.Fatalf("decode %q: %v", r.stdout, err)
	}
	return sum
}

// checkUpgradeWalk checks what every demo run must show: the three phases with the modes of the
// upgrade, Services allocated by every kube-apiserver played in every family without error, no
// duplicate, a repair pass before the last phase, and a consistent cluster at the end.
func checkUpgradeWalk(t *testing.T, sum demoSummary) {
	t.Helper()
	var got []string
	for _, p := range sum.Phases {
		for _, a := range p.Allocators {
			got = append(got, fmt.Sprintf("%s: %s %s %s", p.Name, a.Allocator, a.Mode, a.Family))
			if a.Allocations == 0 || a.Errors != 0 {
				t.Errorf("%s, %s %s: %d allocations, %d errors (first: %s); want some and none",
					p.Name, a.Allocator, a.Family, a.Allocations, a.Errors, a.FirstError)
			}
		}
		if p.Duplicates != 0 {
			t.Errorf("%s: %d duplicates, want 0", p.Name, p.Duplicates)
		}
	}
	var want []string
	for _, row := range []string{
		"Legacy: apiserver-a Legacy", "Legacy: apiserver-b Legacy",
		"DualWrite beside Legacy: apiserver-a DualWrite", "DualWrite beside Legacy: apiserver-b Legacy",
		"IPAddressOnly: apiserver-a IPAddressOnly", "IPAddressOnly: apiserver-b IPAddressOnly",
	} {
		want = append(want, row+" IPv4", row+" IPv6")
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("phases and allocators (-want +got):\n%s", diff)
	}
	if sum.Duplicates != 0 {
		t.Errorf("duplicates = %d, want 0", sum.Duplicates)
	}
	if len(sum.Phases) != 3 {
		return
	}
	if first := sum.Phases[0].Audit; !first.Consistent || first.Mode != "Legacy" {
		t.Errorf("audit after the Legacy phase = %+v, want a consistent Legacy audit", first)
	}
	last := sum.Phases[2]
	if last.Repair == nil || last.Repair.Counts["missing"] == 0 {
		t.Errorf("repair pass before the IPAddressOnly phase = %+v, want IPAddress objects created for Services allocated in Legacy mode", last.Repair)
	}
	if !last.Audit.Consistent || last.Audit.Mode != "IPAddressOnly" || last.Audit.Counts["services"] != last.Audit.Counts["ipAddresses"] {
		t.Errorf("audit after the IPAddressOnly phase = %+v, want it consistent, one IPAddress per Service", last.Audit)
	}
}

func TestDemoJSONWalksTheUpgradeOnEmbeddedEtcd(t *testing.T) {
	sum := runDemoJSON(t, "--fake-api", "--service-cluster-ip-range", "10.96.0.0/24,fd00:10:96::/112", "-n", "100", "--workers", "2", "--duration", "1s")
	if !strings.Contains(sum.API, "fake clientset") {
		t.Errorf("api = %q, want it to say the fake clientset was used", sum.API)
	}
	checkUpgradeWalk(t, sum)
}

func TestDemoJSONWalksTheUpgradeWithRealKubeAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping kube-apiserver test in -short mode")
	}
	bin, err := localcluster.KubeAPIServerBinary(t.Context())
	if err != nil {
		t.Fatalf("kube-apiserver binary: %v", err)
	}
	sum := runDemoJSON(t, "--kube-apiserver", bin, "--service-cluster-ip-range", "10.96.0.0/24,fd00:10:96::/112", "-n", "100", "--workers", "2", "--duration", "2s")
	if !strings.Contains(sum.API, "kube-apiserver "+localcluster.KubeAPIServerVersion) {
		t.Errorf("api = %q, want it to name kube-apiserver %s", sum.API, localcluster.KubeAPIServerVersion)
	}
	checkUpgradeWalk(t, sum)
}

func TestDemoPrintsEveryPhaseAndATable(t *testing.T) {
	withoutEtcdBinary(t)
	r := clusterip(t, "demo", "--fake-api", "--cidr", "10.96.0.0/24", "-n", "50", "--workers", "1", "--duration", "300ms")
	if r.code != 0 {
		t.Fatalf("demo: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	for _, want := range []string{
		"client-go's fake clientset",
		"range 10.96.0.0/24: bitmap at /registry/ranges/serviceips",
		"phase 1/3 Legacy: done in",
		"phase 2/3 DualWrite beside Legacy: done in",
		"phase 3/3 IPAddressOnly: done in",
		"PHASE", "ALLOCATED", "CONFLICTS", "UNDOS", "P99",
		"1 Legacy  ", "2 DualWrite beside Legacy  ", "3 IPAddressOnly  ",
		"repair pass before phase 3: ",
		"after phase 3 IPAddressOnly: ", "audit (IPAddressOnly): consistent",
		"duplicates: 0",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("demo output lacks %q:\n%s", want, r.stdout)
		}
	}
	if r.stderr != "" {
		t.Errorf("demo wrote to stderr:\n%s", r.stderr)
	}
}
