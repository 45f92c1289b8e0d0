// Package examples runs the repository's example programs against real servers, as a user who
// follows the README would.
package examples

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kube-ipam/clusterip/internal/testenv"
)

// TestIPAddressOnlyExampleRunsBesideKubeAPIServer runs examples/ipaddressonly, the registry of the
// README's example, with go run, against a stock kube-apiserver v1.37.2 (IPAddressOnly, its
// default): it must give a Service a ClusterIP of the default ServiceCIDR, release it, and print
// a consistent audit.
func TestIPAddressOnlyExampleRunsBesideKubeAPIServer(t *testing.T) {
	api := testenv.NewKubeAPIServer(t, testenv.NewEtcd(t), testenv.KubeAPIServerOptions{
		Release: "v1.37.2", ServiceClusterIPRange: "10.96.0.0/24",
	})
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	config := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: %q, insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: %q}
contexts:
- name: ctx
  context: {cluster: c, user: u}
current-context: ctx
`, api.Config.Host, api.Config.BearerToken)
	if err := os.WriteFile(kubeconfig, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), "go", "run", "github.com/kube-ipam/clusterip/examples/ipaddressonly",
		"-kubeconfig", kubeconfig, "-service-cluster-ip-range", "10.96.0.0/24")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go run examples/ipaddressonly: %v\n%s", err, out)
	}
	for _, want := range []string{"Service default/clusterip-example: clusterIPs [10.96.0.", "ipFamilies [IPv4]", "Mode IPAddressOnly: consistent"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the example's output does not say %q:\n%s", want, out)
		}
	}
}
