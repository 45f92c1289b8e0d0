package ipaddress

import (
	"context"
	"net/netip"
	"strconv"
	"sync"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	networkingv1informers "k8s.io/client-go/informers/networking/v1"
	"k8s.io/client-go/kubernetes"
	networkingv1listers "k8s.io/client-go/listers/networking/v1"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"github.com/kube-ipam/clusterip/internal/fakeclient"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

// fixture is an Allocator on the client-go fake clientset with a started informer.
type fixture struct {
	a       *Allocator
	client  *fakeclient.Clientset
	factory informers.SharedInformerFactory
}

// fixtureOptions adjusts newFixture.
type fixtureOptions struct {
	noStart bool // do not start the informer
	// simple builds the fake clientset without field management (see fakeclient.Options).
	simple bool
	// gate, if set, gives the Allocator an informer of its own whose watch events pass through
	// gate (see eventGate) instead of the factory's.
	gate *eventGate
}

// newFixture builds an Allocator for cidr on a fake clientset and waits until it is ready.
func newFixture(t testing.TB, cidr netip.Prefix, fo fixtureOptions, opts ...Option) *fixture {
	t.Helper()
	client := fakeclient.New(fakeclient.Options{FieldManaged: !fo.simple})
	factory := informers.NewSharedInformerFactory(client, 0)
	var inf networkingv1informers.IPAddressInformer = factory.Networking().V1().IPAddresses()
	if fo.gate != nil {
		inf = newGatedInformer(client, fo.gate)
	}
	a, err := New(cidr, client, inf, opts...)
	if err != nil {
		t.Fatalf("New(%v) = %v", cidr, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		a.Close()
		cancel()
		factory.Shutdown()
	})
	f := &fixture{a: a, client: client, factory: factory}
	if fo.noStart {
		return f
	}
	factory.Start(ctx.Done())
	if fo.gate != nil {
		go inf.Informer().RunWithContext(ctx)
	}
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			t.Fatalf("informer %v did not sync", typ)
		}
	}
	client.WaitWatching(t, "ipaddresses")
	if !cache.WaitForCacheSync(ctx.Done(), a.reg.HasSynced) {
		t.Fatal("handler did not sync")
	}
	return f
}

// createActions returns the IPAddress create actions the fake clientset saw, dry runs excluded.
func createActions(c *fakeclient.Clientset) []k8stesting.CreateAction {
	var out []k8stesting.CreateAction
	for _, act := range c.Actions() {
		if ca, ok := act.(k8stesting.CreateAction); ok && act.GetResource().Resource == "ipaddresses" && !fakeclient.IsDryRun(act) {
			out = append(out, ca)
		}
	}
	return out
}

// ipAddressObject returns an IPAddress as another writer would create it.
func ipAddressObject(name string, uid types.UID, rv uint64) *networkingv1.IPAddress {
	return &networkingv1.IPAddress{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: uid, ResourceVersion: rvString(rv)},
		Spec: networkingv1.IPAddressSpec{ParentRef: &networkingv1.ParentReference{
			Resource: "services", Namespace: "default", Name: "other",
		}},
	}
}

func alreadyExists(name string) error {
	return apierrors.NewAlreadyExists(schema.GroupResource{Group: networkingv1.GroupName, Resource: "ipaddresses"}, name)
}

// newInformer returns an IPAddress informer of a new factory on client, not started.
func newInformer(client kubernetes.Interface) networkingv1informers.IPAddressInformer {
	return informers.NewSharedInformerFactory(client, 0).Networking().V1().IPAddresses()
}

func rvString(rv uint64) string {
	if rv == 0 {
		return ""
	}
	return strconv.FormatUint(rv, 10)
}

// eventGate holds back the watch events of the informers built with newGatedInformer, to play an
// informer that runs behind the API server: while it is held, the events of the IPAddresses in
// its prefix wait in order until Let lets some through or Open lets all. It starts open. It is
// safe for concurrent use.
type eventGate struct {
	prefix netip.Prefix         // the gated addresses; other events pass at once
	lag    func() time.Duration // if set, each gated event waits this long first

	mu    sync.Mutex
	cond  *sync.Cond
	held  bool
	allow int
}

