package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/ipaddress"
	"github.com/kube-ipam/clusterip/repair"
)

// TestCheckAuditsAndRepairsARealCluster runs "clusterip check" and "clusterip repair" against a
// real kube-apiserver v1.33 (DualWrite, its default) and the etcd it stores in, reached with
// kube-apiserver's own etcd flags: a consistent cluster exits 0; one seeded with a leaked
// IPAddress, a stale bit and a Service whose IPAddress was deleted exits 1 and reports exactly
// those three; "repair --dry-run" exits 1 with the plan and changes nothing; "repair
// --leak-grace 0" repairs them and a second check exits 0. The spellings of the previous
// release, "check --repair" and --etcd-endpoints, still repair, with a warning each.
//
// kube-apiserver's own IPAddress repair would undo two of the seeds, but not before the seeded
// checks run: it deletes a leaked IPAddress 60 s after its creation, and recreates a Service's
// missing IPAddress when its informers resync, 3 minutes after it started (nothing updates the
// Service meanwhile). It never repairs the bitmap. So the seeds are made once the server is up
// and the seeded checks follow at once; what the server repairs during or after repair only
// helps the last check.
func TestCheckAuditsAndRepairsARealCluster(t *testing.T) {
	t.Parallel()
	e := testenv.NewEtcd(t)
	api := testenv.NewKubeAPIServer(t, e, testenv.KubeAPIServerOptions{ServiceClusterIPRange: "10.96.0.0/24"})
	ctx := t.Context()
	kubeconfig := writeKubeconfigWithToken(t, api.Config.Host, api.Config.BearerToken)
	etcdFlags := []string{"check", "--kubeconfig", kubeconfig, "--etcd-servers", strings.Join(e.Endpoints(), ",")}
	repairFlags := slices.Concat([]string{"repair"}, etcdFlags[1:])
	bitmapKey := etcdstore.ServiceIPsKey("")

	// The cluster kube-apiserver sets up: the kubernetes Service (allocated after its bit and its
	// IPAddress), and the default ServiceCIDR, ready.
	waitForDefaultServiceCIDR(t, api.Client)
	for name, ip := range map[string]string{"s1": "10.96.0.10", "s2": "10.96.0.11"} {
		if _, err := api.Client.CoreV1().Services("default").Create(ctx, testenv.ClusterIPService(name, ip), metav1.CreateOptions{}); err != nil {
			t.Fatalf("create Service %s: %v", name, err)
		}
	}

	t.Run("consistent", func(t *testing.T) {
		rep := checkJSON(t, exitOK, slices.Concat(etcdFlags, []string{"-o", "json"})...)
		if rep.Mode != featuregate.DualWrite.String() || rep.Counts[repair.CountServices] != 3 {
			t.Errorf("check of the new cluster: mode %s, %d Services; want DualWrite (the default of v1.33) and 3 (kubernetes, s1, s2)",
				rep.Mode, rep.Counts[repair.CountServices])
		}
		r := clusterip(t, slices.Concat(etcdFlags, []string{"-o", "yaml"})...)
		var fromYAML repair.Report
		if err := yaml.UnmarshalStrict([]byte(r.stdout), &fromYAML); r.code != exitOK || err != nil {
			t.Fatalf("check -o yaml: exit %d, %v decoding\n%s", r.code, err, r.stdout)
		}
		if diff := cmp.Diff(rep, fromYAML); diff != "" {
			t.Errorf("check -o yaml and -o json print different reports (-json +yaml):\n%s", diff)
		}
	})

	// The seeds: a leaked IPAddress, a stale bit, and a Service whose IPAddress is gone.
	if _, err := api.Client.NetworkingV1().IPAddresses().Create(ctx, leakedIPAddress("10.96.0.200"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("seed a leaked IPAddress: %v", err)
	}
	setBit(t, etcdstore.New(e.TestClient(t), bitmapKey), "10.96.0.201")
	if err := api.Client.NetworkingV1().IPAddresses().Delete(ctx, "10.96.0.10", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete the IPAddress of Service s1: %v", err)
	}
	seeded := []repair.Finding{
		{IP: "10.96.0.10", Class: repair.Missing, Service: "default/s1"},
		{IP: "10.96.0.200", Class: repair.Leaked},
		{IP: "10.96.0.201", Class: repair.BitmapOnly},
	}

	t.Run("inconsistent", func(t *testing.T) {
		rep := checkJSON(t, exitProblem, slices.Concat(etcdFlags, []string{"-o", "json"})...)
		if diff := cmp.Diff(seeded, rep.Findings, cmpopts.IgnoreFields(repair.Finding{}, "Detail")); diff != "" {
			t.Errorf("check -o json findings (-want +got):\n%s", diff)
		}
	})
	t.Run("table with the repair plan", func(t *testing.T) {
		r := clusterip(t, slices.Concat(etcdFlags, []string{"-o", "table"})...)
		if r.code != exitProblem {
			t.Fatalf("check: exit %d, want %d; stderr %q", r.code, exitProblem, r.stderr)
		}
		want := []string{"Mode DualWrite: inconsistent: 3 findings", "Repair plan (what clusterip repair does, in DualWrite mode; the hold-off is --leak-grace 1m0s)"}
		for _, f := range seeded {
			want = append(want, f.IP+" "+string(f.Class)+" "+f.Class.Plan(featuregate.DualWrite))
		}
		got := oneSpaced(r.stdout)
		for _, w := range want {
			if !strings.Contains(got, w) {
				t.Errorf("check -o table lacks %q:\n%s", w, r.stdout)
			}
		}
	})
	t.Run("no etcd: the IPAddress objects only", func(t *testing.T) {
		rep := checkJSON(t, exitProblem, "check", "--kubeconfig", kubeconfig, "--mode", "dualwrite", "-o", "json")
		want := []repair.Finding{seeded[0], seeded[1]} // the stale bit is not seen
		if diff := cmp.Diff(want, rep.Findings, cmpopts.IgnoreFields(repair.Finding{}, "Detail")); diff != "" {
			t.Errorf("check -o json without --etcd-servers: findings (-want +got):\n%s", diff)
		}
		if rep.Mode != featuregate.IPAddressOnly.String() {
			t.Errorf("check --mode dualwrite without --etcd-servers: mode %s, want IPAddressOnly", rep.Mode)
		}
	})

	t.Run("repair --dry-run prints the plan and changes nothing", func(t *testing.T) {
		beforeBits, beforeObjects := modRevision(t, e, bitmapKey), ipAddressVersions(t, api.Client)
		r := clusterip(t, slices.Concat(repairFlags, []string{"--dry-run", "--leak-grace", "0"})...)
		if r.code != exitProblem {
			t.Fatalf("repair --dry-run: exit %d, want %d (something to repair)\nstdout:\n%s\nstderr:\n%s", r.code, exitProblem, r.stdout, r.stderr)
		}
		want := []string{"Mode DualWrite: inconsistent: 3 findings", "Repair plan (what clusterip repair does, in DualWrite mode; no hold-off (--leak-grace 0))"}
		for _, f := range seeded {
			want = append(want, f.IP+" "+string(f.Class)+" "+f.Class.Plan(featuregate.DualWrite))
		}
		for _, w := range want {
			if !strings.Contains(oneSpaced(r.stdout), w) {
				t.Errorf("repair --dry-run lacks %q:\n%s", w, r.stdout)
			}
		}
		wantStderr := "clusterip: dry run: nothing was changed; without --dry-run, repair would act on 3 findings, as the repair plan of -o table says\n"
		if r.stderr != wantStderr {
			t.Errorf("repair --dry-run: stderr %q, want %q (and no progress line: no pass ran)", r.stderr, wantStderr)
		}
		if after := modRevision(t, e, bitmapKey); after != beforeBits {
			t.Errorf("repair --dry-run wrote the bitmap at %s (mod revision %d, then %d)", bitmapKey, beforeBits, after)
		}
		if diff := cmp.Diff(beforeObjects, ipAddressVersions(t, api.Client)); diff != "" {
			t.Errorf("repair --dry-run changed the IPAddress objects (name: resourceVersion, -before +after):\n%s", diff)
		}
		rep := checkJSON(t, exitProblem, slices.Concat(etcdFlags, []string{"-o", "json"})...)
		if diff := cmp.Diff(seeded, rep.Findings, cmpopts.IgnoreFields(repair.Finding{}, "Detail")); diff != "" {
			t.Errorf("check after repair --dry-run: findings (-want +got):\n%s", diff)
		}
	})

	t.Run("repair then check again", func(t *testing.T) {
		r := clusterip(t, slices.Concat(repairFlags, []string{"--leak-grace", "0", "-o", "json"})...)
		if r.code != exitOK {
			t.Fatalf("repair: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, exitOK, r.stdout, r.stderr)
		}
		if !strings.Contains(r.stderr, "clusterip: repair pass 1:") {
			t.Errorf("repair printed no progress line on stderr: %q", r.stderr)
		}
		if strings.Contains(r.stderr, "warning") {
			t.Errorf("repair with this release's spellings warned: %q", r.stderr)
		}
		checkJSON(t, exitOK, slices.Concat(etcdFlags, []string{"-o", "json"})...)
		if ipa, err := api.Client.NetworkingV1().IPAddresses().Get(ctx, "10.96.0.10", metav1.GetOptions{}); err != nil {
			t.Errorf("IPAddress of Service s1 after repair: %v", err)
		} else if p := ipa.Spec.ParentRef; p == nil || p.Namespace != "default" || p.Name != "s1" {
			t.Errorf("IPAddress 10.96.0.10 after repair has parent %+v, want Service default/s1", p)
		}
	})

	t.Run("repair waits out the hold-off", func(t *testing.T) {
		// A stale bit is held off from the pass that first sees it until --leak-grace has passed.
		setBit(t, etcdstore.New(e.TestClient(t), bitmapKey), "10.96.0.202")
		r := clusterip(t, slices.Concat(repairFlags, []string{"--leak-grace", "2s"})...)
		if r.code != exitOK {
			t.Fatalf("repair --leak-grace 2s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, exitOK, r.stdout, r.stderr)
		}
		for _, want := range []string{
			"clusterip: repair pass 1: 1 finding, 1 leak held off (--leak-grace 2s); next pass in 1s",
			"none held off; auditing again",
		} {
			if !strings.Contains(r.stderr, want) {
				t.Errorf("repair --leak-grace 2s: stderr lacks %q:\n%s", want, r.stderr)
			}
		}
		if !strings.Contains(r.stdout, "Mode DualWrite: consistent") {
			t.Errorf("repair printed %q, want the table of a consistent audit", r.stdout)
		}
	})

	t.Run("the previous release's spellings still repair, with a warning each", func(t *testing.T) {
		setBit(t, etcdstore.New(e.TestClient(t), bitmapKey), "10.96.0.203")
		r := clusterip(t, "check", "--repair", "--kubeconfig", kubeconfig, "--etcd-endpoints", strings.Join(e.Endpoints(), ","), "--leak-grace", "0", "-o", "json")
		if r.code != exitOK {
			t.Fatalf("check --repair --etcd-endpoints: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, exitOK, r.stdout, r.stderr)
		}
		for _, want := range []string{
			"clusterip: warning: --etcd-endpoints is deprecated and will be removed in the next release; use --etcd-servers\n",
			`clusterip: warning: "check --repair" is deprecated and will be removed in the next release; use "clusterip repair", which takes the same flags` + "\n",
			"clusterip: repair pass 1:",
		} {
			if !strings.Contains(r.stderr, want) {
				t.Errorf("check --repair --etcd-endpoints: stderr lacks %q:\n%s", want, r.stderr)
			}
		}
		checkJSON(t, exitOK, slices.Concat(etcdFlags, []string{"-o", "json"})...)
	})

	t.Run("could not run", func(t *testing.T) {
		tests := []struct {
			name string
			args []string
			want string
		}{
			{"wrong prefix", []string{"check", "--kubeconfig", kubeconfig, "--etcd-servers", e.Endpoints()[0], "--etcd-prefix", "/elsewhere"},
				"has no RangeAllocation at /elsewhere/ranges/serviceips: is --etcd-prefix /elsewhere kube-apiserver's?"},
			{"Legacy without etcd", []string{"check", "--kubeconfig", kubeconfig, "--mode", "Legacy"}, "give --etcd-servers"},
			{"--mode in another case", []string{"check", "--kubeconfig", kubeconfig, "--mode", "lEGACY"},
				"in Legacy mode (kube-apiserver v1.33.13, --mode Legacy) the allocations are only in the bitmaps: give --etcd-servers"},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) { checkCouldNotRun(t, tt.args, tt.want) })
		}
	})
}

// TestCheckSaysWhatTheAPIServerRefused runs check against a stand-in API server that answers
// /version and refuses everything else, as kube-apiserver does for a user RBAC gives no rights
// (403) or whose credentials it does not accept (401). The test kube-apiserver authorizes
// everything (AlwaysAllow), so it cannot refuse.
func TestCheckSaysWhatTheAPIServerRefused(t *testing.T) {
	tests := []struct {
		name   string
		code   int
		reason metav1.StatusReason
		want   string
	}{
		{"missing RBAC", http.StatusForbidden, metav1.StatusReasonForbidden,
			`missing RBAC permission at API server https://127.0.0.1:`},
		{"rejected credentials", http.StatusUnauthorized, metav1.StatusReasonUnauthorized,
			"rejects the kubeconfig's credentials"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				if r.URL.Path == "/version" && tt.code == http.StatusForbidden {
					fmt.Fprint(w, `{"major":"1","minor":"33","gitVersion":"v1.33.13"}`)
					return
				}
				w.WriteHeader(tt.code)
				status := metav1.Status{
					TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
					Status:   metav1.StatusFailure, Reason: tt.reason, Code: int32(tt.code),
					Message: fmt.Sprintf("%s %s refused: %s", r.Method, r.URL.Path, tt.reason),
				}
				_ = json.NewEncoder(w).Encode(status)
			}))
			t.Cleanup(srv.Close)
			checkCouldNotRun(t, []string{"check", "--kubeconfig", writeKubeconfig(t, srv.URL)}, tt.want)
		})
	}
}

