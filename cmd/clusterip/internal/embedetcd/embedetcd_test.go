package embedetcd

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/kube-ipam/clusterip/internal/localcluster"
)

// The command's etcd runs in the command's process: it needs neither $CLUSTERIP_ETCD nor a build
// in the repository's .cache/, which a user who installs the command with "go install" has not
// got. It stops and restarts on its data as the tests' child process does.
func TestStartEtcdNeedsNoEtcdBinary(t *testing.T) {
	t.Setenv(localcluster.EtcdEnv, filepath.Join(t.TempDir(), "no-etcd-binary"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e, err := StartEtcd(ctx, localcluster.EtcdOptions{UnsafeNoFsync: true})
	if err != nil {
		t.Fatalf("StartEtcd() error = %v", err)
	}
	defer e.Close()
	c, err := e.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Put(ctx, "/k", "v"); err != nil {
		t.Fatalf("Put() error = %v", err)
	}
	e.Stop()
	if e.Running() {
		t.Errorf("Running() after Stop = true, want false")
	}
	if err := e.Restart(ctx); err != nil {
		t.Fatalf("Restart() error = %v", err)
	}
	resp, err := c.Get(ctx, "/k")
	if err != nil {
		t.Fatalf("Get() after Restart error = %v", err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
		t.Errorf("Get(/k) after Restart = %v, want one value %q", resp.Kvs, "v")
	}
}
