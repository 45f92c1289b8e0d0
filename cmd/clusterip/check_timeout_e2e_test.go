package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

// blackhole is a TCP proxy to an upstream address that can start swallowing everything: once
// swallow is called, it forwards nothing more in either direction on any connection, old or new,
// but keeps every connection open and accepts new ones. It stands for an etcd that accepts the
// connection and stops answering (a hung process, a partition that drops packets).
type blackhole struct {
	ln       net.Listener
	upstream string
	swallowd atomic.Bool
	mu       sync.Mutex
	conns    []net.Conn
}

func newBlackhole(t *testing.T, upstream string) *blackhole {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackhole{ln: ln, upstream: upstream}
	go b.serve()
	t.Cleanup(b.close)
	return b
}

// URL returns the proxy's address as an etcd endpoint.
func (b *blackhole) URL() string { return "http://" + b.ln.Addr().String() }

// swallow makes the proxy forward nothing from now on.
func (b *blackhole) swallow() { b.swallowd.Store(true) }

func (b *blackhole) serve() {
	for {
		c, err := b.ln.Accept()
		if err != nil {
			return
		}
		b.track(c)
		if b.swallowd.Load() || b.upstream == "" {
			go func() { _, _ = io.Copy(io.Discard, c) }()
			continue
		}
		up, err := net.Dial("tcp", b.upstream)
		if err != nil {
			c.Close()
			continue
		}
		b.track(up)
		go b.pipe(up, c)
		go b.pipe(c, up)
	}
}

// pipe copies from src to dst until the proxy swallows, then reads and drops what src sends.
func (b *blackhole) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !b.swallowd.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (b *blackhole) track(c net.Conn) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.conns = append(b.conns, c)
}

func (b *blackhole) close() {
	b.ln.Close()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range b.conns {
		c.Close()
	}
}

