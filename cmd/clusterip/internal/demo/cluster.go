package demo

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/cmd/clusterip/internal/embedetcd"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/localcluster"
)

// cluster is what the demo runs against: an etcd for the bitmaps and an API server (a real
// kube-apiserver, or client-go's fake clientset) for Services, ServiceCIDRs and IPAddress objects.
type cluster struct {
	endpoints []string
	etcdDesc  string
	apiDesc   string
	client    kubernetes.Interface
	// real is true when client talks to a real kube-apiserver.
	real bool
	// forget, if not nil, drops what the client keeps of the calls made so far: client-go's fake
	// clientset records every action, which would grow by gigabytes in a long run.
	forget  func()
	closers []func()
}

func (c *cluster) Close() {
	for i := len(c.closers) - 1; i >= 0; i-- {
		c.closers[i]()
	}
}

// apiserverEtcdPrefix is the --etcd-prefix of the real kube-apiserver: it keeps its objects, and
// its own bitmaps, apart from the bitmaps of the demo's allocators.
const apiserverEtcdPrefix = "/kube-apiserver"

// startCluster starts or reaches the components opts asks for.
func startCluster(ctx context.Context, opts *Options) (_ *cluster, err error) {
	c := &cluster{}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	var etcd *localcluster.Etcd
	if len(opts.EtcdEndpoints) > 0 {
		c.endpoints = opts.EtcdEndpoints
		c.etcdDesc = "etcd at " + strings.Join(c.endpoints, ",")
	} else {
		etcd, err = embedetcd.StartEtcd(ctx, localcluster.EtcdOptions{})
		if err != nil {
			return nil, fmt.Errorf("start embedded etcd: %w", err)
		}
		c.closers = append(c.closers, func() { etcd.Close() })
		c.endpoints = etcd.Endpoints()
		c.etcdDesc = "embedded etcd at " + c.endpoints[0]
	}
	if err := probe(ctx, c.endpoints); err != nil {
		return nil, err
	}
	bin := opts.KubeAPIServer
	if bin == "" && !opts.FakeAPI && etcd != nil {
		bin = cachedKubeAPIServer()
	}
	if bin == "" || opts.FakeAPI {
		fc := localcluster.NewFakeClient()
		c.client, c.forget = fc, fc.ClearActions
		c.apiDesc = "client-go's fake clientset (in memory; no kube-apiserver: pass --kube-apiserver PATH for a real one)"
		return c, nil
	}
	if etcd == nil {
		return nil, errors.New("demo: --kube-apiserver needs the embedded etcd; leave out --etcd")
	}
	ranges := make([]string, len(opts.Ranges))
	for i, r := range opts.Ranges {
		ranges[i] = r.String()
	}
	srv, err := localcluster.StartKubeAPIServer(ctx, etcd, localcluster.KubeAPIServerOptions{
		Binary:                bin,
		ServiceClusterIPRange: strings.Join(ranges, ","),
		// Legacy mode: the server allocates every ClusterIP it stores in a bitmap of its own (at
		// its own prefix), so it refuses a Service whose ClusterIP another Service holds, and it
		// neither creates IPAddress objects nor repairs ours.
		FeatureGates: "MultiCIDRServiceAllocator=false",
		EtcdPrefix:   apiserverEtcdPrefix,
	})
	if err != nil {
		return nil, fmt.Errorf("start kube-apiserver %s: %w", bin, err)
	}
	c.closers = append(c.closers, func() { srv.Close() })
	c.client, c.real = srv.Client, true
	c.apiDesc = fmt.Sprintf("kube-apiserver %s (%s), Legacy mode, objects at etcd prefix %s", localcluster.KubeAPIServerVersion, bin, apiserverEtcdPrefix)
	// Its bootstrap controller creates the kubernetes Service, whose ClusterIP the demo's
	// allocators adopt.
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := c.client.CoreV1().Services(metav1.NamespaceDefault).Get(ctx, "kubernetes", metav1.GetOptions{})
		if err == nil {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("demo: kube-apiserver created no kubernetes Service: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return c, nil
}

// cachedKubeAPIServer returns the kube-apiserver binary the tests use if it is already there:
// $CLUSTERIP_KUBE_APISERVER, else the cached build in .cache/ of the repository this command was
// built or is run in. It never builds one, which takes minutes; it returns "" if there is none.
func cachedKubeAPIServer() string {
	if p := os.Getenv(localcluster.KubeAPIServerEnv); p != "" {
		if _, err := os.Stat(p); err == nil {
			return p
		}
		return ""
	}
	var dirs []string
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		dirs = append(dirs, filepath.Dir(file))
	}
	if wd, err := os.Getwd(); err == nil {
		dirs = append(dirs, wd)
	}
	for _, dir := range dirs {
		for ; ; dir = filepath.Dir(dir) {
			bin := filepath.Join(dir, ".cache", "kube-apiserver-"+localcluster.KubeAPIServerVersion, "kube-apiserver")
			if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
				if fi, err := os.Stat(bin); err == nil && fi.Mode().IsRegular() {
					return bin
				}
			}
			if filepath.Dir(dir) == dir {
				break
			}
		}
	}
	return ""
}