func newEventGate(prefix netip.Prefix) *eventGate {
	g := &eventGate{prefix: prefix}
	g.cond = sync.NewCond(&g.mu)
	return g
}

// gates reports whether ev is an event of an IPAddress in g's prefix.
func (g *eventGate) gates(ev watch.Event) bool {
	ipa, ok := ev.Object.(*networkingv1.IPAddress)
	if !ok {
		return false
	}
	ip, err := netip.ParseAddr(ipa.Name)
	return err == nil && g.prefix.Contains(ip)
}

// Hold holds back the events from now on.
func (g *eventGate) Hold() {
	g.mu.Lock()
	g.held, g.allow = true, 0
	g.mu.Unlock()
}

// Let lets n more held events through.
func (g *eventGate) Let(n int) {
	g.mu.Lock()
	g.allow += n
	g.mu.Unlock()
	g.cond.Broadcast()
}

// Open lets every event through from now on.
func (g *eventGate) Open() {
	g.mu.Lock()
	g.held = false
	g.mu.Unlock()
	g.cond.Broadcast()
}

// pass blocks until one event may go through, or stop is closed; it reports whether it may.
func (g *eventGate) pass(stop <-chan struct{}) bool {
	if g.lag != nil {
		select {
		case <-time.After(g.lag()):
		case <-stop:
			return false
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for g.held && g.allow == 0 {
		select {
		case <-stop:
			return false
		default:
		}
		g.cond.Wait()
	}
	if g.held {
		g.allow--
	}
	return true
}

// wrap returns w with its events passed through g.
func (g *eventGate) wrap(w watch.Interface) watch.Interface {
	gw := &gatedWatch{in: w, out: make(chan watch.Event), stop: make(chan struct{})}
	go func() {
		defer close(gw.out)
		for ev := range w.ResultChan() {
			if g.gates(ev) && !g.pass(gw.stop) {
				return
			}
			select {
			case gw.out <- ev:
			case <-gw.stop:
				return
			}
		}
	}()
	go func() {
		// Wake pass when the watch stops, so that its goroutine ends.
		<-gw.stop
		g.cond.Broadcast()
	}()
	return gw
}

type gatedWatch struct {
	in   watch.Interface
	out  chan watch.Event
	stop chan struct{}
	once sync.Once
}

func (w *gatedWatch) ResultChan() <-chan watch.Event { return w.out }

func (w *gatedWatch) Stop() {
	w.once.Do(func() {
		close(w.stop)
		w.in.Stop()
	})
}

// gatedInformer is an IPAddress informer on client whose watch events pass through a gate.
type gatedInformer struct{ informer cache.SharedIndexInformer }

func newGatedInformer(client kubernetes.Interface, g *eventGate) *gatedInformer {
	ips := client.NetworkingV1().IPAddresses()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return ips.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			w, err := ips.Watch(ctx, o)
			if err != nil {
				return nil, err
			}
			return g.wrap(w), nil
		},
	}
	inf := cache.NewSharedIndexInformer(lw, &networkingv1.IPAddress{}, 0, cache.Indexers{})
	return &gatedInformer{informer: inf}
}

func (g *gatedInformer) Informer() cache.SharedIndexInformer { return g.informer }

func (g *gatedInformer) Lister() networkingv1listers.IPAddressLister {
	return networkingv1listers.NewIPAddressLister(g.informer.GetIndexer())
}

// handled returns the number of informer events a's handler has taken.
func handled(a *Allocator) uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.events
}

// letOne lets one held event through g and waits until a's handler has taken it.
func letOne(t testing.TB, g *eventGate, a *Allocator) {
	t.Helper()
	n := handled(a)
	g.Let(1)
	testenv.WaitFor(t, "the handler to take the event let through", func() bool { return handled(a) > n })
}
