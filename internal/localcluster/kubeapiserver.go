package localcluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// KubeAPIServerOptions configures [StartKubeAPIServer]. The zero value starts
// a kube-apiserver with the v1.33 defaults, which write both the legacy
// bitmap and IPAddress objects ("dual write").
type KubeAPIServerOptions struct {
	// Binary is the kube-apiserver to run. Defaults to the result of
	// [KubeAPIServerBinary], which may build it.
	Binary string
	// ServiceClusterIPRange is the --service-cluster-ip-range flag: one CIDR,
	// or an IPv4 and an IPv6 CIDR separated by a comma. Defaults to
	// "10.96.0.0/24".
	ServiceClusterIPRange string
	// FeatureGates is the --feature-gates flag, such as
	// "MultiCIDRServiceAllocator=false" for a peer that runs only the legacy
	// bitmap allocator. Defaults to none.
	FeatureGates string
	// EtcdPrefix is the --etcd-prefix flag. Defaults to "/registry".
	EtcdPrefix string
	// ExtraArgs are appended to the command line; a flag given here overrides
	// the one set from the other fields.
	ExtraArgs []string
	// ReadyTimeout bounds how long [StartKubeAPIServer] waits for /readyz.
	// Defaults to 60 seconds.
	ReadyTimeout time.Duration
	// Token is the administrator's bearer token. Defaults to a new random
	// one. Give the same token to a server started again in place of a
	// stopped one, so that clients holding the old server's credentials
	// keep working.
	Token string
}

// EtcdServers is the etcd a kube-apiserver stores its objects in: an [Etcd],
// or the members of an [EtcdCluster].
type EtcdServers interface {
	// Endpoints returns the client URLs, for --etcd-servers.
	Endpoints() []string
}

// KubeAPIServer is a real kube-apiserver running as a child process on
// 127.0.0.1, with token authentication for one administrator and
// AlwaysAllow authorization.
//
// The zero KubeAPIServer is not usable; use [StartKubeAPIServer]. The
// methods of a KubeAPIServer are safe for concurrent use.
type KubeAPIServer struct {
	// Config reaches the server as a member of system:masters, with a bearer
	// token and TLS verification off. Copy it before changing it.
	Config *rest.Config
	// Client is a clientset built from [KubeAPIServer.Config].
	Client kubernetes.Interface
	// LogPath is the file that receives the server's stdout and stderr.
	LogPath string
	// Dir is the temporary directory holding the log, keys, token file and
	// serving certificates. [KubeAPIServer.Close] removes it.
	Dir string

	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited
	err    error         // the result of cmd.Wait, set before exited closes

	mu      sync.Mutex // guards stopped
	stopped bool
}

// kubeAPIServerStopGrace is how long [KubeAPIServer.Stop] waits after SIGTERM before it
// sends SIGKILL.
const kubeAPIServerStopGrace = 10 * time.Second

// StartKubeAPIServer starts a kube-apiserver that stores its objects in etcd
// and waits until its /readyz reports ready. If opts.Binary is empty it may
// build the binary first, within ctx; see [KubeAPIServerBinary]. The caller
// must [KubeAPIServer.Close] it. On failure the error includes the end of the server's log.
func StartKubeAPIServer(ctx context.Context, etcd EtcdServers, opts KubeAPIServerOptions) (*KubeAPIServer, error) {
	if opts.ServiceClusterIPRange == "" {
		opts.ServiceClusterIPRange = "10.96.0.0/24"
	}
	if opts.EtcdPrefix == "" {
		opts.EtcdPrefix = "/registry"
	}
	if opts.ReadyTimeout <= 0 {
		opts.ReadyTimeout = 60 * time.Second
	}
	if opts.Binary == "" {
		bin, err := KubeAPIServerBinary(ctx)
		if err != nil {
			return nil, err
		}
		opts.Binary = bin
	}
	dir, err := os.MkdirTemp("", "localcluster-kube-apiserver-")
	if err != nil {
		return nil, fmt.Errorf("localcluster: %w", err)
	}
	s, err := startKubeAPIServer(ctx, dir, etcd, opts)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

func startKubeAPIServer(ctx context.Context, dir string, etcd EtcdServers, opts KubeAPIServerOptions) (*KubeAPIServer, error) {
	token, err := writeAuthFiles(dir, opts.Token)
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	port := ports[0]
	args := []string{
		"--etcd-servers=" + strings.Join(etcd.Endpoints(), ","),
		"--etcd-prefix=" + opts.EtcdPrefix,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--cert-dir=" + filepath.Join(dir, "certs"),
		"--service-cluster-ip-range=" + opts.ServiceClusterIPRange,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + filepath.Join(dir, "sa.key"),
		"--service-account-signing-key-file=" + filepath.Join(dir, "sa.key"),
		"--token-auth-file=" + filepath.Join(dir, "tokens.csv"),
		"--authorization-mode=AlwaysAllow",
		// With a loopback advertise address the lease reconciler logs errors
		// forever; no test needs the endpoints of the kubernetes Service.
		"--endpoint-reconciler-type=none",
		"--profiling=false",
	}
	if opts.FeatureGates != "" {
		args = append(args, "--feature-gates="+opts.FeatureGates)
	}
	args = append(args, opts.ExtraArgs...)

	logPath := filepath.Join(dir, "kube-apiserver.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("localcluster: %w", err)
	}
	defer logFile.Close() // the child keeps its own descriptor
	fmt.Fprintf(logFile, "# %s %s\n", opts.Binary, strings.Join(args, " "))

	cmd := exec.Command(opts.Binary, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = childProcAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("localcluster: start kube-apiserver: %w", err)
	}
	s := &KubeAPIServer{
		LogPath: logPath,
		Dir:     dir,
		cmd:     cmd,
		exited:  make(chan struct{}),
	}
	go func() {
		s.err = cmd.Wait()
		close(s.exited)
	}()

	host := "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	if err := s.waitReady(ctx, host, token, opts.ReadyTimeout); err != nil {
		s.Stop()
		return nil, fmt.Errorf("%w\n--- end of %s:\n%s", err, logPath, logTail(logPath, 40))
	}
	s.Config = &rest.Config{
		Host:            host,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true},
		QPS:             1000,
		Burst:           2000,
	}
	s.Client, err = kubernetes.NewForConfig(s.Config)
	if err != nil {
		s.Stop()
		return nil, fmt.Errorf("localcluster: kube-apiserver client: %w", err)
	}
	return s, nil
}

