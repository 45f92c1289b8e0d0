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

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
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
}

// EtcdCluster is an etcd cluster of several members, all embedded in the process and listening
// on 127.0.0.1, each with its own ports and data directory, which it keeps across
// [EtcdCluster.StopMember] and [EtcdCluster.RestartMember], so that fault-injection tests can take
// a member (the leader, say) away and bring it back under running clients.
//
// The zero EtcdCluster is not usable; use [StartEtcdCluster]. Its methods are safe for
// concurrent use.
type EtcdCluster struct {
	opts    EtcdClusterOptions
	dir     string
	members []clusterMember // fixed after StartEtcdCluster

	mu      sync.Mutex    // guards servers
	servers []*embed.Etcd // by member; nil while stopped
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
// every one serves clients. The caller must [EtcdCluster.Close] it.
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
	ports, err := freePorts(2 * opts.Members)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	c := &EtcdCluster{opts: opts, dir: dir, servers: make([]*embed.Etcd, opts.Members)}
	for i := range opts.Members {
		c.members = append(c.members, clusterMember{name: "m" + strconv.Itoa(i), clientPort: ports[2*i], peerPort: ports[2*i+1]})
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

func (c *EtcdCluster) config(i int) *embed.Config {
	m := c.members[i]
	cfg := embed.NewConfig()
	cfg.Name = m.name
	cfg.Dir = filepath.Join(c.dir, m.name)
	cfg.TickMs = clusterTickMs
	cfg.ElectionMs = clusterElectionMs
	cfg.UnsafeNoFsync = c.opts.UnsafeNoFsync
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.ListenClientUrls = []url.URL{urlOf(m.clientPort)}
	cfg.AdvertiseClientUrls = cfg.ListenClientUrls
	cfg.ListenPeerUrls = []url.URL{urlOf(m.peerPort)}
	cfg.AdvertisePeerUrls = cfg.ListenPeerUrls
	var initial []string
	for _, o := range c.members {
		u := urlOf(o.peerPort)
		initial = append(initial, o.name+"="+u.String())
	}
	cfg.InitialCluster = strings.Join(initial, ",")
	cfg.InitialClusterToken = "localcluster"
	return cfg
}

// start starts member i and waits until it serves clients.
func (c *EtcdCluster) start(ctx context.Context, i int) error {
	c.mu.Lock()
	if c.servers[i] != nil {
		c.mu.Unlock()
		return fmt.Errorf("localcluster: etcd member %d is already running", i)
	}
	srv, err := embed.StartEtcd(c.config(i))
	if err != nil {
		c.mu.Unlock()
		return fmt.Errorf("localcluster: start etcd member %d: %w", i, err)
	}
	c.servers[i] = srv
	c.mu.Unlock()
	timer := time.NewTimer(c.opts.ReadyTimeout)
	defer timer.Stop()
	select {
	case <-srv.Server.ReadyNotify():
		return nil
	case err = <-srv.Err():
	case <-timer.C:
		err = fmt.Errorf("not ready after %v", c.opts.ReadyTimeout)
	case <-ctx.Done():
		err = ctx.Err()
	}
	c.StopMember(i)
	return fmt.Errorf("localcluster: start etcd member %d: %w", i, err)
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

// Leader returns the member that is the leader as a running member sees it; ok is false if no
// running member knows of a leader that is running.
func (c *EtcdCluster) Leader() (i int, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, srv := range c.servers {
		if srv == nil {
			continue
		}
		lead := srv.Server.Leader()
		for j, o := range c.servers {
			if o != nil && o.Server.ID() == lead {
				return j, true
			}
		}
	}
	return 0, false
}

// Running reports whether member i is started.
func (c *EtcdCluster) Running(i int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.servers[i] != nil
}

// StopMember stops member i and keeps its data directory. Stopping a stopped member does
// nothing.
func (c *EtcdCluster) StopMember(i int) {
	c.mu.Lock()
	srv := c.servers[i]
	c.servers[i] = nil
	c.mu.Unlock()
	if srv != nil {
		srv.Close()
	}
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
