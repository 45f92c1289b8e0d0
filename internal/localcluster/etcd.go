package localcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// EtcdOptions configures [StartEtcd]. The zero value starts a durable etcd in a
// new temporary directory.
type EtcdOptions struct {
	// Dir is the data directory. Defaults to a new temporary directory that
	// [Etcd.Close] removes; a directory given here is kept.
	Dir string
	// UnsafeNoFsync disables fsync. It makes tests several times faster and
	// loses data on a machine crash; never set it outside tests.
	UnsafeNoFsync bool
	// ReadyTimeout bounds how long [StartEtcd] and [Etcd.Restart] wait for the server to
	// serve clients. Defaults to 30 seconds.
	ReadyTimeout time.Duration
	// ClientTLS, if not nil, makes etcd serve clients over TLS only (https endpoints) and
	// require of each a certificate signed by ClientTLS.CAFile, as a production etcd does.
	// Defaults to nil: plain http with no client authentication.
	ClientTLS *EtcdTLS
	// Start, if not nil, starts the server in this process instead of as a child process
	// running the binary of [EtcdBinary], which needs a clone of the repository to build it.
	// Defaults to nil: a child process, which the tests use so that etcd's server stays out of
	// the library's module graph.
	Start EtcdStarter
}

// EtcdTLS is the TLS of an etcd's client port: the files of the server's certificate, of the CA
// it verifies client certificates with, and of the client certificate that [Etcd.Client] and a
// kube-apiserver started against the etcd ([StartKubeAPIServer]) present.
type EtcdTLS struct {
	// CertFile and KeyFile are the server's certificate, valid for 127.0.0.1, and its key. The
	// certificate should allow client authentication too: etcd's gRPC gateway dials the server
	// with it.
	CertFile, KeyFile string
	// CAFile holds the CA certificates that client certificates must chain to. It is also the
	// bundle [Etcd.Client] and kube-apiserver verify the server's certificate with.
	CAFile string
	// ClientCertFile and ClientKeyFile are the client certificate and key of [Etcd.Client] and
	// of a kube-apiserver started against the etcd.
	ClientCertFile, ClientKeyFile string
}

// Etcd is a single-member etcd server running as a child process (see [EtcdBinary]), or in
// this process (see [EtcdOptions.Start]), listening on 127.0.0.1. It keeps its ports and data directory across [Etcd.Stop] and
// [Etcd.Restart], so fault-injection tests can take etcd away and bring it
// back under running clients.
//
// The zero Etcd is not usable; use [StartEtcd].
// The methods of an Etcd are safe for concurrent use.
type Etcd struct {
	opts       EtcdOptions
	dir        string
	removeDir  bool
	clientPort int
	peerPort   int

	mu   sync.Mutex // guards proc
	proc etcdMember
}

// etcdStartAttempts is how often [StartEtcd] picks new ports when another
// process took a pre-picked port before etcd could bind it.
const etcdStartAttempts = 3

// StartEtcd starts an etcd server on free 127.0.0.1 ports and waits until it
// serves clients. Unless [EtcdOptions.Start] is set, the server runs the binary
// of [EtcdBinary], which StartEtcd builds first if it is missing (cancelling ctx
// stops that build; ReadyTimeout does not cover it), and the kernel kills the
// server if this process dies first (on Linux). The caller must [Etcd.Close] it.
func StartEtcd(ctx context.Context, opts EtcdOptions) (*Etcd, error) {
	if opts.ReadyTimeout <= 0 {
		opts.ReadyTimeout = 30 * time.Second
	}
	e := &Etcd{opts: opts, dir: opts.Dir}
	if e.dir == "" {
		dir, err := os.MkdirTemp("", "localcluster-etcd-")
		if err != nil {
			return nil, fmt.Errorf("localcluster: etcd data dir: %w", err)
		}
		e.dir, e.removeDir = dir, true
	}
	// Build the binary before picking ports, so that they need not stay free through the build.
	var err error
	if opts.Start == nil {
		_, err = EtcdBinary(ctx)
	}
	if err == nil {
		err = e.startOnFreePorts(ctx)
	}
	if err != nil {
		if e.removeDir {
			os.RemoveAll(e.dir)
		}
		return nil, err
	}
	return e, nil
}

// startOnFreePorts starts the server on newly picked ports, picking others when another process
// took one before the server could bind it, up to etcdStartAttempts times.
func (e *Etcd) startOnFreePorts(ctx context.Context) error {
	var err error
	for range etcdStartAttempts {
		ports, perr := freePorts(2)
		if perr != nil {
			return perr
		}
		e.clientPort, e.peerPort = ports[0], ports[1]
		if err = e.start(ctx); err == nil || !isAddrInUse(err) {
			return err
		}
	}
	return err
}

func (e *Etcd) config() etcdConfig {
	cfg := etcdConfig{
		Name:          "localcluster",
		Dir:           e.dir,
		TickMs:        10,
		ElectionMs:    50,
		UnsafeNoFsync: e.opts.UnsafeNoFsync,
		ClientURL:     e.Endpoints()[0],
		PeerURL:       "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(e.peerPort)),
	}
	if t := e.opts.ClientTLS; t != nil {
		cfg.ClientTLS = &etcdServerTLS{CertFile: t.CertFile, KeyFile: t.KeyFile, CAFile: t.CAFile}
	}
	return cfg
}

