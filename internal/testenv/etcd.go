package testenv

import (
	"context"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kube-ipam/clusterip/internal/localcluster"
)

// Etcd is a [localcluster.Etcd] started for a test, with test helpers. Its methods are those of
// [localcluster.Etcd] plus [Etcd.TestClient]; it is safe for concurrent use.
type Etcd struct {
	*localcluster.Etcd
}

// NewEtcd starts an etcd server (a child process) with UnsafeNoFsync for the test t and closes
// it when t finishes. It fails t if etcd does not start within two minutes, not counting a first
// build of its binary ([localcluster.EtcdBinary]), which only the test's -timeout bounds.
func NewEtcd(t testing.TB) *Etcd {
	t.Helper()
	if _, err := localcluster.EtcdBinary(context.Background()); err != nil {
		t.Fatalf("etcd server binary: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	e, err := localcluster.StartEtcd(ctx, localcluster.EtcdOptions{UnsafeNoFsync: true})
	if err != nil {
		t.Fatalf("start etcd: %v", err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("close etcd: %v", err)
		}
	})
	return &Etcd{e}
}

// TestClient returns a new client of e that is closed when t finishes. It fails t if the client
// cannot be created.
func (e *Etcd) TestClient(t testing.TB) *clientv3.Client {
	t.Helper()
	c, err := e.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