// member is one kube-apiserver of the cluster as the demo plays it: the allocators of one mode,
// with an etcd client of their own that counts compare-and-swap conflicts per bitmap key.
type member struct {
	name   string
	mode   featuregate.Mode
	allocs *clusterip.Allocators
	// conflicts counts failed compare-and-swaps per IP family, from the member's etcd client.
	conflicts map[corev1.IPFamily]*atomic.Uint64
	stop      func()
}

// newMember builds the allocators of mode as a kube-apiserver named name would, and starts what
// they need. It waits until they serve.
func newMember(ctx context.Context, name string, mode featuregate.Mode, c *cluster, opts *Options) (_ *member, err error) {
	m := &member{name: name, mode: mode, conflicts: map[corev1.IPFamily]*atomic.Uint64{}}
	// stop undoes what is set up, in reverse order: the background work first, then the
	// informers, the allocators and the etcd client.
	var (
		once           sync.Once
		etcd           *clientv3.Client
		factory        informers.SharedInformerFactory
		cancel         = func() {}
		wg             sync.WaitGroup
		factoryStarted bool
	)
	m.stop = func() {
		once.Do(func() {
			cancel()
			wg.Wait()
			if factoryStarted {
				factory.Shutdown()
			}
			if m.allocs != nil {
				m.allocs.Close()
			}
			if etcd != nil {
				etcd.Close()
			}
		})
	}
	defer func() {
		if err != nil {
			m.stop()
		}
	}()
	cfg := clusterip.Config{Mode: mode, Ranges: opts.Ranges}
	keys := map[string]corev1.IPFamily{}
	for i, r := range opts.Ranges {
		f := familyOf(r.Addr())
		m.conflicts[f] = new(atomic.Uint64)
		keys[bitmapKey(opts.Prefix, i)] = f
	}
	if mode != featuregate.IPAddressOnly {
		etcd, err = clientv3.New(clientv3.Config{Endpoints: c.endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			return nil, fmt.Errorf("etcd client: %w", err)
		}
		etcd.KV = &countingKV{KV: etcd.KV, keys: keys, conflicts: m.conflicts}
		cfg.Bitmaps = etcdstore.Stores{Client: etcd, Prefix: opts.Prefix}
	}
	if mode != featuregate.Legacy {
		factory = informers.NewSharedInformerFactory(c.client, 0)
		cfg.Client, cfg.Informers = c.client, factory
	}
	m.allocs, err = clusterip.New(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("%s (%s): %w", name, mode, err)
	}
	if mode == featuregate.Legacy {
		return m, nil
	}
	runCtx, cancelRun := context.WithCancel(context.WithoutCancel(ctx))
	cancel = cancelRun
	factory.Start(runCtx.Done())
	factoryStarted = true
	wg.Add(1)
	go func() {
		defer wg.Done()
		m.allocs.Run(runCtx)
	}()
	readyCtx, cancelReady := context.WithTimeout(ctx, 30*time.Second)
	defer cancelReady()
	if err = m.allocs.WaitReady(readyCtx); err != nil {
		return nil, fmt.Errorf("%s (%s): %w", name, mode, err)
	}
	return m, nil
}

// countingKV counts the transactions whose comparison failed: every such transaction of the
// bitmap store is a compare-and-swap that lost to another writer and is retried.
type countingKV struct {
	clientv3.KV
	keys      map[string]corev1.IPFamily
	conflicts map[corev1.IPFamily]*atomic.Uint64
}

func (k *countingKV) Txn(ctx context.Context) clientv3.Txn {
	return &countingTxn{Txn: k.KV.Txn(ctx), kv: k}
}

type countingTxn struct {
	clientv3.Txn
	kv  *countingKV
	key string
}

func (t *countingTxn) If(cs ...clientv3.Cmp) clientv3.Txn {
	for _, c := range cs {
		t.key = string(c.Key)
	}
	t.Txn = t.Txn.If(cs...)
	return t
}

func (t *countingTxn) Then(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Then(ops...); return t }
func (t *countingTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Else(ops...); return t }

func (t *countingTxn) Commit() (*clientv3.TxnResponse, error) {
	resp, err := t.Txn.Commit()
	if err == nil && !resp.Succeeded {
		if f, ok := t.kv.keys[t.key]; ok {
			t.kv.conflicts[f].Add(1)
		}
	}
	return resp, err
}

func familyOf(ip netip.Addr) corev1.IPFamily {
	if ip.Is4() {
		return corev1.IPv4Protocol
	}
	return corev1.IPv6Protocol
}
