package localcluster

import (
	"context"
	"net"
	"slices"
	"strconv"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// startTestCluster starts a three-member cluster with UnsafeNoFsync and a client of it, both
// closed when t finishes.
func startTestCluster(ctx context.Context, t *testing.T) (*EtcdCluster, *clientv3.Client) {
	t.Helper()
	c, err := StartEtcdCluster(ctx, EtcdClusterOptions{UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	cl, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return c, cl
}

func TestEtcdClusterSurvivesItsLeaderStopping(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, cl := startTestCluster(ctx, t)
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

// occupy listens on 127.0.0.1:port until the test ends, as another process that took the port
// would.
func occupy(t *testing.T, port int) {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatalf("occupy port %d: %v", port, err)
	}
	t.Cleanup(func() { l.Close() })
}

// TestEtcdClusterStartsWhenAPickedPortIsTaken takes a client port and a peer port between the
// pick and the start, as another process may: StartEtcdCluster picks other ports and starts.
func TestEtcdClusterStartsWhenAPickedPortIsTaken(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var taken []int
	opts := EtcdClusterOptions{UnsafeNoFsync: true, pickPorts: func(n int) ([]int, error) {
		ports, err := freePorts(n)
		if err == nil && taken == nil {
			taken = []int{ports[0], ports[len(ports)-1]} // member 0's client port, the last member's peer port
			for _, p := range taken {
				occupy(t, p)
			}
		}
		return ports, err
	}}
	c, err := StartEtcdCluster(ctx, opts)
	if err != nil {
		t.Fatalf("StartEtcdCluster() with ports %v taken after the pick: %v", taken, err)
	}
	defer c.Close()
	for i, m := range c.members {
		if slices.Contains(taken, m.clientPort) || slices.Contains(taken, m.peerPort) {
			t.Errorf("member %d has ports %d and %d; %v were taken", i, m.clientPort, m.peerPort, taken)
		}
	}
	cl, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := cl.Put(ctx, "k", "v"); err != nil {
		t.Fatalf("Put() = %v", err)
	}
}

// TestEtcdClusterRestartsAMemberWhosePortsWereTaken takes the ports of a stopped member before
// it restarts: RestartMember moves it to new ports, updating its peer URL in the cluster's
// membership, and the member then takes part in the cluster: with another member stopped, the
// cluster still has a quorum, and the restarted member serves what was written.
func TestEtcdClusterRestartsAMemberWhosePortsWereTaken(t *testing.T) {
	tests := []struct {
		name         string
		client, peer bool
	}{
		{"client port", true, false},
		{"peer port", false, true},
		{"both", true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			c, cl := startTestCluster(ctx, t)
			if _, err := cl.Put(ctx, "k", "before"); err != nil {
				t.Fatalf("Put() = %v", err)
			}
			const moved = 1
			old := c.members[moved]
			c.StopMember(moved)
			if tt.client {
				occupy(t, old.clientPort)
			}
			if tt.peer {
				occupy(t, old.peerPort)
			}
			if _, err := cl.Put(ctx, "k", "during"); err != nil {
				t.Fatalf("Put() with member %d stopped = %v", moved, err)
			}
			if err := c.RestartMember(ctx, moved); err != nil {
				t.Fatalf("RestartMember(%d) with its ports taken = %v", moved, err)
			}
			now := c.members[moved]
			if tt.client == (now.clientPort == old.clientPort) || tt.peer == (now.peerPort == old.peerPort) {
				t.Errorf("member %d moved from ports %d/%d to %d/%d; want only the taken ones moved", moved, old.clientPort, old.peerPort, now.clientPort, now.peerPort)
			}
			members, err := cl.MemberList(ctx)
			if err != nil {
				t.Fatalf("MemberList() = %v", err)
			}
			u := urlOf(now.peerPort)
			var found bool
			for _, m := range members.Members {
				if m.Name == now.name {
					found = true
					if !slices.Equal(m.PeerURLs, []string{u.String()}) {
						t.Errorf("member %s peer URLs in the membership = %v, want [%s]", m.Name, m.PeerURLs, u.String())
					}
				}
			}
			if !found {
				t.Errorf("member %s not in the membership %v", now.name, members.Members)
			}

			// The restarted member must take part: stop another, and the two left still have a
			// quorum.
			c.StopMember(2)
			mc, err := clientv3.New(clientv3.Config{Endpoints: []string{c.MemberEndpoint(moved)}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
			if err != nil {
				t.Fatal(err)
			}
			defer mc.Close()
			if _, err := mc.Put(ctx, "k", "after"); err != nil {
				t.Fatalf("Put() through the restarted member with member 2 stopped = %v", err)
			}
			resp, err := mc.Get(ctx, "k")
			if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "after" {
				t.Fatalf("Get() through the restarted member = %v, %v; want after", resp, err)
			}
		})
	}
}
