package servicecidr

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/kube-ipam/clusterip/internal/testenv"
)

// shared is one etcd and kube-apiserver for every test of the package that needs them: starting
// them takes seconds, and each test keeps to its own labelled ServiceCIDRs (see fixture).
var shared struct {
	once sync.Once
	etcd *testenv.Etcd
	api  *testenv.KubeAPIServer
	err  error
}

// sharedKubeAPIServer returns a client of the shared kube-apiserver, starting it on first use. It
// skips t in -short mode.
func sharedKubeAPIServer(t testing.TB) kubernetes.Interface {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping kube-apiserver test in -short mode")
	}
	shared.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		start := time.Now()
		shared.etcd, shared.err = testenv.StartEtcd(ctx, testenv.EtcdOptions{UnsafeNoFsync: true})
		if shared.err != nil {
			return
		}
		// The apiserver's own default ServiceCIDR is 10.96.0.0/24; the tests stay out of it.
		shared.api, shared.err = testenv.StartKubeAPIServer(ctx, shared.etcd, testenv.KubeAPIServerOptions{})
		if shared.err == nil {
			fmt.Fprintf(os.Stderr, "servicecidr: kube-apiserver %s ready in %v\n", testenv.KubeAPIServerVersion, time.Since(start).Round(time.Millisecond))
		}
	})
	if shared.err != nil {
		t.Fatalf("start etcd and kube-apiserver: %v", shared.err)
	}
	return shared.api.Client
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.api != nil {
		if err := shared.api.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "close kube-apiserver:", err)
		}
	}
	if shared.etcd != nil {
		if err := shared.etcd.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "close etcd:", err)
		}
	}
	os.Exit(code)
}