func TestCheckWithoutAnyKubeconfigExitsTwoWithOneLine(t *testing.T) {
	t.Setenv("HOME", t.TempDir()) // no ~/.kube/config
	t.Setenv("KUBECONFIG", "")
	checkCouldNotRun(t, []string{"check"}, "kubeconfig: none found")
}

// checkJSON runs the command with args, fails t unless it exits with code, and returns the
// report it printed.
func checkJSON(t *testing.T, code int, args ...string) repair.Report {
	t.Helper()
	r := clusterip(t, args...)
	if r.code != code {
		t.Fatalf("clusterip %q: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", args, r.code, code, r.stdout, r.stderr)
	}
	var rep repair.Report
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("clusterip %q printed %q, not a report: %v", args, r.stdout, err)
	}
	return rep
}

// waitForDefaultServiceCIDR waits for what kube-apiserver sets up at start: the kubernetes
// Service and the ServiceCIDR "kubernetes", which its controller has marked ready.
func waitForDefaultServiceCIDR(t *testing.T, client kubernetes.Interface) {
	t.Helper()
	testenv.WaitForKubernetesService(t, client)
	poll(t, "a ready ServiceCIDR kubernetes", func() bool {
		sc, err := client.NetworkingV1().ServiceCIDRs().Get(t.Context(), "kubernetes", metav1.GetOptions{})
		return err == nil && readyStatus(sc) == metav1.ConditionTrue
	})
}

