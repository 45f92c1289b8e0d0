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
// tests can take a member (the leader, say) away and bring it back under running clients. A
// member whose port another process took while it was stopped restarts on a new one (see
// [EtcdCluster.RestartMember]).
//
// The zero EtcdCluster is not usable; use [StartEtcdCluster]. Its methods are safe for
// concurrent use.
type EtcdCluster struct {
	opts EtcdClusterOptions
	dir  string

	mu      sync.Mutex         // guards members' ports, servers, ids and clients
	members []clusterMember    // by member; their number is fixed after StartEtcdCluster
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
// every one serves clients. It builds the binary of [EtcdBinary] first if it is missing, and
// picks the ports only then, so that a long build does not leave them to other processes. If a
// member cannot bind a port because another process took it after the pick, it starts the
// whole cluster afresh on new ports (a member's peer URL is part of the new cluster's identity),
// up to 3 times. The caller must [EtcdCluster.Close] it.
func StartEtcdCluster(ctx context.Context, opts EtcdClusterOptions) (*EtcdCluster, error) {
	if opts.Members <= 0 {
		opts.Members = 3
	}
	if opts.ReadyTimeout <= 0 {
		opts.ReadyTimeout = 30 * time.Second
	}
	// Build the binary first, so that neither ReadyTimeout nor the picked ports' freedom has to
	// last through the build.
	if _, err := EtcdBinary(ctx); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "localcluster-etcdcluster-")
	if err != nil {
		return nil, fmt.Errorf("localcluster: etcd data dir: %w", err)
	}
	c := &EtcdCluster{opts: opts, dir: dir, servers: make([]*etcdProcess, opts.Members), ids: make([]uint64, opts.Members),
		members: make([]clusterMember, opts.Members), clients: make([]*clientv3.Client, opts.Members)}
	for i := range c.members {
		c.members[i].name = "m" + strconv.Itoa(i)
	}
	for attempt := 1; ; attempt++ {
		err = c.startAll(ctx)
		if err == nil {
			return c, nil
		}
		c.stopAll()
		if !isAddrInUse(err) || attempt == etcdStartAttempts {
			os.RemoveAll(dir)
			return nil, err
		}
		// The members that did start wrote data for a cluster of the old peer URLs.
		for _, m := range c.members {
			if err := os.RemoveAll(filepath.Join(dir, m.name)); err != nil {
				os.RemoveAll(dir)
				return nil, fmt.Errorf("localcluster: remove etcd data dir: %w", err)
			}
		}
	}
}

