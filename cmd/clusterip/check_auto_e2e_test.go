package main

import (
	"strings"
	"testing"

	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

// TestCheckModeAutoFollowsTheServersEmulatedVersion runs "clusterip check --mode auto" against
// real stock kube-apiservers: a v1.35.4 binary runs dual write at --emulated-version=1.33 and
// IPAddressOnly at its own version, and --mode auto must judge by the version the server emulates
// (its /version's emulationMajor and emulationMinor), not by its binary. With --etcd-servers the
// report names the mode it audited.
func TestCheckModeAutoFollowsTheServersEmulatedVersion(t *testing.T) {
	t.Parallel()
	tests := []struct {
		release string
		args    []string
		want    featuregate.Mode
	}{
		{release: "v1.35.4", args: []string{"--emulated-version=1.33"}, want: featuregate.DualWrite},
		{release: "v1.35.4", want: featuregate.IPAddressOnly},
		{release: "v1.37.2", args: []string{"--emulated-version=1.34"}, want: featuregate.IPAddressOnly},
	}
	for _, tt := range tests {
		t.Run(tt.release+"/"+strings.Join(tt.args, ","), func(t *testing.T) {
			e := testenv.NewEtcd(t)
			api := testenv.NewKubeAPIServer(t, e, testenv.KubeAPIServerOptions{Release: tt.release, ServiceClusterIPRange: "10.96.0.0/24", ExtraArgs: tt.args})
			waitForDefaultServiceCIDR(t, api.Client)
			kubeconfig := writeKubeconfigWithToken(t, api.Config.Host, api.Config.BearerToken)
			rep := checkJSON(t, exitOK, "check", "--kubeconfig", kubeconfig, "--etcd-servers", strings.Join(e.Endpoints(), ","), "--mode", "auto", "-o", "json")
			if rep.Mode != tt.want.String() {
				t.Errorf("check --mode auto against %s %v audited as %s, want %s", tt.release, tt.args, rep.Mode, tt.want)
			}
		})
	}
}
