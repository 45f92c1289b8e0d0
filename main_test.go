package clusterip

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kube-ipam/clusterip/internal/testenv"
)

// env is one etcd and one kube-apiserver v1.33 (default gates: dual write) for every test of the
// package that needs them. testenv.Shared does not hand out its etcd, and these tests need it for
// the bitmaps, so the package keeps its own.
var env struct {
	once sync.Once
	etcd *testenv.Etcd
	api  *testenv.KubeAPIServer
	err  error
}

// kubeAPIServerRange is the --service-cluster-ip-range of the shared kube-apiserver.
const kubeAPIServerRange = "10.96.0.0/24"

// realCluster returns the shared etcd (with a client closed when t ends) and kube-apiserver,
// starting them on first use. It skips t in -short mode.
func realCluster(t testing.TB) (*testenv.Etcd, *clientv3.Client, *testenv.KubeAPIServer) {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping kube-apiserver test in -short mode")
	}
	env.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		if env.etcd, env.err = testenv.StartEtcd(ctx, testenv.EtcdOptions{UnsafeNoFsync: true}); env.err != nil {
			return
		}
		env.api, env.err = testenv.StartKubeAPIServer(ctx, env.etcd, testenv.KubeAPIServerOptions{ServiceClusterIPRange: kubeAPIServerRange})
	})
	if env.err != nil {
		t.Fatalf("start etcd and kube-apiserver: %v", env.err)
	}
	return env.etcd, env.etcd.TestClient(t), env.api
}

func TestMain(m *testing.M) {
	code := m.Run()
	if env.api != nil {
		if err := env.api.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "close kube-apiserver:", err)
		}
	}
	if env.etcd != nil {
		if err := env.etcd.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "close etcd:", err)
		}
	}
	os.Exit(code)
}
