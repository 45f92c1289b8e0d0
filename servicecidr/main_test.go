package servicecidr

import (
	"os"
	"testing"

	"k8s.io/client-go/kubernetes"

	"github.com/kube-ipam/clusterip/internal/testenv"
)

// shared is one etcd and kube-apiserver for every test of the package that needs them; each test
// keeps to its own labelled ServiceCIDRs (see fixture), away from the apiserver's default
// 10.96.0.0/24.
var shared testenv.Shared

// sharedKubeAPIServer returns a client of the shared kube-apiserver, starting it on first use. It
// skips t in -short mode.
func sharedKubeAPIServer(t testing.TB) kubernetes.Interface {
	t.Helper()
	return shared.KubeAPIServer(t).Client
}

// TestMain builds kube-apiserver, if this clone has none yet, before -timeout starts, and closes
// shared after the tests; see testenv.Main.
func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &shared)) }
