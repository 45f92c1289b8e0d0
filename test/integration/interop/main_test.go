// Package interop tests clusterip's allocators beside a real kube-apiserver v1.33 on one etcd:
// our DualWrite and Legacy allocators allocating from the range it allocates from in its own
// dual-write mode, with Service churn, ambiguous answers to IPAddress creates and a missing bitmap
// key; our DualWrite allocator beside a kube-apiserver in Legacy mode
// (MultiCIDRServiceAllocator=false); and the metrics of allocators beside it. The benchmarks
// measure DualWrite beside kube-apiserver's own Service churn.
//
// Most tests share one etcd and kube-apiserver (shared), started on first use, and keep apart by
// the Service names and etcd prefixes they use; the ones that change the cluster itself start
// their own.
package interop

import (
	"os"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kube-ipam/clusterip/internal/testenv"
)

// kubeAPIServerRange is the --service-cluster-ip-range of the shared kube-apiserver.
const kubeAPIServerRange = "10.96.0.0/24"

// shared is one etcd and one kube-apiserver v1.33 (default gates: dual write) for every test of
// the package that needs them.
var shared = testenv.Shared{Options: testenv.KubeAPIServerOptions{ServiceClusterIPRange: kubeAPIServerRange}}

// realCluster returns the shared etcd (with a client closed when t ends) and kube-apiserver,
// starting them on first use. It skips t in -short mode.
func realCluster(t testing.TB) (*testenv.Etcd, *clientv3.Client, *testenv.KubeAPIServer) {
	t.Helper()
	api := shared.KubeAPIServer(t)
	etcd := shared.Etcd(t)
	return etcd, etcd.TestClient(t), api
}

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &shared)) }
