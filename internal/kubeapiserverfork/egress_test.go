package kubeapiserverfork_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/localcluster"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

// connectProxy is an HTTP CONNECT proxy on a unix socket, as kube-apiserver's egress selector
// dials one (proxyProtocol HTTPConnect, transport uds): it sends every tunnel to target, whatever
// address the CONNECT names, and counts them.
type connectProxy struct {
	ln      net.Listener
	target  string
	tunnels atomic.Int64
	wg      sync.WaitGroup
}

// startConnectProxy starts a connectProxy to target on a new unix socket, and stops it when t
// finishes.
func startConnectProxy(t *testing.T, target string) *connectProxy {
	t.Helper()
	// Not t.TempDir(): a unix socket's path must stay within 108 bytes.
	dir, err := os.MkdirTemp("", "egress-")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", filepath.Join(dir, "etcd.sock"))
	if err != nil {
		t.Fatal(err)
	}
	p := &connectProxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() {
		ln.Close()
		p.wg.Wait()
		os.RemoveAll(dir)
	})
	return p
}

// serve accepts connections until the listener closes.
func (p *connectProxy) serve() {
	defer p.wg.Done()
	var conns sync.WaitGroup
	defer conns.Wait()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		conns.Add(1)
		go func() {
			defer conns.Done()
			p.tunnel(c)
		}()
	}
}

// tunnel answers one CONNECT request on c and then copies bytes both ways between c and the
// target until either side closes.
func (p *connectProxy) tunnel(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	if req.Method != http.MethodConnect {
		fmt.Fprint(c, "HTTP/1.1 405 Method Not Allowed\r\n\r\n")
		return
	}
	up, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		fmt.Fprint(c, "HTTP/1.1 502 Bad Gateway\r\n\r\n")
		return
	}
	defer up.Close()
	p.tunnels.Add(1)
	if _, err := fmt.Fprint(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	done := make(chan struct{})
	go func() {
		io.Copy(up, br) // what the client sent after its request, then the rest
		up.Close()
		close(done)
	}()
	io.Copy(c, up)
	c.Close()
	<-done
}

// etcdURLs are the client URLs a kube-apiserver is given in --etcd-servers.
type etcdURLs []string

// Endpoints implements localcluster.EtcdServers.
func (u etcdURLs) Endpoints() []string { return u }

// unreachable returns the etcd client URL endpoint with its host replaced by 127.0.0.2, where
// nothing listens on that port: etcd listens on 127.0.0.1 only, so the URL reaches it only
// through a proxy that sends the connection there.
func unreachable(t *testing.T, endpoint string) string {
	t.Helper()
	u, err := url.Parse(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = net.JoinHostPort("127.0.0.2", u.Port())
	return u.String()
}

// TestForkReachesEtcdThroughTheEgressSelector starts stock and the fork, in the modes that keep a
// bitmap, with an etcd that only the egress selector's HTTP CONNECT proxy reaches: each starts,
// allocates, and stores the bit of the address in the bitmap.
func TestForkReachesEtcdThroughTheEgressSelector(t *testing.T) {
	t.Parallel()
	fork, stock := forkBinary(t), stockBinary(t)
	if !slices.ContainsFunc(modeGates(t), func(mg modeGate) bool { return mg.mode != featuregate.IPAddressOnly }) {
		t.Skipf("kube-apiserver %s keeps no bitmap in any mode: the fork has no etcd client of its own", release())
	}
	for _, mg := range modeGates(t) {
		if mg.mode == featuregate.IPAddressOnly {
			continue // no bitmap, no etcd client of the fork's own
		}
		for _, side := range []struct{ name, bin string }{{"stock", stock}, {"fork", fork}} {
			t.Run(mg.name()+"/"+side.name, func(t *testing.T) {
				etcd := testenv.NewEtcd(t)
				direct := strings.TrimPrefix(etcd.Endpoints()[0], "http://")
				proxy := startConnectProxy(t, direct)
				config := filepath.Join(t.TempDir(), "egress.yaml")
				if err := os.WriteFile(config, []byte(fmt.Sprintf(`apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: etcd
  connection:
    proxyProtocol: HTTPConnect
    transport:
      uds:
        udsName: %s
`, proxy.ln.Addr().String())), 0o600); err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				s, err := localcluster.StartKubeAPIServer(ctx, etcdURLs{unreachable(t, etcd.Endpoints()[0])}, localcluster.KubeAPIServerOptions{
					Binary: side.bin, ServiceClusterIPRange: v4Range, FeatureGates: mg.gates,
					ExtraArgs: append(slices.Clip(mg.args), "--egress-selector-config-file="+config),
				})
				if err != nil {
					t.Fatalf("start %s with etcd behind the egress selector: %v", side.name, err)
				}
				t.Cleanup(func() { s.Close() })

				const ip = "10.96.0.30"
				createService(ctx, t, s, "through-egress", ip)
				snap, _, err := etcdstore.New(etcd.TestClient(t), etcdstore.DefaultServiceIPsKey).Get(ctx)
				if err != nil {
					t.Fatalf("read the bitmap: %v", err)
				}
				bm, err := bitmap.New(netip.MustParsePrefix(v4Range))
				if err != nil {
					t.Fatal(err)
				}
				if err := bm.Restore(snap); err != nil {
					t.Fatalf("restore the bitmap: %v", err)
				}
				if !bm.Has(netip.MustParseAddr(ip)) {
					t.Errorf("the bitmap does not hold %s after its Service's create (%s mode)", ip, mg.mode)
				}
				if proxy.tunnels.Load() == 0 {
					t.Errorf("no connection went through the egress proxy")
				}
			})
		}
	}
}
