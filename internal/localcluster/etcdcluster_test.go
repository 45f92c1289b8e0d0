package localcluster

import (
	"context"
	"testing"
	"time"
)

func TestEtcdClusterSurvivesItsLeaderStopping(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := StartEtcdCluster(ctx, EtcdClusterOptions{UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cl, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := cl.Put(ctx, "k", "before"); err != nil {
		t.Fatalf("Put() = %v", err)
	}
	lead, err := c.WaitLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c.StopMember(lead)
	if _, err := cl.Put(ctx, "k", "during"); err != nil {
		t.Fatalf("Put() with the leader %d stopped = %v", lead, err)
	}
	if err := c.RestartMember(ctx, lead); err != nil {
		t.Fatalf("RestartMember(%d) = %v", lead, err)
	}
	if _, err := c.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
	resp, err := cl.Get(ctx, "k")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "during" {
		t.Fatalf("Get() = %v, %v; want during", resp, err)
	}
	if got := len(c.Endpoints()); got != 3 {
		t.Errorf("len(Endpoints()) = %d, want 3", got)
	}
}
