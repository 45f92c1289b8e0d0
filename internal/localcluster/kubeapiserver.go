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
	// [KubeAPIServerReleaseBinary] for Release, which may build it.
	Binary string
	// Release is the stock kube-apiserver release to run when Binary is empty,
	// one of [KubeAPIServerReleases], such as "v1.37.2"; it is ignored when
	// Binary is set. Defaults to [KubeAPIServerVersion]. The other fields'
	// defaults are the same for every release, but the server's own defaults
	// (feature gates, which allocator runs) are its release's.
	Release string
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
	// AuthorizationMode is the --authorization-mode flag. Defaults to
	// "AlwaysAllow"; with "RBAC" a user may do only what a Role or ClusterRole
	// bound to it allows, the administrator of [KubeAPIServer.Config] all
	// (it is in system:masters).
	AuthorizationMode string
	// Users are token-authenticated users besides the administrator, for
	// RBAC tests: [KubeAPIServer.UserConfig] reaches the server as one of
	// them. Defaults to none.
	Users []User
	// AuditLog, if set, makes the server log every request it receives, at
	// the Metadata level (who, verb, resource, response code; no bodies) as
	// one JSON audit.k8s.io/v1 Event per line to [KubeAPIServer.AuditLogPath],
	// before it answers the request. Defaults to false: no audit log.
	AuditLog bool
	// ExtraArgs are appended to the command line; a flag given here overrides
	// the one set from the other fields.
	ExtraArgs []string
	// Env are environment variables, "NAME=value", added to the server's
	// environment, which is otherwise this process's. Defaults to none.
	Env []string
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

// User is a user of a [KubeAPIServer] besides its administrator, authenticated
// by a token the server makes up. The zero User is not valid: it needs a Name.
type User struct {
	// Name is the user name RBAC subjects name.
	Name string
	// Groups are the groups the user is a member of, besides
	// system:authenticated. Defaults to none.
	Groups []string
}

// KubeAPIServer is a real kube-apiserver running as a child process on
// 127.0.0.1, with token authentication for one administrator (and the
// [KubeAPIServerOptions.Users]) and AlwaysAllow authorization unless
// [KubeAPIServerOptions.AuthorizationMode] says otherwise. If its etcd
// requires client certificates ([EtcdOptions.ClientTLS]), it presents
// [EtcdTLS.ClientCertFile].
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
	// AuditLogPath is the audit log with [KubeAPIServerOptions.AuditLog],
	// else "".
	AuditLogPath string
	// Dir is the temporary directory holding the log, keys, token file and
	// serving certificates. [KubeAPIServer.Close] removes it.
	Dir string

	cmd    *exec.Cmd
	exited chan struct{}     // closed when cmd has exited
	tokens map[string]string // user name → token, of the Users
	err    error             // the result of cmd.Wait, set before exited closes

	mu      sync.Mutex // guards stopped
	stopped bool
}

// kubeAPIServerStopGrace is how long [KubeAPIServer.Stop] waits after SIGTERM before it
// sends SIGKILL.
const kubeAPIServerStopGrace = 10 * time.Second

// StartKubeAPIServer starts a kube-apiserver that stores its objects in etcd
// and waits until its /readyz reports ready. If opts.Binary is empty it may
// build the binary of opts.Release first, within ctx; see
// [KubeAPIServerReleaseBinary]. The caller
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
	if opts.AuthorizationMode == "" {
		opts.AuthorizationMode = "AlwaysAllow"
	}
	for _, u := range opts.Users {
		if u.Name == "" || u.Name == adminName {
			return nil, fmt.Errorf("localcluster: user name %q: want a name other than %q", u.Name, adminName)
		}
	}
	if opts.Binary == "" {
		bin, err := KubeAPIServerReleaseBinary(ctx, opts.Release)
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
	token, tokens, err := writeAuthFiles(dir, opts.Token, opts.Users)
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
		"--authorization-mode=" + opts.AuthorizationMode,
		// With a loopback advertise address the lease reconciler logs errors
		// forever; no test needs the endpoints of the kubernetes Service.
		"--endpoint-reconciler-type=none",
		"--profiling=false",
	}
	if opts.FeatureGates != "" {
		args = append(args, "--feature-gates="+opts.FeatureGates)
	}
	if e, ok := etcd.(interface{ ClientTLS() *EtcdTLS }); ok && e.ClientTLS() != nil {
		t := e.ClientTLS()
		args = append(args, "--etcd-cafile="+t.CAFile, "--etcd-certfile="+t.ClientCertFile, "--etcd-keyfile="+t.ClientKeyFile)
	}
	var auditLogPath string
	if opts.AuditLog {
		policy := filepath.Join(dir, "audit-policy.yaml")
		if err := os.WriteFile(policy, []byte(auditPolicy), 0o600); err != nil {
			return nil, fmt.Errorf("localcluster: %w", err)
		}
		auditLogPath = filepath.Join(dir, "audit.log")
		args = append(args, "--audit-policy-file="+policy, "--audit-log-path="+auditLogPath,
			"--audit-log-format=json", "--audit-log-mode=blocking")
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
	if len(opts.Env) > 0 {
		cmd.Env = append(os.Environ(), opts.Env...)
	}
	cmd.SysProcAttr = childProcAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("localcluster: start kube-apiserver: %w", err)
	}
	s := &KubeAPIServer{
		LogPath:      logPath,
		AuditLogPath: auditLogPath,
		Dir:          dir,
		cmd:          cmd,
		exited:       make(chan struct{}),
		tokens:       tokens,
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

// adminName is the user name of the administrator, the member of system:masters.
const adminName = "admin"

// auditPolicy logs every request at the Metadata level, from the stage at
// which it is answered.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
`

// writeAuthFiles writes the service account signing key and a token file
// with one member of system:masters and users to dir, and returns that
// member's token (token if it is not empty, else a new random one) and the
// token of each user by name.
func writeAuthFiles(dir, token string, users []User) (string, map[string]string, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return "", nil, fmt.Errorf("localcluster: service account key: %w", err)
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	if err := os.WriteFile(filepath.Join(dir, "sa.key"), keyPEM, 0o600); err != nil {
		return "", nil, fmt.Errorf("localcluster: %w", err)
	}
	newToken := func() string {
		var b [16]byte
		rand.Read(b[:])
		return hex.EncodeToString(b[:])
	}
	// A line of the token file: token,user,uid,"group1,group2".
	if token == "" {
		token = newToken()
	}
	lines := token + "," + adminName + "," + adminName + `,"system:masters"` + "\n"
	tokens := make(map[string]string, len(users))
	for _, u := range users {
		t := newToken()
		tokens[u.Name] = t
		line := t + "," + u.Name + "," + u.Name
		if len(u.Groups) > 0 {
			line += "," + strconv.Quote(strings.Join(u.Groups, ","))
		}
		lines += line + "\n"
	}
	if err := os.WriteFile(filepath.Join(dir, "tokens.csv"), []byte(lines), 0o600); err != nil {
		return "", nil, fmt.Errorf("localcluster: %w", err)
	}
	return token, tokens, nil
}

// UserConfig returns a new config that reaches the server as the user of
// [KubeAPIServerOptions.Users] named name, with its token, or nil if there is
// no such user.
func (s *KubeAPIServer) UserConfig(name string) *rest.Config {
	token, ok := s.tokens[name]
	if !ok {
		return nil
	}
	c := rest.CopyConfig(s.Config)
	c.BearerToken = token
	return c
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