// startAll picks new ports for every member, makes their clients and starts them all. If one
// fails, it stops waiting for the others and returns its error: one about a port already in
// use if any member had one.
func (c *EtcdCluster) startAll(ctx context.Context) error {
	ports, err := c.opts.freePorts(2 * len(c.members))
	if err != nil {
		return err
	}
	for i := range c.members {
		c.members[i].clientPort, c.members[i].peerPort = ports[2*i], ports[2*i+1]
		// The client does not dial until its first call.
		cl, err := clientv3.New(clientv3.Config{Endpoints: []string{c.MemberEndpoint(i)}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			return fmt.Errorf("localcluster: etcd client: %w", err)
		}
		c.mu.Lock()
		c.clients[i] = cl
		c.mu.Unlock()
	}
	// A member waits for a quorum before it is ready, so all start before any is waited for.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, len(c.members))
	for i := range c.members {
		go func() {
			err := c.start(ctx, i, true)
			if err != nil {
				cancel() // the others will not get a quorum of this cluster
			}
			errs <- err
		}()
	}
	var first, inUse error
	for range c.members {
		err := <-errs
		if err != nil && first == nil {
			first = err
		}
		if isAddrInUse(err) && inUse == nil {
			inUse = err
		}
	}
	if inUse != nil {
		return inUse
	}
	return first
}

// stopAll stops every member and closes their clients.
func (c *EtcdCluster) stopAll() {
	for i := range c.members {
		c.StopMember(i)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, cl := range c.clients {
		if cl != nil {
			cl.Close()
			c.clients[i] = nil
		}
	}
}

func urlOf(port int) url.URL {
	return url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
}

// config returns the configuration of member i. c.mu must be held.
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

// start starts member i and waits until it serves clients and answers a Status request. If it
// does not, start stops it: gracefully, or for a member of a new cluster (fresh), whose data
// StartEtcdCluster discards, at once (a member waiting for a quorum may take the whole stop
// timeout to close).
func (c *EtcdCluster) start(ctx context.Context, i int, fresh bool) error {
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
	if fresh {
		p.kill()
	}
	c.stopProcess(i, p)
	return fmt.Errorf("localcluster: start etcd member %d: %w", i, err)
}

// status asks member i alone for its status, on the connection of its client, waiting until
// ctx ends for that connection, which may be backing off after the member was down.
func (c *EtcdCluster) status(ctx context.Context, i int) (*pb.StatusResponse, error) {
	c.mu.Lock()
	cl := c.clients[i]
	c.mu.Unlock()
	return pb.NewMaintenanceClient(cl.ActiveConnection()).Status(ctx, &pb.StatusRequest{}, grpc.WaitForReady(true))
}

// Members returns how many members the cluster has.
func (c *EtcdCluster) Members() int { return len(c.members) }

// Endpoints returns the client URLs of every member, in member order. They stay the same across
// stops and restarts, unless a restart had to move a member off a client port another process
// took (see [EtcdCluster.RestartMember]).
func (c *EtcdCluster) Endpoints() []string {
	var eps []string
	for i := range c.members {
		eps = append(eps, c.MemberEndpoint(i))
	}
	return eps
}

// MemberEndpoint returns the client URL of member i, such as "http://127.0.0.1:40123".
func (c *EtcdCluster) MemberEndpoint(i int) string {
	c.mu.Lock()
	u := urlOf(c.members[i].clientPort)
	c.mu.Unlock()
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

// RestartMember starts stopped member i again on its data directory, and waits until it serves
// clients. It keeps the member's ports unless another process took one while the member was
// stopped (or takes one as it starts: it tries up to 3 times), and then moves the member to a
// new one, as an operator moves a member of a running cluster:
//
//   - A new peer port changes the member's peer URL, which is part of the cluster's membership:
//     the other members, which dial it, learn it from a member update (etcd's MemberUpdate)
//     made through them before the member starts, so it needs a quorum of the others running.
//     The restarted member applies the same update as it catches up.
//   - A new client port changes only what the member listens on and advertises (a member
//     publishes its client URLs to the cluster on every start): [EtcdCluster.MemberEndpoint]
//     and [EtcdCluster.Endpoints] return the new URL from then on, and clients made before
//     reach the member no more, only the others.
func (c *EtcdCluster) RestartMember(ctx context.Context, i int) error {
	for attempt := 1; ; attempt++ {
		if err := c.moveOffTakenPorts(ctx, i); err != nil {
			return err
		}
		err := c.start(ctx, i, false)
		if err == nil || !isAddrInUse(err) || attempt == etcdStartAttempts {
			return err
		}
	}
}

// moveOffTakenPorts gives stopped member i a new port for each of its ports that another process
// has taken, updating the cluster's membership for a new peer URL (see RestartMember).
func (c *EtcdCluster) moveOffTakenPorts(ctx context.Context, i int) error {
	c.mu.Lock()
	m, id := c.members[i], c.ids[i]
	running := c.servers[i] != nil && c.servers[i].running()
	c.mu.Unlock()
	if running {
		return nil // start says so
	}
	clientTaken, peerTaken := !portFree(m.clientPort), !portFree(m.peerPort)
	if !clientTaken && !peerTaken {
		return nil
	}
	var n int
	for _, taken := range []bool{clientTaken, peerTaken} {
		if taken {
			n++
		}
	}
	ports, err := c.opts.freePorts(n)
	if err != nil {
		return err
	}
	if peerTaken {
		peer := ports[n-1]
		if err := c.updatePeerURL(ctx, i, id, peer); err != nil {
			return err
		}
		c.mu.Lock()
		c.members[i].peerPort = peer
		c.mu.Unlock()
	}
	if clientTaken {
		u := urlOf(ports[0])
		cl, err := clientv3.New(clientv3.Config{Endpoints: []string{u.String()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			return fmt.Errorf("localcluster: etcd client: %w", err)
		}
		c.mu.Lock()
		old := c.clients[i]
		c.members[i].clientPort, c.clients[i] = ports[0], cl
		c.mu.Unlock()
		old.Close()
	}
	return nil
}

// updatePeerURL makes the peer URL of member i, whose member ID is id, that of port, with a
// member update made through the other members.
func (c *EtcdCluster) updatePeerURL(ctx context.Context, i int, id uint64, port int) error {
	u := urlOf(port)
	if id == 0 {
		return fmt.Errorf("localcluster: move etcd member %d to peer URL %s: its member ID is not known", i, u.String())
	}
	var others []string
	for j := range c.members {
		if j != i {
			others = append(others, c.MemberEndpoint(j))
		}
	}
	cl, err := clientv3.New(clientv3.Config{Endpoints: others, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return fmt.Errorf("localcluster: etcd client: %w", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, c.opts.ReadyTimeout)
	defer cancel()
	if _, err := cl.MemberUpdate(ctx, id, []string{u.String()}); err != nil {
		return fmt.Errorf("localcluster: move etcd member %d to peer URL %s: %w", i, u.String(), err)
	}
	return nil
}

// portFree reports whether port on 127.0.0.1 can be listened on now.
func portFree(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// Close stops every member and removes the data directories.
func (c *EtcdCluster) Close() error {
	c.stopAll()
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
