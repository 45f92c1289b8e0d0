package localcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// EtcdClusterOptions configures [StartEtcdCluster]. The zero value starts three durable members
// in a new temporary directory.
type EtcdClusterOptions struct {
	// Members is how many members the cluster has. Defaults to 3, as production runs etcd.
	Members int
	// UnsafeNoFsync disables fsync; see [EtcdOptions].
	UnsafeNoFsync bool
	// ReadyTimeout bounds how long [StartEtcdCluster] and [EtcdCluster.RestartMember] wait for
	// the members to serve clients. Defaults to 30 seconds.
	ReadyTimeout time.Duration

	// pickPorts picks n free ports on 127.0.0.1; nil means freePorts. Tests set it to take a
	// picked port before a member binds it, as another process may.
	pickPorts func(n int) ([]int, error)
}

// freePorts returns n free ports as opts.pickPorts picks them.
func (opts *EtcdClusterOptions) freePorts(n int) ([]int, error) {
	if opts.pickPorts != nil {
		return opts.pickPorts(n)
	}
	return freePorts(n)
}

// EtcdCluster is an etcd cluster of several members, each a child process running the binary of
// [EtcdBinary] and listening on 127.0.0.1, each with its own ports and data directory, which it
// keeps across [EtcdCluster.StopMember] and [EtcdCluster.RestartMember], so that fault-injection
// tests can take a member (the leader, say) away and bring it back under running clients.
//
// The zero EtcdCluster is not usable; use [StartEtcdCluster]. Its methods are safe for
// concurrent use.
type EtcdCluster struct {
	opts    EtcdClusterOptions
	dir     string
	members []clusterMember // fixed after StartEtcdCluster

	mu      sync.Mutex         // guards servers and ids
	servers []*etcdProcess     // by member; nil while stopped
	ids     []uint64           // by member: its etcd member ID, once it has answered
	clients []*clientv3.Client // by member: a client of that member alone, for Status
}

type clusterMember struct {
	name                 string
	clientPort, peerPort int
}

// Timing of the cluster's members: a leader is elected again within about a second after the
// leader stops, even on a loaded machine, without elections while nothing fails.
const (
	clusterTickMs     = 25
	clusterElectionMs = 500
)

// StartEtcdCluster starts the members of a new cluster on free 127.0.0.1 ports and waits until
// every one serves clients. It builds the binary of [EtcdBinary] first if it is missing. The
// caller must [EtcdCluster.Close] it.
func StartEtcdCluster(ctx context.Context, opts EtcdClusterOptions) (*EtcdCluster, error) {
	if opts.Members <= 0 {
		opts.Members = 3
	}
	if opts.ReadyTimeout <= 0 {
		opts.ReadyTimeout = 30 * time.Second
	}
	dir, err := os.MkdirTemp("", "localcluster-etcdcluster-")
	if err != nil {
		return nil, fmt.Errorf("localcluster: etcd data dir: %w", err)
	}
	ports, err := opts.freePorts(2 * opts.Members)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	// Build the binary first, so that ReadyTimeout does not cover the build.
	if _, err := EtcdBinary(ctx); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	c := &EtcdCluster{opts: opts, dir: dir, servers: make([]*etcdProcess, opts.Members), ids: make([]uint64, opts.Members)}
	for i := range opts.Members {
		c.members = append(c.members, clusterMember{name: "m" + strconv.Itoa(i), clientPort: ports[2*i], peerPort: ports[2*i+1]})
		// The client does not dial until its first call.
		cl, err := clientv3.New(clientv3.Config{Endpoints: []string{c.MemberEndpoint(i)}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("localcluster: etcd client: %w", err)
		}
		c.clients = append(c.clients, cl)
	}
	// A member waits for a quorum before it is ready, so all start before any is waited for.
	errs := make(chan error, opts.Members)
	for i := range c.members {
		go func() { errs <- c.start(ctx, i) }()
	}
	var first error
	for range c.members {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		c.Close()
		return nil, first
	}
	return c, nil
}

func urlOf(port int) url.URL {
	return url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
}

func (c *EtcdCluster) config(i int) etcdConfig {
	m := c.members[i]
	var initial []string
	for _, o := range c.members {
		u := urlOf(o.peerPort)
		initial = append(initial, o.name+"="+u.String())
	}
	client, peer := urlOf(m.clientPort), urlOf(m.peerPort)
	return etcdConfig{
		Name:                m.name,
		Dir:                 filepath.Join(c.dir, m.name),
		TickMs:              clusterTickMs,
		ElectionMs:          clusterElectionMs,
		UnsafeNoFsync:       c.opts.UnsafeNoFsync,
		ClientURL:           client.String(),
		PeerURL:             peer.String(),
		InitialCluster:      strings.Join(initial, ","),
		InitialClusterToken: "localcluster",
	}
}

// start starts member i and waits until it serves clients and answers a Status request.
func (c *EtcdCluster) start(ctx context.Context, i int) error {
	c.mu.Lock()
	if p := c.servers[i]; p != nil && p.running() {
		c.mu.Unlock()
		return fmt.Errorf("localcluster: etcd member %d is already running", i)
	}
	p, err := launchEtcd(ctx, c.config(i))
	if err != nil {
		c.servers[i] = nil
		c.mu.Unlock()
		return fmt.Errorf("localcluster: start etcd member %d: %w", i, err)
	}
	c.servers[i] = p
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, c.opts.ReadyTimeout)
	defer cancel()
	err = p.waitReady(ctx, c.opts.ReadyTimeout)
	if err == nil {
		var resp *pb.StatusResponse
		if resp, err = c.status(ctx, i); err == nil {
			c.mu.Lock()
			c.ids[i] = resp.Header.MemberId
			c.mu.Unlock()
			return nil
		}
		err = fmt.Errorf("ready but does not answer: %w", err)
	}
	c.stopProcess(i, p)
	return fmt.Errorf("localcluster: start etcd member %d: %w", i, err)
}