// writeAuthFiles writes the service account signing key and a token file
// with one member of system:masters to dir, and returns that member's token:
// token if it is not empty, else a new random one.
func writeAuthFiles(dir, token string) (string, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return "", fmt.Errorf("localcluster: service account key: %w", err)
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	if err := os.WriteFile(filepath.Join(dir, "sa.key"), keyPEM, 0o600); err != nil {
		return "", fmt.Errorf("localcluster: %w", err)
	}
	if token == "" {
		var b [16]byte
		rand.Read(b[:])
		token = hex.EncodeToString(b[:])
	}
	line := token + `,admin,admin,"system:masters"` + "\n"
	if err := os.WriteFile(filepath.Join(dir, "tokens.csv"), []byte(line), 0o600); err != nil {
		return "", fmt.Errorf("localcluster: %w", err)
	}
	return token, nil
}

// waitReady polls /readyz until it answers 200, the process exits, ctx is
// done or timeout passes.
func (s *KubeAPIServer) waitReady(ctx context.Context, host, token string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	client := &http.Client{
		Timeout: 2 * time.Second,
		Transport: &http.Transport{
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
			Proxy:           nil, // never route 127.0.0.1 through $HTTPS_PROXY
		},
	}
	defer client.CloseIdleConnections()
	var last string
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, host+"/readyz", nil)
		if err != nil {
			return fmt.Errorf("localcluster: %w", err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("%s: %s", resp.Status, bytes.TrimSpace(body))
		} else {
			last = err.Error()
		}
		select {
		case <-s.exited:
			return fmt.Errorf("localcluster: kube-apiserver exited before it was ready: %v", s.err)
		case <-ctx.Done():
			return fmt.Errorf("localcluster: kube-apiserver not ready: %w; last /readyz: %s", ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Stop stops the server with SIGTERM, and with SIGKILL if it has not exited
// 10 seconds later, and waits for it to exit. It keeps Dir. Stopping a
// stopped server does nothing.
func (s *KubeAPIServer) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return
	}
	s.stopped = true
	select {
	case <-s.exited:
		return
	default:
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(kubeAPIServerStopGrace):
		s.cmd.Process.Kill()
		<-s.exited
	}
}

// Kill stops the server with SIGKILL, as a crash would, without letting it
// finish the requests in flight, and waits for it to exit. It keeps Dir.
// Killing a stopped server does nothing.
func (s *KubeAPIServer) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return
	}
	s.stopped = true
	s.cmd.Process.Kill()
	<-s.exited
}

// Close stops the server and removes [KubeAPIServer.Dir], with the log in it.
func (s *KubeAPIServer) Close() error {
	s.Stop()
	if err := os.RemoveAll(s.Dir); err != nil {
		return fmt.Errorf("localcluster: %w", err)
	}
	return nil
}

// LogTail returns the last n lines of the server's log, for a failure report.
func (s *KubeAPIServer) LogTail(n int) string { return logTail(s.LogPath, n) }

// logTail returns the last n lines of the file at path.
func logTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "(no log)"
		}
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