// apiProxy is an HTTPS reverse proxy to a kube-apiserver that calls hook before it forwards a
// request for which match reports true: a way to act between two of check's API calls.
func apiProxy(t *testing.T, api *testenv.KubeAPIServer, match func(*http.Request) bool, hook func()) string {
	t.Helper()
	target, err := url.Parse(api.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // a test server's self-signed certificate
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if match(r) {
			hook()
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// clusteripWithin runs the built command with args like clusterip, but kills it after d and
// fails t if it had not exited by then: the command must never wait forever.
func clusteripWithin(t *testing.T, d time.Duration, args ...string) (result, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	took := time.Since(start)
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Fatalf("clusterip %q still running after %v: it waits forever\nstderr:\n%s", args, d, r.stderr)
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		t.Fatalf("run clusterip %q: %v", args, err)
	}
	return r, took
}

// lastLine returns the last line of s.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
	return lines[len(lines)-1]
}

// TestCheckGivesUpOnAnEtcdThatStopsAnswering runs check against a real kube-apiserver v1.33 and
// its etcd, reaching etcd through a proxy that stops forwarding anything once check has listed
// the IPAddress objects (audit) or the Services (repair): etcd accepted the connection and
// answered check's first reads, then went silent. check must exit 2 within its bounds, with a
// line saying etcd did not answer, never wait forever (before, the audit's bitmap read and
// repair's compare-and-swaps ran with no deadline).
func TestCheckGivesUpOnAnEtcdThatStopsAnswering(t *testing.T) {
	t.Parallel()
	e := testenv.NewEtcd(t)
	api := testenv.NewKubeAPIServer(t, e, testenv.KubeAPIServerOptions{ServiceClusterIPRange: "10.96.0.0/24"})
	testenv.WaitForKubernetesService(t, api.Client)
	etcdAddr := strings.TrimPrefix(strings.TrimPrefix(e.Endpoints()[0], "http://"), "https://")

	tests := []struct {
		name    string
		args    []string // the verb and flags after --kubeconfig F --etcd-servers P -o json
		swallow string   // the API path after whose first GET the proxy swallows
		within  time.Duration
		oneLine bool   // stderr is one line (no progress lines)
		stderr  string // what stderr must say besides
		seed    func(t *testing.T)
	}{
		{name: "the audit's bitmap read, with the default --request-timeout", swallow: "/apis/networking.k8s.io/v1/ipaddresses",
			args: []string{"check"}, within: time.Minute, oneLine: true},
		{name: "repair's compare-and-swap", swallow: "/api/v1/services",
			args:   []string{"repair", "--leak-grace", "0", "--request-timeout", "2s"},
			within: time.Minute, stderr: "clusterip: repair pass 1 failed, trying again in 1s: repair: write the bitmap of 10.96.0.0/24",
			// A stale bit, which one pass clears with a compare-and-swap.
			seed: func(t *testing.T) {
				setBit(t, etcdstore.New(e.TestClient(t), etcdstore.ServiceIPsKey("")), "10.96.0.201")
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.seed != nil {
				tt.seed(t)
			}
			proxy := newBlackhole(t, etcdAddr)
			var once sync.Once
			host := apiProxy(t, api,
				func(r *http.Request) bool { return r.Method == http.MethodGet && r.URL.Path == tt.swallow },
				func() { once.Do(proxy.swallow) })
			args := slices.Concat(tt.args[:1], []string{"--kubeconfig", writeKubeconfigWithToken(t, host, api.Config.BearerToken),
				"--etcd-servers", proxy.URL(), "-o", "json"}, tt.args[1:])
			r, took := clusteripWithin(t, tt.within, args...)
			if r.code != exitCouldNotRun {
				t.Errorf("exit %d after %v, want %d\nstdout:\n%s\nstderr:\n%s", r.code, took, exitCouldNotRun, r.stdout, r.stderr)
			}
			if got := lastLine(r.stderr); !strings.HasPrefix(got, "clusterip: ") || !strings.Contains(got, "etcd did not answer within") {
				t.Errorf("last stderr line %q, want \"clusterip: ...\" saying etcd did not answer", got)
			}
			if !strings.Contains(r.stderr, tt.stderr) {
				t.Errorf("stderr %q, want it to contain %q", r.stderr, tt.stderr)
			}
			if tt.oneLine && strings.Count(strings.TrimSuffix(r.stderr, "\n"), "\n") != 0 {
				t.Errorf("stderr %q, want one line", r.stderr)
			}
			t.Logf("exit %d after %v: %s", r.code, took.Round(100*time.Millisecond), lastLine(r.stderr))
		})
	}

	t.Run("a listener that accepts and never answers", func(t *testing.T) {
		silent := newBlackhole(t, "")
		host := apiProxy(t, api, func(*http.Request) bool { return false }, func() {})
		r, took := clusteripWithin(t, time.Minute, "check", "--kubeconfig", writeKubeconfigWithToken(t, host, api.Config.BearerToken),
			"--etcd-servers", silent.URL(), "--request-timeout", "2s")
		if r.code != exitCouldNotRun || !strings.Contains(r.stderr, "unreachable") || strings.Count(strings.TrimSuffix(r.stderr, "\n"), "\n") != 0 {
			t.Errorf("exit %d after %v, stderr %q; want %d and one line saying etcd is unreachable", r.code, took, r.stderr, exitCouldNotRun)
		}
	})
}

// TestCheckRepairTimeoutBoundsTheWholeRepair gives repair a leak it may not free for an hour
// (an IPAddress just created for a Service that does not exist): it would pass and wait for the
// hour; --repair-timeout 3s makes it give up, exit 2, and say why. It waits for the kubernetes
// Service first: kube-apiserver creates that Service's IPAddress before the Service, so a repair
// pass in between would count a second leak.
func TestCheckRepairTimeoutBoundsTheWholeRepair(t *testing.T) {
	t.Parallel()
	e := testenv.NewEtcd(t)
	api := testenv.NewKubeAPIServer(t, e, testenv.KubeAPIServerOptions{ServiceClusterIPRange: "10.96.0.0/24"})
	waitForDefaultServiceCIDR(t, api.Client)
	ctx := t.Context()
	if _, err := api.Client.NetworkingV1().IPAddresses().Create(ctx, leakedIPAddress("10.96.0.200"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("seed a leaked IPAddress: %v", err)
	}
	kubeconfig := writeKubeconfigWithToken(t, api.Config.Host, api.Config.BearerToken)
	r, took := clusteripWithin(t, time.Minute, "repair", "--kubeconfig", kubeconfig, "--etcd-servers", strings.Join(e.Endpoints(), ","),
		"--leak-grace", "1h", "--repair-timeout", "3s")
	if r.code != exitCouldNotRun {
		t.Errorf("exit %d after %v, want %d\nstderr:\n%s", r.code, took, exitCouldNotRun, r.stderr)
	}
	want := "clusterip: repair did not finish within --repair-timeout 3s"
	if got := lastLine(r.stderr); !strings.HasPrefix(got, want) || !strings.Contains(got, "1 leak held off") {
		t.Errorf("last stderr line %q, want it to start %q and count the leak held off", got, want)
	}
	if took > 30*time.Second {
		t.Errorf("repair --repair-timeout 3s took %v", took)
	}
}

// TestCheckGivesUpOnASilentAPIServer points check at a listener that accepts connections and
// never answers: the API client's --request-timeout bounds the first call, and check exits 2
// with one line naming the API server.
func TestCheckGivesUpOnASilentAPIServer(t *testing.T) {
	silent := newBlackhole(t, "")
	server := "https://" + strings.TrimPrefix(silent.URL(), "http://")
	r, took := clusteripWithin(t, time.Minute, "check", "--kubeconfig", writeKubeconfig(t, server), "--request-timeout", "2s")
	if r.code != exitCouldNotRun || !strings.HasPrefix(r.stderr, "clusterip: API server at "+server) ||
		strings.Count(strings.TrimSuffix(r.stderr, "\n"), "\n") != 0 {
		t.Errorf("exit %d after %v, stderr %q; want %d and one line naming the API server", r.code, took, r.stderr, exitCouldNotRun)
	}
}
