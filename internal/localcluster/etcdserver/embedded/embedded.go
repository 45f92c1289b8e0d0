// Package embedded starts one etcd member in this process: the embedded server of
// go.etcd.io/etcd/server/v3, configured by the JSON that package localcluster writes for it. It
// is the one place that turns that configuration into etcd's: the etcdserver program runs it in
// a child process for the tests, and the clusterip command runs it in its own process, so that
// a command installed without a clone of the repository needs no etcd binary.
package embedded

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"sync"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// config is the member's configuration: the fields of embed.Config that localcluster sets.
type config struct {
	Name          string
	Dir           string
	TickMs        uint
	ElectionMs    uint
	UnsafeNoFsync bool
	// ClientURL and PeerURL are where the member listens and what it advertises.
	ClientURL, PeerURL string
	// InitialCluster is name=peer URL for every member, comma separated; empty for a lone
	// member, which then makes a cluster of itself.
	InitialCluster      string
	InitialClusterToken string
	// ClientTLS, if not nil, makes the client port serve TLS only and require client
	// certificates signed by CAFile.
	ClientTLS *struct{ CertFile, KeyFile, CAFile string }
}

// Member is an etcd member running in this process. The zero Member is not usable; use
// [Start]. Its methods are safe for concurrent use.
type Member struct {
	srv   *embed.Etcd
	ready chan struct{} // closed once the member serves clients
	done  chan struct{} // closed once the member has stopped

	mu      sync.Mutex // guards stopped and err
	stopped bool       // whether Close or a failure has begun to stop the member
	err     error
}

// Start parses the JSON configuration raw and starts a member with it. It does not wait until
// the member serves clients: see [Member.Ready]. An error from a port already in use says
// "address already in use".
func Start(raw []byte) (*Member, error) {
	var c config
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("etcd config: %w", err)
	}
	cfg, err := c.embed()
	if err != nil {
		return nil, fmt.Errorf("etcd config: %w", err)
	}
	srv, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("start etcd: %w", err)
	}
	m := &Member{srv: srv, ready: make(chan struct{}), done: make(chan struct{})}
	go m.watch()
	return m, nil
}

// watch closes m.ready when the member serves clients, and stops the member and closes m.done
// when it fails or stops.
func (m *Member) watch() {
	select {
	case <-m.srv.Server.ReadyNotify():
		close(m.ready)
	case err := <-m.srv.Err():
		m.stop(fmt.Errorf("start etcd: %w", err))
		return
	case <-m.srv.Server.StopNotify():
		m.stop(errors.New("etcd stopped while starting"))
		return
	}
	select {
	case err := <-m.srv.Err():
		m.stop(fmt.Errorf("etcd failed: %w", err))
	case <-m.srv.Server.StopNotify():
		m.stop(errors.New("etcd stopped"))
	}
}

// stop stops the member, recording err as why unless it is already stopping, and returns once
// it has stopped.
func (m *Member) stop(err error) {
	m.mu.Lock()
	first := !m.stopped
	if first {
		m.stopped, m.err = true, err
	}
	m.mu.Unlock()
	if !first {
		<-m.done
		return
	}
	m.srv.Close()
	close(m.done)
}

// Ready is closed once the member serves clients.
func (m *Member) Ready() <-chan struct{} { return m.ready }

// Done is closed once the member has stopped, by [Member.Close] or by a failure.
func (m *Member) Done() <-chan struct{} { return m.done }

// Err returns why the member stopped: nil while it runs and after [Member.Close].
func (m *Member) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.err
}

// Close stops the member and returns once it has stopped. Closing a stopped Member does nothing.
func (m *Member) Close() { m.stop(nil) }

// embed returns the embed.Config of c.
func (c config) embed() (*embed.Config, error) {
	clientURL, err := url.Parse(c.ClientURL)
	if err != nil {
		return nil, err
	}
	peerURL, err := url.Parse(c.PeerURL)
	if err != nil {
		return nil, err
	}
	cfg := embed.NewConfig()
	cfg.Name = c.Name
	cfg.Dir = c.Dir
	cfg.TickMs = c.TickMs
	cfg.ElectionMs = c.ElectionMs
	cfg.UnsafeNoFsync = c.UnsafeNoFsync
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	if t := c.ClientTLS; t != nil {
		cfg.ClientTLSInfo = transport.TLSInfo{CertFile: t.CertFile, KeyFile: t.KeyFile, TrustedCAFile: t.CAFile, ClientCertAuth: true}
	}
	cfg.ListenClientUrls = []url.URL{*clientURL}
	cfg.AdvertiseClientUrls = []url.URL{*clientURL}
	cfg.ListenPeerUrls = []url.URL{*peerURL}
	cfg.AdvertisePeerUrls = []url.URL{*peerURL}
	if c.InitialCluster == "" {
		cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	} else {
		cfg.InitialCluster = c.InitialCluster
	}
	if c.InitialClusterToken != "" {
		cfg.InitialClusterToken = c.InitialClusterToken
	}
	return cfg, nil
}