// leakedIPAddress returns the IPAddress object kube-apiserver would write for ip and the Service
// default/gone, which does not exist: a leak for check to find.
func leakedIPAddress(ip string) *networkingv1.IPAddress {
	return ipaddress.ObjectFor(netip.MustParseAddr(ip), allocator.Owner{Resource: "services", Namespace: "default", Name: "gone"}, ipaddress.DefaultManagedBy)
}

// writeKubeconfigWithToken writes a kubeconfig whose one context reaches server with token.
func writeKubeconfigWithToken(t *testing.T, server, token string) string {
	t.Helper()
	return writeKubeconfigUser(t, server, fmt.Sprintf("user: {token: %q}", token))
}

// setBit sets ip in the bitmap at store with a compare-and-swap, behind kube-apiserver's back.
func setBit(t *testing.T, store *etcdstore.Store, ip string) {
	t.Helper()
	snap, rev, err := store.Get(t.Context())
	if err != nil || rev == 0 {
		t.Fatalf("read the bitmap at %s: revision %d, %v", store.Key(), rev, err)
	}
	b, err := bitmap.New(netip.MustParsePrefix(snap.Range))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Restore(snap); err != nil {
		t.Fatal(err)
	}
	if err := b.Allocate(t.Context(), netip.MustParseAddr(ip), allocator.Owner{}); err != nil {
		t.Fatalf("set bit %s: %v", ip, err)
	}
	if _, err := store.Update(t.Context(), rev, b.Snapshot()); err != nil {
		t.Fatalf("write the bitmap with bit %s: %v", ip, err)
	}
}

// ipAddressVersions returns the resourceVersion of every IPAddress object, by name: what changes
// if anything writes one.
func ipAddressVersions(t *testing.T, client kubernetes.Interface) map[string]string {
	t.Helper()
	list, err := client.NetworkingV1().IPAddresses().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list the IPAddress objects: %v", err)
	}
	out := map[string]string{}
	for _, ipa := range list.Items {
		out[ipa.Name] = ipa.ResourceVersion
	}
	return out
}

// oneSpaced folds every run of blanks in s into one space, so that table rows compare as words.
func oneSpaced(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.Join(strings.Fields(l), " ")
	}
	return strings.Join(lines, "\n")
}
