package servicecidr

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/internal/fakeclient"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

// waitTimeout bounds every wait of these tests for an informer or controller to catch up.
const waitTimeout = 30 * time.Second

var testOwner = allocator.Owner{Resource: "services", Namespace: "default", Name: "test"}

// webOwner is the Owner of a named Service, as a registry would pass it.
var webOwner = allocator.ServiceOwner(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: "web-uid"}})

// notReady marks sc with the condition Ready=False.
func notReady(sc *networkingv1.ServiceCIDR) *networkingv1.ServiceCIDR {
	sc.Status.Conditions = []metav1.Condition{{
		Type: networkingv1.ServiceCIDRConditionReady, Status: metav1.ConditionFalse,
		Reason: "Test", LastTransitionTime: metav1.Now(),
	}}
	return sc
}

// fixture is an Allocator (and, if asked, a LifecycleController) running against a client and
// informers on it.
type fixture struct {
	t         testing.TB
	ctx       context.Context
	client    kubernetes.Interface
	cidrInf   informers.SharedInformerFactory // ServiceCIDRs, only those labelled for the test
	ipInf     informers.SharedInformerFactory // IPAddresses, all of them
	alloc     *Allocator
	mem       *memFactory // nil: the default per-CIDR allocator
	lifecycle *LifecycleController
	label     string         // value of testLabel on the test's ServiceCIDRs; "" with no filter
	real      bool           // a real kube-apiserver, shared with other tests
	prefixes  []netip.Prefix // every prefix created through the fixture, for cleanup
}

// name returns the object name of the test's ServiceCIDR n: prefixed with the label on a shared
// server, where names are cluster-wide.
func (f *fixture) name(n string) string {
	if f.label == "" {
		return n
	}
	return f.label + "-" + n
}

// testLabel marks the ServiceCIDRs of one test on a shared kube-apiserver, whose informers see
// only those: each test sees its own ServiceCIDRs and not the apiserver's default one.
const testLabel = "servicecidr.test/name"

type fixtureConfig struct {
	family    corev1.IPFamily
	client    kubernetes.Interface // nil: a fake clientset holding objects
	objects   []runtime.Object
	mem       *memFactory // nil: the default per-CIDR allocator
	lifecycle *LifecycleOptions
	noRun     bool // build the Allocator but do not run it
	// blindLifecycleIPs gives the LifecycleController an IPAddress informer that shows none: one
	// on an empty fake clientset, or on a real server one whose label selector matches nothing.
	// It stands for a watch that lags behind the API server for the whole test.
	blindLifecycleIPs bool
	label             string // filter ServiceCIDRs on testLabel=label; objects are not labelled
	opts              []Option
}

// waitWatching waits until client, if it is a fakeclient.Clientset, has a watch on each resource.
func waitWatching(t testing.TB, client any, resources ...string) {
	t.Helper()
	if fc, ok := client.(*fakeclient.Clientset); ok {
		fc.WaitWatching(t, resources...)
	}
}

func newFixture(t testing.TB, cfg fixtureConfig) *fixture {
	t.Helper()
	if cfg.family == "" {
		cfg.family = corev1.IPv4Protocol
	}
	client := cfg.client
	if client == nil {
		client = fakeclient.New(fakeclient.Options{Objects: cfg.objects})
	}
	ctx := klog.NewContext(context.Background(), ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))) // logsOf reads the buffer
	ctx, cancel := context.WithCancel(ctx)
	var cidrOpts []informers.SharedInformerOption
	if cfg.label != "" {
		cidrOpts = append(cidrOpts, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = testLabel + "=" + cfg.label
		}))
	}
	cidrInf := informers.NewSharedInformerFactoryWithOptions(client, 0, cidrOpts...)
	ipInf := informers.NewSharedInformerFactory(client, 0)
	cidrs, ips := cidrInf.Networking().V1().ServiceCIDRs(), ipInf.Networking().V1().IPAddresses()
	opts := cfg.opts
	if cfg.mem != nil {
		opts = append(opts, withAllocatorFactory(cfg.mem.new))
	}
	a, err := New(cfg.family, client, cidrs, ips, opts...)
	if err != nil {
		t.Fatalf("New() = %v", err)
	}
	f := &fixture{t: t, ctx: ctx, client: client, cidrInf: cidrInf, ipInf: ipInf, alloc: a, mem: cfg.mem, label: cfg.label, real: cfg.client != nil}
	var blindInf informers.SharedInformerFactory
	if cfg.lifecycle != nil {
		lifecycleIPs := ips
		if cfg.blindLifecycleIPs {
			if f.real {
				blindInf = informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
					o.LabelSelector = "servicecidr.test/never=true"
				}))
			} else {
				blind := fakeclient.New(fakeclient.Options{})
				blindInf = informers.NewSharedInformerFactory(blind, 0)
				defer waitWatching(t, blind, "ipaddresses")
			}
			lifecycleIPs = blindInf.Networking().V1().IPAddresses()
		}
		if f.lifecycle, err = NewLifecycleController(client, cidrs, lifecycleIPs, *cfg.lifecycle); err != nil {
			t.Fatalf("NewLifecycleController() = %v", err)
		}
	}
	cidrInf.Start(ctx.Done())
	ipInf.Start(ctx.Done())
	if blindInf != nil {
		blindInf.Start(ctx.Done())
	}
	done := make(chan struct{}, 2)
	running := 0
	if !cfg.noRun {
		running++
		go func() {
			defer func() { done <- struct{}{} }()
			if err := a.Run(ctx); err != nil {
				t.Errorf("Allocator.Run() = %v", err)
			}
		}()
	}
	if f.lifecycle != nil {
		running++
		go func() {
			defer func() { done <- struct{}{} }()
			if err := f.lifecycle.Run(ctx, 2); err != nil {
				t.Errorf("LifecycleController.Run() = %v", err)
			}
		}()
	}
	waitWatching(t, client, "servicecidrs", "ipaddresses")
	t.Cleanup(func() {
		cancel()
		for range running {
			<-done
		}
		cidrInf.Shutdown()
		ipInf.Shutdown()
		if blindInf != nil {
			blindInf.Shutdown()
		}
		if err := a.Close(); err != nil {
			t.Errorf("Close() = %v", err)
		}
		if f.real {
			f.cleanup()
		}
	})
	return f
}

