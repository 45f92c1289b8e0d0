package localcluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/kube-ipam/clusterip/internal/localcluster"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

func TestEtcdPutGet(t *testing.T) {
	e := testenv.NewEtcd(t)
	c := e.TestClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Put(ctx, "/k", "v"); err != nil {
		t.Fatalf("Put() error = %v", err)
	}
	resp, err := c.Get(ctx, "/k")
	if err != nil {
		t.Fatalf("Get() error = %v", err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
		t.Errorf("Get(/k) = %v, want one value %q", resp.Kvs, "v")
	}
}

func TestEtcdStopFailsClientsAndRestartKeepsData(t *testing.T) {
	e := testenv.NewEtcd(t)
	c := e.TestClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.Put(ctx, "/k", "v"); err != nil {
		t.Fatalf("Put() error = %v", err)
	}
	endpoints := e.Endpoints()

	e.Stop()
	if e.Running() {
		t.Errorf("Running() after Stop = true, want false")
	}
	short, cancelShort := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err := c.Get(short, "/k")
	cancelShort()
	if err == nil {
		t.Fatalf("Get() on a stopped etcd succeeded, want an error")
	}

	start := time.Now()
	if err := e.Restart(ctx); err != nil {
		t.Fatalf("Restart() error = %v", err)
	}
	t.Logf("etcd restarted in %v", time.Since(start))
	if got := e.Endpoints(); got[0] != endpoints[0] {
		t.Errorf("Endpoints() after Restart = %v, want %v", got, endpoints)
	}
	// The old client reconnects on its own.
	resp, err := c.Get(ctx, "/k")
	if err != nil {
		t.Fatalf("Get() after Restart error = %v", err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
		t.Errorf("Get(/k) after Restart = %v, want one value %q", resp.Kvs, "v")
	}
	if err := e.Restart(ctx); err == nil {
		t.Errorf("Restart() of a running etcd succeeded, want an error")
	}
}

func TestEtcdParallelServersGetDifferentPorts(t *testing.T) {
	const n = 2
	servers := make(chan *localcluster.Etcd, n)
	for range n {
		go func() {
			e, err := localcluster.StartEtcd(context.Background(), localcluster.EtcdOptions{UnsafeNoFsync: true})
			if err != nil {
				t.Errorf("localcluster.StartEtcd() error = %v", err)
			}
			servers <- e
		}()
	}
	seen := map[string]bool{}
	for range n {
		e := <-servers
		if e == nil {
			continue
		}
		t.Cleanup(func() { e.Close() })
		ep := e.Endpoints()[0]
		if seen[ep] {
			t.Errorf("two servers share endpoint %s", ep)
		}
		seen[ep] = true
		c := (&testenv.Etcd{Etcd: e}).TestClient(t)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if _, err := c.Put(ctx, "/k", ep); err != nil {
			t.Errorf("Put() on %s error = %v", ep, err)
		}
		cancel()
	}
}

func TestEtcdStartTime(t *testing.T) {
	start := time.Now()
	e, err := localcluster.StartEtcd(context.Background(), localcluster.EtcdOptions{UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("etcd ready in %v", time.Since(start))
	if err := e.Close(); err != nil {
		t.Errorf("Close() error = %v", err)
	}
}
