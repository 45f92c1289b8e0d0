package servicecidr

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"

	"github.com/kube-ipam/clusterip/allocator"
)

// waitTimeout bounds every wait of these tests for an informer or controller to catch up.
const waitTimeout = 30 * time.Second

var testOwner = allocator.Owner{Resource: "services", Namespace: "default", Name: "test"}

func serviceCIDR(name string, cidrs ...string) *networkingv1.ServiceCIDR {
	return &networkingv1.ServiceCIDR{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       networkingv1.ServiceCIDRSpec{CIDRs: cidrs},
	}
}

// notReady marks sc with the condition Ready=False.
func notReady(sc *networkingv1.ServiceCIDR) *networkingv1.ServiceCIDR {
	sc.Status.Conditions = []metav1.Condition{{
		Type: networkingv1.ServiceCIDRConditionReady, Status: metav1.ConditionFalse,
		Reason: "Test", LastTransitionTime: metav1.Now(),
	}}
	return sc
}

func ipAddress(ip string) *networkingv1.IPAddress {
	return &networkingv1.IPAddress{
		ObjectMeta: metav1.ObjectMeta{Name: ip},
		Spec: networkingv1.IPAddressSpec{ParentRef: &networkingv1.ParentReference{
			Resource: "services", Namespace: "default", Name: "test",
		}},
	}
}

// fixture is an Allocator (and, if asked, a LifecycleController) running against a client and
// informers on it.
type fixture struct {
	t         *testing.T
	ctx       context.Context
	client    kubernetes.Interface
	factory   informers.SharedInformerFactory
	alloc     *Allocator
	mem       *memFactory // nil: the default per-CIDR allocator
	lifecycle *LifecycleController
}

type fixtureConfig struct {
	family    corev1.IPFamily
	client    kubernetes.Interface // nil: a fake clientset holding objects
	objects   []runtime.Object
	mem       *memFactory // nil: the default per-CIDR allocator
	lifecycle *LifecycleOptions
	noRun     bool // build the Allocator but do not run it
}

func newFixture(t *testing.T, cfg fixtureConfig) *fixture {
	t.Helper()
	if cfg.family == "" {
		cfg.family = corev1.IPv4Protocol
	}
	client := cfg.client
	if client == nil {
		client = fake.NewSimpleClientset(cfg.objects...) //nolint:staticcheck // NewClientset needs apply configurations we do not use
	}
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	factory := informers.NewSharedInformerFactory(client, 0)
	cidrs, ips := factory.Networking().V1().ServiceCIDRs(), factory.Networking().V1().IPAddresses()
	var opts []Option
	if cfg.mem != nil {
		opts = append(opts, withAllocatorFactory(cfg.mem.new))
	}
	a, err := New(cfg.family, client, cidrs, ips, opts...)
	if err != nil {
		t.Fatalf("New() = %v", err)
	}
	f := &fixture{t: t, ctx: ctx, client: client, factory: factory, alloc: a, mem: cfg.mem}
	if cfg.lifecycle != nil {
		f.lifecycle = NewLifecycleController(client, cidrs, ips, *cfg.lifecycle)
	}
	factory.Start(ctx.Done())
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
	t.Cleanup(func() {
		cancel()
		for range running {
			<-done
		}
		factory.Shutdown()
		if err := a.Close(); err != nil {
			t.Errorf("Close() = %v", err)
		}
	})
	return f
}

func (f *fixture) create(sc *networkingv1.ServiceCIDR) {
	f.t.Helper()
	if _, err := f.client.NetworkingV1().ServiceCIDRs().Create(f.ctx, sc, metav1.CreateOptions{}); err != nil {
		f.t.Fatalf("create ServiceCIDR %s: %v", sc.Name, err)
	}
}

func (f *fixture) delete(name string) {
	f.t.Helper()
	if err := f.client.NetworkingV1().ServiceCIDRs().Delete(f.ctx, name, metav1.DeleteOptions{}); err != nil {
		f.t.Fatalf("delete ServiceCIDR %s: %v", name, err)
	}
}

func (f *fixture) get(name string) *networkingv1.ServiceCIDR {
	f.t.Helper()
	sc, err := f.client.NetworkingV1().ServiceCIDRs().Get(f.ctx, name, metav1.GetOptions{})
	if err != nil {
		f.t.Fatalf("get ServiceCIDR %s: %v", name, err)
	}
	return sc
}

// waitFor polls cond until it holds, failing the test after waitTimeout.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", waitTimeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
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
	waitFor(f.t, "ready CIDRs "+stringsOf(want), func() bool {
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

func prefixesContaining(ps []netip.Prefix, ip netip.Addr) bool {
	return slices.ContainsFunc(ps, func(p netip.Prefix) bool { return usable(p, ip) })
}
