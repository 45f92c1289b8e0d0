// Command etcdserver runs one etcd member for the tests and the demo: the embedded etcd server
// of go.etcd.io/etcd/server/v3, in a process of its own, so that the server and its
// dependencies stay out of the library's module graph. package localcluster builds it and runs
// it as a child process (see localcluster.EtcdBinary); it is not meant to be run by hand.
//
// Its one argument is the member's configuration as JSON (see config). It logs nothing but a
// failure to start, on stderr; once the member serves clients it prints "ready" on stdout. It
// stops on SIGTERM or SIGINT, closing the server; a SIGKILL loses nothing that an fsync
// covered, so a new process on the same data directory carries on.
package main

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"syscall"

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

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: etcdserver CONFIG-JSON")
		os.Exit(2)
	}
	var c config
	if err := json.Unmarshal([]byte(os.Args[1]), &c); err != nil {
		fmt.Fprintln(os.Stderr, "etcdserver: config:", err)
		os.Exit(2)
	}
	// Handle the signals before the server starts, so that one sent while it starts still
	// closes it.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	cfg, err := c.embed()
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcdserver: config:", err)
		os.Exit(2)
	}
	srv, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcdserver: start etcd:", err)
		os.Exit(1)
	}
	select {
	case <-srv.Server.ReadyNotify():
		fmt.Println("ready")
	case err := <-srv.Err():
		srv.Close()
		fmt.Fprintln(os.Stderr, "etcdserver: start etcd:", err)
		os.Exit(1)
	case <-sig:
		srv.Close()
		return
	}
	select {
	case err := <-srv.Err():
		srv.Close()
		fmt.Fprintln(os.Stderr, "etcdserver: etcd failed:", err)
		os.Exit(1)
	case <-srv.Server.StopNotify():
		fmt.Fprintln(os.Stderr, "etcdserver: etcd stopped")
		os.Exit(1)
	case <-sig:
		srv.Close()
	}
}

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
