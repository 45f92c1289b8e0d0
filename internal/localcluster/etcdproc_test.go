package localcluster

import (
	"context"
	"testing"
	"time"
)

// A killed etcd process, as by a crash or the kernel's OOM killer, loses nothing that was
// committed: Restart starts a new one on the same data directory.
func TestEtcdRestartsAfterSIGKILL(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e, err := StartEtcd(ctx, EtcdOptions{})
	if err != nil {
		t.Fatal(err)
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
	e.mu.Lock()
	p := e.proc
	e.mu.Unlock()
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-p.exited
	if e.Running() {
		t.Errorf("Running() after SIGKILL = true, want false")
	}
	if err := e.Restart(ctx); err != nil {
		t.Fatalf("Restart() after SIGKILL error = %v", err)
	}
	resp, err := c.Get(ctx, "/k")
	if err != nil {
		t.Fatalf("Get() after Restart error = %v", err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
		t.Errorf("Get(/k) after Restart = %v, want one value %q", resp.Kvs, "v")
	}
}

func TestEtcdBinaryFromEnv(t *testing.T) {
	t.Setenv(EtcdEnv, t.TempDir()+"/missing")
	if got, err := EtcdBinary(context.Background()); err == nil {
		t.Errorf("EtcdBinary() with a missing $%s = %q, want an error", EtcdEnv, got)
	}
}