// status asks member i alone for its status, on the connection of its client, waiting until
// ctx ends for that connection, which may be backing off after the member was down.
func (c *EtcdCluster) status(ctx context.Context, i int) (*pb.StatusResponse, error) {
	return pb.NewMaintenanceClient(c.clients[i].ActiveConnection()).Status(ctx, &pb.StatusRequest{}, grpc.WaitForReady(true))
}

// Members returns how many members the cluster has.
func (c *EtcdCluster) Members() int { return len(c.members) }

// Endpoints returns the client URLs of every member, in member order. They stay the same across
// stops and restarts.
func (c *EtcdCluster) Endpoints() []string {
	var eps []string
	for i := range c.members {
		eps = append(eps, c.MemberEndpoint(i))
	}
	return eps
}

// MemberEndpoint returns the client URL of member i, such as "http://127.0.0.1:40123".
func (c *EtcdCluster) MemberEndpoint(i int) string {
	u := urlOf(c.members[i].clientPort)
	return u.String()
}

// Client returns a new client of every member, with a no-op logger. The caller must close it.
func (c *EtcdCluster) Client() (*clientv3.Client, error) {
	cl, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("localcluster: etcd client: %w", err)
	}
	return cl, nil
}

// Leader returns the member that is the leader as a running member sees it, asking each running
// member's status in turn (for at most a second each); ok is false if no running member knows of
// a leader that is running.
func (c *EtcdCluster) Leader() (i int, ok bool) {
	for m := range c.members {
		if !c.Running(m) {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := c.status(ctx, m)
		cancel()
		if err != nil || resp.Leader == 0 {
			continue
		}
		c.mu.Lock()
		for j, id := range c.ids {
			if id == resp.Leader && c.servers[j] != nil && c.servers[j].running() {
				c.mu.Unlock()
				return j, true
			}
		}
		c.mu.Unlock()
	}
	return 0, false
}

// Running reports whether member i is started and its process has not exited.
func (c *EtcdCluster) Running(i int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.servers[i] != nil && c.servers[i].running()
}

// StopMember stops member i (SIGTERM, then SIGKILL if it has not exited within 10 seconds),
// waits until its process has exited, and keeps its data directory. Stopping a stopped member
// does nothing.
func (c *EtcdCluster) StopMember(i int) {
	c.mu.Lock()
	p := c.servers[i]
	c.mu.Unlock()
	if p != nil {
		c.stopProcess(i, p)
	}
}

// stopProcess stops p, the process of member i, and forgets it unless another has replaced it.
func (c *EtcdCluster) stopProcess(i int, p *etcdProcess) {
	p.stop()
	c.mu.Lock()
	if c.servers[i] == p {
		c.servers[i] = nil
	}
	c.mu.Unlock()
}

// RestartMember starts stopped member i again on its ports and data directory, and waits until
// it serves clients.
func (c *EtcdCluster) RestartMember(ctx context.Context, i int) error {
	return c.start(ctx, i)
}

// Close stops every member and removes the data directories.
func (c *EtcdCluster) Close() error {
	for i := range c.members {
		c.StopMember(i)
	}
	for _, cl := range c.clients {
		cl.Close()
	}
	if err := os.RemoveAll(c.dir); err != nil {
		return fmt.Errorf("localcluster: remove etcd data dir: %w", err)
	}
	return nil
}

var errNoLeader = errors.New("localcluster: no leader")

// WaitLeader waits until a running member knows of a running leader, and returns it.
func (c *EtcdCluster) WaitLeader(ctx context.Context) (int, error) {
	for {
		if i, ok := c.Leader(); ok {
			return i, nil
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("%w: %w", errNoLeader, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