// start starts the server on e's ports and data directory, and waits until it answers a
// client.
func (e *Etcd) start(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.proc != nil && e.proc.running() {
		return errors.New("localcluster: etcd is already running")
	}
	e.proc = nil
	p, err := startEtcdMember(ctx, e.config(), e.opts.Start)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, e.opts.ReadyTimeout)
	defer cancel()
	if err := p.waitReady(ctx, e.opts.ReadyTimeout); err != nil {
		p.stop()
		return fmt.Errorf("localcluster: start etcd: %w", err)
	}
	if err := e.answers(ctx); err != nil {
		p.stop()
		return fmt.Errorf("localcluster: start etcd: %w", err)
	}
	e.proc = p
	return nil
}

// answers checks that e's server answers a Status request of a client as [Etcd.Client] makes.
func (e *Etcd) answers(ctx context.Context) error {
	c, err := e.Client()
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.Status(ctx, e.Endpoints()[0]); err != nil {
		return fmt.Errorf("etcd is ready but does not answer: %w", err)
	}
	return nil
}

// Endpoints returns the client URLs of e, such as "http://127.0.0.1:40123" (https with
// [EtcdOptions.ClientTLS]). They stay the same across [Etcd.Stop] and [Etcd.Restart].
func (e *Etcd) Endpoints() []string {
	return []string{e.clientScheme() + "://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(e.clientPort))}
}

func (e *Etcd) clientScheme() string {
	if e.opts.ClientTLS != nil {
		return "https"
	}
	return "http"
}

// ClientTLS returns the TLS files of e's client port, or nil if it serves plain http.
func (e *Etcd) ClientTLS() *EtcdTLS { return e.opts.ClientTLS }

// Dir returns the data directory of e.
func (e *Etcd) Dir() string { return e.dir }

// Client returns a new client of e with a no-op logger, presenting
// [EtcdTLS.ClientCertFile] if e requires client certificates. The caller must
// close it. The client does not dial until its first call, so it can be created
// while e is stopped.
func (e *Etcd) Client() (*clientv3.Client, error) {
	cfg := clientv3.Config{
		Endpoints:   e.Endpoints(),
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	}
	if t := e.opts.ClientTLS; t != nil {
		info := transport.TLSInfo{CertFile: t.ClientCertFile, KeyFile: t.ClientKeyFile, TrustedCAFile: t.CAFile}
		tlsConfig, err := info.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("localcluster: etcd client TLS: %w", err)
		}
		cfg.TLS = tlsConfig
	}
	c, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("localcluster: etcd client: %w", err)
	}
	return c, nil
}

// Running reports whether the server of e is started and has not stopped (nor its process
// exited).
func (e *Etcd) Running() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.proc != nil && e.proc.running()
}

// Stop stops the server (a child process by SIGTERM, then SIGKILL if it has not exited within
// 10 seconds), waits until it has stopped, and keeps its data directory; clients then fail until
// [Etcd.Restart]. Stopping a stopped Etcd does nothing.
func (e *Etcd) Stop() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.proc == nil {
		return
	}
	e.proc.stop()
	e.proc = nil
}

// Restart starts a stopped server again on the same ports and data
// directory, and waits until it serves clients. It fails if e is running or
// if another process took one of its ports meanwhile: unlike a member of an
// [EtcdCluster], which its clients reach through the other members too, a lone
// server moved to another client port would strand every client it has (a
// kube-apiserver's --etcd-servers, say), so the test sees the error instead.
func (e *Etcd) Restart(ctx context.Context) error {
	return e.start(ctx)
}

// Close stops the server and removes the data directory if [StartEtcd]
// created it.
func (e *Etcd) Close() error {
	e.Stop()
	if e.removeDir {
		if err := os.RemoveAll(e.dir); err != nil {
			return fmt.Errorf("localcluster: remove etcd data dir: %w", err)
		}
	}
	return nil
}

// picked holds the ports this process has handed out, so that two servers
// started concurrently never get the same port even though each listener is
// closed before the server binds it.
var picked struct {
	mu    sync.Mutex // guards ports
	ports map[int]bool
}

// freePorts returns n distinct free TCP ports on 127.0.0.1 that this process
// has not handed out before. Another process may still take one before the
// caller binds it.
func freePorts(n int) ([]int, error) {
	picked.mu.Lock()
	defer picked.mu.Unlock()
	if picked.ports == nil {
		picked.ports = make(map[int]bool)
	}
	var ports []int
	for tries := 0; len(ports) < n; tries++ {
		if tries > 100 {
			return nil, errors.New("localcluster: no free port on 127.0.0.1")
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("localcluster: pick free port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if picked.ports[port] {
			continue
		}
		picked.ports[port] = true
		ports = append(ports, port)
	}
	return ports, nil
}

func isAddrInUse(err error) bool {
	return err != nil && strings.Contains(err.Error(), "address already in use")
}
