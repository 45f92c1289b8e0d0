package localcluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// etcdConfig is the configuration of one etcd member, as package embedded of the nested module
// internal/localcluster/etcdserver reads it: from the etcd server program's argument, or from an
// [EtcdStarter]'s.
type etcdConfig struct {
	Name                string
	Dir                 string
	TickMs              uint
	ElectionMs          uint
	UnsafeNoFsync       bool
	ClientURL, PeerURL  string
	InitialCluster      string         `json:",omitempty"`
	InitialClusterToken string         `json:",omitempty"`
	ClientTLS           *etcdServerTLS `json:",omitempty"`
}

// etcdServerTLS is the TLS of a member's client port, as the etcd server reads it.
type etcdServerTLS struct{ CertFile, KeyFile, CAFile string }

// An EtcdStarter starts one etcd member in this process, instead of the child process that runs
// the binary of [EtcdBinary]. config is the member's configuration as JSON, which
// Start of package embedded in the nested module internal/localcluster/etcdserver reads; an
// EtcdStarter should pass it on unchanged, as the clusterip command's does (which is why that
// command needs no clone of the repository to start etcd). An error because a port is taken
// should say "address already in use", so that [StartEtcd] tries other ports.
type EtcdStarter func(config []byte) (EtcdServer, error)

// EtcdServer is an etcd member that an [EtcdStarter] started in this process.
type EtcdServer interface {
	// Ready is closed once the member serves clients.
	Ready() <-chan struct{}
	// Done is closed once the member has stopped, by Close or by a failure.
	Done() <-chan struct{}
	// Err returns why the member stopped: nil while it runs and after Close.
	Err() error
	// Close stops the member and returns once it has stopped.
	Close()
}

// etcdMember is one running etcd member: a child process (etcdProcess) or a server in this
// process (inProcessEtcd).
type etcdMember interface {
	// waitReady waits until the member serves clients, for at most timeout. It does not stop
	// the member on failure.
	waitReady(ctx context.Context, timeout time.Duration) error
	// running reports whether the member has not stopped.
	running() bool
	// stop stops the member and returns once it has stopped.
	stop()
}

// startEtcdMember starts a member with cfg: in this process with start if it is not nil, else
// as a child process (see launchEtcd).
func startEtcdMember(ctx context.Context, cfg etcdConfig, start EtcdStarter) (etcdMember, error) {
	if start == nil {
		p, err := launchEtcd(ctx, cfg)
		if err != nil {
			return nil, err // not a typed nil in the interface
		}
		return p, nil
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("localcluster: etcd config: %w", err)
	}
	srv, err := start(raw)
	if err != nil {
		return nil, fmt.Errorf("localcluster: start etcd in process: %w", err)
	}
	return inProcessEtcd{srv}, nil
}

// inProcessEtcd is a member that an EtcdStarter started.
type inProcessEtcd struct{ srv EtcdServer }

func (m inProcessEtcd) waitReady(ctx context.Context, timeout time.Duration) error {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-m.srv.Ready():
		return nil
	case <-m.srv.Done():
		return fmt.Errorf("etcd stopped: %v", m.srv.Err())
	case <-timer.C:
		return fmt.Errorf("etcd not ready after %v", timeout)
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (m inProcessEtcd) running() bool {
	select {
	case <-m.srv.Done():
		return false
	default:
		return true
	}
}

func (m inProcessEtcd) stop() { m.srv.Close() }

// etcdStopTimeout bounds how long a member has to close after SIGTERM before it is killed.
const etcdStopTimeout = 10 * time.Second

// etcdProcess is one etcd member running as a child process of this one.
type etcdProcess struct {
	cmd    *exec.Cmd
	ready  chan struct{} // closed when the member prints that it serves clients
	exited chan struct{} // closed when the process has exited and its output is read
	stderr syncBuffer
}

// launchEtcd starts the etcd server binary with cfg. The kernel kills the child if this process
// dies first (see childProcAttr), so a killed test leaves no etcd behind.
func launchEtcd(ctx context.Context, cfg etcdConfig) (*etcdProcess, error) {
	bin, err := EtcdBinary(ctx)
	if err != nil {
		return nil, err
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("localcluster: etcd config: %w", err)
	}
	p := &etcdProcess{ready: make(chan struct{}), exited: make(chan struct{})}
	p.cmd = exec.Command(bin, string(raw))
	p.cmd.SysProcAttr = childProcAttr()
	p.cmd.Stdout = &readyWriter{ready: p.ready}
	p.cmd.Stderr = &p.stderr
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("localcluster: start etcd %s: %w", bin, err)
	}
	go func() {
		p.cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// waitReady waits until p serves clients, for at most timeout. It does not stop p on failure.
func (p *etcdProcess) waitReady(ctx context.Context, timeout time.Duration) error {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-p.ready:
		return nil
	case <-p.exited:
		return fmt.Errorf("etcd exited (%v): %s", p.cmd.ProcessState, strings.TrimSpace(p.stderr.String()))
	case <-timer.C:
		return fmt.Errorf("etcd not ready after %v", timeout)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// running reports whether p has not exited.
func (p *etcdProcess) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// stop asks p to close with SIGTERM, kills it if it has not exited within etcdStopTimeout, and
// waits until it has exited.
func (p *etcdProcess) stop() {
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		p.cmd.Process.Kill()
	}
	select {
	case <-p.exited:
		return
	case <-time.After(etcdStopTimeout):
	}
	p.cmd.Process.Kill()
	<-p.exited
}

// kill kills p and waits until it has exited.
func (p *etcdProcess) kill() {
	p.cmd.Process.Kill()
	<-p.exited
}

// readyWriter takes the etcd server's stdout and closes ready at its "ready" line.
type readyWriter struct {
	ready chan struct{}
	buf   []byte
	done  bool
}

func (w *readyWriter) Write(b []byte) (int, error) {
	if w.done {
		return len(b), nil
	}
	w.buf = append(w.buf, b...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(b), nil
		}
		if strings.TrimSpace(string(w.buf[:i])) == "ready" {
			w.done, w.buf = true, nil
			close(w.ready)
			return len(b), nil
		}
		w.buf = w.buf[i+1:]
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent use, keeping the last 64 KiB written.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Write(p)
	if over := b.buf.Len() - 64<<10; over > 0 {
		b.buf.Next(over)
	}
	return len(p), nil
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