// cleanup removes from a shared server what the test left: its ServiceCIDRs (finalizers and all)
// and the IPAddresses in their prefixes.
func (f *fixture) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if f.label != "" {
		list, err := f.client.NetworkingV1().ServiceCIDRs().List(ctx, metav1.ListOptions{LabelSelector: testLabel + "=" + f.label})
		if err != nil {
			f.t.Errorf("cleanup: list ServiceCIDRs: %v", err)
			return
		}
		for _, sc := range list.Items {
			if len(sc.Finalizers) > 0 {
				sc.Finalizers = nil
				if _, err := f.client.NetworkingV1().ServiceCIDRs().Update(ctx, &sc, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
					f.t.Errorf("cleanup: remove finalizers of %s: %v", sc.Name, err)
				}
			}
			if err := f.client.NetworkingV1().ServiceCIDRs().Delete(ctx, sc.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				f.t.Errorf("cleanup: delete %s: %v", sc.Name, err)
			}
		}
	}
	ips, err := f.client.NetworkingV1().IPAddresses().List(ctx, metav1.ListOptions{})
	if err != nil {
		f.t.Errorf("cleanup: list IPAddresses: %v", err)
		return
	}
	names := make(chan string)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for name := range names {
				if err := f.client.NetworkingV1().IPAddresses().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
					f.t.Errorf("cleanup: delete IPAddress %s: %v", name, err)
				}
			}
		}()
	}
	for _, ipa := range ips.Items {
		ip, err := netip.ParseAddr(ipa.Name)
		if err == nil && slices.ContainsFunc(f.prefixes, func(p netip.Prefix) bool { return p.Contains(ip) }) {
			names <- ipa.Name
		}
	}
	close(names)
	wg.Wait()
}

func (f *fixture) create(sc *networkingv1.ServiceCIDR) {
	f.t.Helper()
	sc = sc.DeepCopy()
	sc.Name = f.name(sc.Name)
	if f.label != "" {
		if sc.Labels == nil {
			sc.Labels = map[string]string{}
		}
		sc.Labels[testLabel] = f.label
	}
	for _, s := range sc.Spec.CIDRs {
		f.prefixes = append(f.prefixes, netip.MustParsePrefix(s))
	}
	cond := sc.Status.Conditions
	created, err := f.client.NetworkingV1().ServiceCIDRs().Create(f.ctx, sc, metav1.CreateOptions{})
	if err != nil {
		f.t.Fatalf("create ServiceCIDR %s: %v", sc.Name, err)
	}
	if len(cond) > 0 && len(created.Status.Conditions) == 0 {
		// A real apiserver drops the status on create.
		created.Status.Conditions = cond
		if _, err := f.client.NetworkingV1().ServiceCIDRs().UpdateStatus(f.ctx, created, metav1.UpdateOptions{}); err != nil {
			f.t.Fatalf("set status of ServiceCIDR %s: %v", sc.Name, err)
		}
	}
}

func (f *fixture) delete(name string) {
	f.t.Helper()
	name = f.name(name)
	if err := f.client.NetworkingV1().ServiceCIDRs().Delete(f.ctx, name, metav1.DeleteOptions{}); err != nil {
		f.t.Fatalf("delete ServiceCIDR %s: %v", name, err)
	}
}

func (f *fixture) get(name string) *networkingv1.ServiceCIDR {
	f.t.Helper()
	name = f.name(name)
	sc, err := f.client.NetworkingV1().ServiceCIDRs().Get(f.ctx, name, metav1.GetOptions{})
	if err != nil {
		f.t.Fatalf("get ServiceCIDR %s: %v", name, err)
	}
	return sc
}

// waitReady waits until the Allocator allocates from exactly cidrs.
func (f *fixture) waitReady(cidrs ...string) {
	f.t.Helper()
	want := make([]netip.Prefix, len(cidrs))
	for i, s := range cidrs {
		want[i] = netip.MustParsePrefix(s)
	}
	slices.SortFunc(want, comparePrefix)
	var got []netip.Prefix
	testenv.WaitFor(f.t, "ready CIDRs "+stringsOf(want), func() bool {
		got = f.alloc.ReadyCIDRs()
		return slices.Equal(got, want)
	})
}

func stringsOf[T interface{ String() string }](xs []T) string {
	s := "["
	for i, x := range xs {
		if i > 0 {
			s += " "
		}
		s += x.String()
	}
	return s + "]"
}
