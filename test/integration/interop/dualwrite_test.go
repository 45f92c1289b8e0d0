package interop

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"os"
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

	"github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/testenv"
	"github.com/kube-ipam/clusterip/test/integration/internal/clustertest"
)

// How an ambiguousProxy answers the next IPAddress create, after forwarding it to the API server.
const (
	answerPass     int32 = iota // the API server's own answer
	answer504                   // a 504 Timeout Status, as kube-apiserver's request timeout writes it
	answerDrop                  // the connection closed with no response
	answerDeadline              // no answer until the client gives up (its deadline)
	answerLost504               // a 504 without forwarding the create: nothing is stored
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
	if answer == answerLost504 {
		if obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(mustRead(r), nil, nil); err == nil {
			if ipa, ok := obj.(*networkingv1.IPAddress); ok {
				p.mu.Lock()
				p.hit = ipa.Name
				p.mu.Unlock()
			}
		}
		write504(w)
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
		write504(w)
	case answerDrop:
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
	case answerDeadline:
		<-r.Context().Done() // the client's deadline has passed and it has gone
	}
}

// write504 answers as kube-apiserver's request timeout does.
func write504(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusGatewayTimeout)
	fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Timeout: request did not complete within requested timeout - context deadline exceeded","reason":"Timeout","details":{},"code":504}`)
}

// mustRead returns the body of r, or nil if it cannot be read.
func mustRead(r *http.Request) []byte {
	b, _ := io.ReadAll(r.Body)
	return b
}

// Against the real kube-apiserver v1.33.13: an IPAddress create that the server stores but whose
// answer is a 504, a dropped connection or the caller's deadline never leaves the address without
// its bit. The allocation is confirmed by reading the object back; a Legacy allocator on the same
// bitmap and the kube-apiserver itself (in dual write) both refuse the address. A 504 for a create
// that was never stored fails the allocation and keeps the bit all the same, for repair to free.
func TestDualWriteAmbiguousCreateBesideKubeAPIServer(t *testing.T) {
	_, etcd, api := realCluster(t)
	proxy, proxied := newAmbiguousProxy(t, api.Config)
	a := clustertest.StartAllocators(t, clusterip.Config{Mode: featuregate.DualWrite, Ranges: []netip.Prefix{flagRange}, Bitmaps: etcdstore.Stores{Client: etcd}, Client: proxied})
	dw := a.For(corev1.IPv4Protocol)
	legacy := clustertest.StartAllocators(t, clusterip.Config{Mode: featuregate.Legacy, Ranges: []netip.Prefix{flagRange}, Bitmaps: etcdstore.Stores{Client: etcd}}).For(corev1.IPv4Protocol)
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
		{name: "AllocateNext: 504 without storing", answer: answerLost504},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			callCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			proxy.arm(tt.answer)
			var err error
			if tt.chosen != "" {
				err = dw.Allocate(callCtx, netip.MustParseAddr(tt.chosen), clustertest.Owner)
			} else {
				_, err = dw.AllocateNext(callCtx, clustertest.Owner)
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
			t.Logf("answer %d for IPAddress %s: error %v; %+v", tt.answer, ip, err, dw.(*clusterip.DualWriteAllocator).Stats())
			stored := tt.answer != answerLost504
			switch {
			case stored && err != nil:
				t.Errorf("the server stored the IPAddress of %s for the owner, yet the allocation failed: %v", ip, err)
			case !stored && err == nil:
				t.Errorf("the server never stored the IPAddress of %s, yet the allocation succeeded", ip)
			}
			_, gerr := api.Client.NetworkingV1().IPAddresses().Get(ctx, name, metav1.GetOptions{})
			if stored && gerr != nil || !stored && !apierrors.IsNotFound(gerr) {
				t.Fatalf("get IPAddress %s: %v, want it stored: %t", name, gerr, stored)
			}
			if bits := storedBits(t, etcd, etcdstore.DefaultServiceIPsKey); !slices.Contains(bits, ip) {
				t.Errorf("the bit of %s is clear after an ambiguous create (stored: %t)", ip, stored)
			}
			// A Legacy peer cannot take the address...
			if lerr := legacy.Allocate(ctx, ip, clustertest.Owner); !errors.Is(lerr, allocator.ErrAllocated) {
				t.Errorf("a Legacy allocator's Allocate(%s) = %v, want ErrAllocated", ip, lerr)
				if lerr == nil {
					defer legacy.Release(ctx, ip)
				}
			}
			// ...nor can the kube-apiserver in dual write.
			svc := testenv.ClusterIPService(fmt.Sprintf("ambiguous-%d", i), "")
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

// Against the real kube-apiserver v1.33.13 in its default dual write: its bitmap key is deleted,
// and while it creates Services at once (each allocated without a bit while the key is missing,
// as v1.33 does), our New bootstraps the bitmap. Afterwards every Service's address has its bit.
func TestDualWriteBootstrapBesideKubeAPIServerCreatingServices(t *testing.T) {
	const flag = "10.96.0.0/22"
	rg := netip.MustParsePrefix(flag)
	_, ec, api := clustertest.StartOwnCluster(t, flag)
	c := api.Client
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	key := etcdstore.ServiceIPsKey("/registry")
	if _, ok := clustertest.EtcdBits(t, ec, key, rg); !ok {
		t.Fatalf("no bitmap at %s: kube-apiserver has not created it", key)
	}
	if _, err := ec.Delete(ctx, key); err != nil {
		t.Fatalf("delete %s: %v", key, err)
	}

	var (
		mu       sync.Mutex
		services = map[string]netip.Addr{}
		created  atomic.Int64
		stop     = make(chan struct{})
		churned  = make(chan testenv.ChurnResult, 1)
	)
	go func() {
		churned <- testenv.ServiceChurn{Workers: 8, Stop: stop, Prefix: "bootstrap-race", Created: func(svc *corev1.Service) {
			mu.Lock()
			services[svc.Name] = netip.MustParseAddr(svc.Spec.ClusterIP)
			mu.Unlock()
			created.Add(1)
		}}.Run(ctx, t, c)
	}()
	testenv.WaitFor(t, "Services created while the bitmap key is missing", func() bool { return created.Load() >= 20 })
	before := created.Load()
	start := time.Now()
	clustertest.StartAllocators(t, clusterip.Config{Mode: featuregate.DualWrite, Ranges: []netip.Prefix{rg}, Bitmaps: etcdstore.Stores{Client: ec}, Client: c})
	took := time.Since(start)
	during := created.Load() - before
	time.Sleep(500 * time.Millisecond) // the kube-apiserver keeps creating, now with bits
	close(stop)
	failed := (<-churned).Failed

	bits, ok := clustertest.EtcdBits(t, ec, key, rg)
	if !ok {
		t.Fatalf("no bitmap at %s after New", key)
	}
	missing := 0
	for name, ip := range services {
		if !bits.Has(ip) {
			missing++
			t.Errorf("Service %s: %s has no bit", name, ip)
		}
	}
	log, _ := os.ReadFile(api.LogPath)
	fallbacks := strings.Count(string(log), "no IP address available on the old ClusterIP allocator")
	t.Logf("%d Services (%d before New, %d while New ran for %v, %d failed creates); %d without a bit; "+
		"the kube-apiserver logged %d allocations without a bit (\"no IP address available on the old ClusterIP allocator\")",
		len(services), before, during, took.Round(time.Millisecond), failed, missing, fallbacks)
	if fallbacks == 0 {
		t.Errorf("the kube-apiserver logged no allocation without a bit: the key was not missing while it allocated")
	}
}
