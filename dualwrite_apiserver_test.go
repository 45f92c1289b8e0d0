package clusterip

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
)

// How an ambiguousProxy answers the next IPAddress create, after forwarding it to the API server.
const (
	answerPass     int32 = iota // the API server's own answer
	answer504                   // a 504 Timeout Status, as kube-apiserver's request timeout writes it
	answerDrop                  // the connection closed with no response
	answerDeadline              // no answer until the client gives up (its deadline)
)

// ambiguousProxy is a loopback HTTP proxy in front of a kube-apiserver whose next IPAddress create
// is stored by the server and then answered ambiguously, as armed. Everything else passes through.
type ambiguousProxy struct {
	rp    *httputil.ReverseProxy
	armed atomic.Int32
	mu    sync.Mutex
	hit   string // the name of the IPAddress whose create was answered ambiguously
}

// newAmbiguousProxy starts a proxy to the API server of cfg and returns it with a client that
// reaches the server through it. Both stop when t ends.
func newAmbiguousProxy(t testing.TB, cfg *rest.Config) (*ambiguousProxy, kubernetes.Interface) {
	t.Helper()
	target, err := url.Parse(cfg.Host)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := rest.TransportFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := &ambiguousProxy{rp: &httputil.ReverseProxy{
		Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(target) },
		Transport:     rt,
		FlushInterval: -1, // watches stream
	}}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	c, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL, QPS: -1})
	if err != nil {
		t.Fatal(err)
	}
	return p, c
}

// arm makes the proxy answer the next IPAddress create as answer says.
func (p *ambiguousProxy) arm(answer int32) {
	p.mu.Lock()
	p.hit = ""
	p.mu.Unlock()
	p.armed.Store(answer)
}

// answered returns the name of the IPAddress whose create was answered ambiguously, or "".
func (p *ambiguousProxy) answered() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.hit
}

func (p *ambiguousProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/ipaddresses") {
		p.rp.ServeHTTP(w, r)
		return
	}
	answer := p.armed.Swap(answerPass)
	if answer == answerPass {
		p.rp.ServeHTTP(w, r)
		return
	}
	// Forward the create whatever becomes of the client's request, and keep the server's answer.
	rec := httptest.NewRecorder()
	out := r.Clone(context.WithoutCancel(r.Context()))
	out.Header.Del("Accept-Encoding")
	p.rp.ServeHTTP(rec, out)
	if rec.Code == http.StatusCreated {
		if obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(rec.Body.Bytes(), nil, nil); err == nil {
			if ipa, ok := obj.(*networkingv1.IPAddress); ok {
				p.mu.Lock()
				p.hit = ipa.Name
				p.mu.Unlock()
			}
		}
	}
	switch answer {
	case answer504:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusGatewayTimeout)
		fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Timeout: request did not complete within requested timeout - context deadline exceeded","reason":"Timeout","details":{},"code":504}`)
	case answerDrop:
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
	case answerDeadline:
		<-r.Context().Done() // the client's deadline has passed and it has gone
	}
}

// Against the real kube-apiserver v1.33.13: an IPAddress create that the server stores but whose
// answer is a 504, a dropped connection or the caller's deadline never leaves the address without
// its bit. The allocation is confirmed by reading the object back; a Legacy allocator on the same
// bitmap and the kube-apiserver itself (in dual write) both refuse the address.
func TestDualWriteAmbiguousCreateBesideKubeAPIServer(t *testing.T) {
	_, etcd, api := realCluster(t)
	proxy, proxied := newAmbiguousProxy(t, api.Config)
	a := startAllocatorsOf(t, Config{Mode: featuregate.DualWrite, Ranges: []netip.Prefix{flagRange}, Etcd: etcd, Client: proxied})
	dw := a.Family(corev1.IPv4Protocol)
	legacy := startAllocatorsOf(t, Config{Mode: featuregate.Legacy, Ranges: []netip.Prefix{flagRange}, Etcd: etcd}).Family(corev1.IPv4Protocol)
	ctx := context.Background()
	tests := []struct {
		name   string
		answer int32
		chosen string // Allocate of this address, else AllocateNext
	}{
		{name: "AllocateNext: 504 after storing", answer: answer504},
		{name: "AllocateNext: connection dropped after storing", answer: answerDrop},
		{name: "AllocateNext: caller's deadline after storing", answer: answerDeadline},
		{name: "Allocate: 504 after storing", answer: answer504, chosen: "10.96.0.9"},
		{name: "Allocate: caller's deadline after storing", answer: answerDeadline, chosen: "10.96.0.10"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			callCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			proxy.arm(tt.answer)
			var err error
			if tt.chosen != "" {
				err = dw.Allocate(callCtx, netip.MustParseAddr(tt.chosen), testOwner)
			} else {
				_, err = dw.AllocateNext(callCtx, testOwner)
			}
			name := proxy.answered()
			if name == "" {
				t.Fatalf("no IPAddress create was stored and answered ambiguously (err %v)", err)
			}
			ip := netip.MustParseAddr(name)
			defer func() {
				if err := dw.Release(ctx, ip); err != nil {
					t.Errorf("Release(%v) = %v", ip, err)
				}
			}()
			t.Logf("answer %d for IPAddress %s: error %v; %+v", tt.answer, ip, err, dw.(*DualWriteAllocator).Stats())
			if err != nil {
				t.Errorf("the server stored the IPAddress of %s for the owner, yet the allocation failed: %v", ip, err)
			}
			if _, gerr := api.Client.NetworkingV1().IPAddresses().Get(ctx, name, metav1.GetOptions{}); gerr != nil {
				t.Fatalf("get IPAddress %s: %v", name, gerr)
			}
			if bits := storedBits(t, etcd, etcdstore.DefaultServiceIPsKey); !slices.Contains(bits, ip) {
				t.Errorf("the IPAddress %s exists, but its bit is clear", ip)
			}
			// A Legacy peer cannot take the address...
			if lerr := legacy.Allocate(ctx, ip, testOwner); !errors.Is(lerr, allocator.ErrAllocated) {
				t.Errorf("a Legacy allocator's Allocate(%s) = %v, want ErrAllocated", ip, lerr)
				if lerr == nil {
					defer legacy.Release(ctx, ip)
				}
			}
			// ...nor can the kube-apiserver in dual write.
			svc := clusterIPService(fmt.Sprintf("ambiguous-%d", i))
			svc.Spec.ClusterIP = ip.String()
			if _, serr := api.Client.CoreV1().Services(metav1.NamespaceDefault).Create(ctx, svc, metav1.CreateOptions{}); !apierrors.IsInvalid(serr) {
				t.Errorf("a Service asking for %s: %v, want 422 Invalid", ip, serr)
				if serr == nil {
					defer deleteServices(t, api.Client, []string{svc.Name})
				}
			}
		})
	}
}
