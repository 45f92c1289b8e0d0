package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/repair"
)

// TestCheckUpgradePreflightNamesTheServersThatStillWriteBitmaps runs "clusterip check" against
// a real stock kube-apiserver v1.37.2 through the end of a dual-write era, on one etcd. At
// --emulated-version=1.34 with DisableAllocatorDualWrite=false it writes the bitmaps, and its
// identity Lease advertises no peer address: the upgrade to 1.38 is blocked, naming the server
// the kubeconfig reaches, and with --apiserver-endpoints naming that endpoint as a counted
// server; the table says so too. Blocked is not a finding: check exits 0 on a consistent cluster.
// Restarted at its own 1.37, its Lease advertises its peer address, where check reads its
// version: ready.
func TestCheckUpgradePreflightNamesTheServersThatStillWriteBitmaps(t *testing.T) {
	t.Parallel()
	const flag = "10.96.0.0/24"
	e := testenv.NewEtcd(t)

	old := testenv.NewKubeAPIServer(t, e, testenv.KubeAPIServerOptions{Release: "v1.37.2", ServiceClusterIPRange: flag,
		FeatureGates: "DisableAllocatorDualWrite=false", ExtraArgs: []string{"--emulated-version=1.34"}})
	waitForDefaultServiceCIDR(t, old.Client)
	waitForIdentityLease(t, old.Client, func(peer string) bool { return peer == "" })
	check := []string{"check", "--kubeconfig", writeKubeconfigWithToken(t, old.Config.Host, old.Config.BearerToken)}

	t.Run("blocked while the server emulates 1.34", func(t *testing.T) {
		tests := []struct {
			name        string
			args        []string
			wantCounted bool
		}{
			{name: "the kubeconfig's server", args: nil, wantCounted: false},
			{name: "its endpoint named", args: []string{"--apiserver-endpoints", old.Config.Host}, wantCounted: true},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				rep := checkJSON(t, exitOK, slices.Concat(check, tt.args, []string{"-o", "json"})...)
				u := rep.Upgrade
				if u == nil {
					t.Fatal("check -o json: no upgrade pre-flight in the report")
				}
				want := "1 kube-apiserver can still write the legacy bitmaps: " + old.Config.Host + " (v1.37.2 emulating 1.34)"
				if u.Target != "1.38" || u.Status != repair.UpgradeBlocked || !strings.Contains(u.Detail, want) || u.Hazard != "" {
					t.Errorf("upgrade = %s %s: %q, hazard %q; want 1.38 blocked: ...%q..., no hazard", u.Target, u.Status, u.Detail, u.Hazard, want)
				}
				i := slices.IndexFunc(u.Servers, func(s repair.UpgradeServer) bool { return s.Endpoint == old.Config.Host })
				if i < 0 {
					t.Fatalf("upgrade servers %+v lack %s", u.Servers, old.Config.Host)
				}
				s := u.Servers[i]
				if !s.CanWriteBitmaps || s.Counted != tt.wantCounted || s.GitVersion != "v1.37.2" || s.Emulated != "1.34" ||
					!strings.Contains(s.Reason, "below 1.35 it can run DualWrite (with --feature-gates=DisableAllocatorDualWrite=false)") {
					t.Errorf("upgrade server %+v, want v1.37.2 emulating 1.34 that can write the bitmaps, counted %t", s, tt.wantCounted)
				}
			})
		}
		r := clusterip(t, check...)
		want := "Upgrade to 1.38: blocked: 1 kube-apiserver can still write the legacy bitmaps: " + old.Config.Host
		if r.code != exitOK || !strings.Contains(r.stdout, want) || !strings.Contains(oneSpaced(r.stdout), old.Config.Host+" (kubeconfig) v1.37.2 1.34 can write") {
			t.Errorf("check: exit %d, want %d and the table to say %q, with the server\nstdout:\n%s\nstderr:\n%s", r.code, exitOK, want, r.stdout, r.stderr)
		}
	})
	if t.Failed() {
		return
	}
	old.Stop()

	// The same host, upgraded: its identity Lease, renewed by the new server, advertises it.
	cur := testenv.NewKubeAPIServer(t, e, testenv.KubeAPIServerOptions{Release: "v1.37.2", ServiceClusterIPRange: flag})
	peer := strings.TrimPrefix(cur.Config.Host, "https://")
	waitForIdentityLease(t, cur.Client, func(p string) bool { return p == peer })

	t.Run("ready once it emulates 1.37", func(t *testing.T) {
		rep := checkJSON(t, exitOK, "check", "--kubeconfig", writeKubeconfigWithToken(t, cur.Config.Host, cur.Config.BearerToken), "-o", "json")
		u := rep.Upgrade
		if u == nil {
			t.Fatal("check -o json: no upgrade pre-flight in the report")
		}
		want := "no kube-apiserver can write the legacy bitmaps: 1 live kube-apiserver by identity Lease, v1.37.2 emulating 1.37 at " + peer
		if u.Status != repair.UpgradeReady || !strings.Contains(u.Detail, want) {
			t.Errorf("upgrade = %s: %q; want ready: ...%q...", u.Status, u.Detail, want)
		}
		if len(u.Servers) != 1 || u.Servers[0].Endpoint != peer || !u.Servers[0].Counted || u.Servers[0].Identity == "" || u.Servers[0].CanWriteBitmaps {
			t.Errorf("upgrade servers %+v, want the one at its peer address %s, counted by its Lease, that cannot write the bitmaps", u.Servers, peer)
		}
	})
}
