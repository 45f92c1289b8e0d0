package ipaddress

import (
	"context"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
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
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
)

// fixture is an Allocator on the client-go fake clientset with a started informer.
type fixture struct {
	a       *Allocator
	client  *fake.Clientset
	factory informers.SharedInformerFactory
}

// fixtureOptions adjusts newFixture.
type fixtureOptions struct {
	noStart bool // do not start the informer
	// simple uses the deprecated NewSimpleClientset, whose tracker does no field management; the
	// field-managed one of NewClientset builds a REST mapper on every create (~2.5 ms).
	simple bool
}

// newFakeClient returns a fake clientset that, like the API server, gives every created IPAddress a
// UID and an increasing resourceVersion, and whose IPAddress watch reports when it is established
// (the fake drops events sent before that).
func newFakeClient(t testing.TB, simple ...bool) (*fake.Clientset, <-chan struct{}) {
	t.Helper()
	client := fake.NewClientset()
	if len(simple) > 0 && simple[0] {
		client = fake.NewSimpleClientset() // deprecated, but see fixtureOptions.simple
	}
	var rv atomic.Uint64
	client.PrependReactor("create", "ipaddresses", func(action k8stesting.Action) (bool, runtime.Object, error) {
		ca := action.(k8stesting.CreateAction)
		if isDryRun(action) {
			// The fake ignores DryRun; answer as the API server does, without persisting.
			obj := ca.GetObject().DeepCopyObject()
			if _, err := client.Tracker().Get(action.GetResource(), "", obj.(*networkingv1.IPAddress).Name); err == nil {
				return true, nil, alreadyExists(obj.(*networkingv1.IPAddress).Name)
			}
			return true, obj, nil
		}
		obj := ca.GetObject().(*networkingv1.IPAddress)
		n := rv.Add(1)
		obj.UID = types.UID("uid-" + strconv.FormatUint(n, 10))
		obj.ResourceVersion = strconv.FormatUint(n, 10)
		return false, nil, nil
	})
	watching := make(chan struct{})
	var once sync.Once
	client.PrependWatchReactor("ipaddresses", func(action k8stesting.Action) (bool, watch.Interface, error) {
		w, err := client.Tracker().Watch(action.GetResource(), action.GetNamespace())
		if err != nil {
			return true, nil, err
		}
		once.Do(func() { close(watching) })
		return true, w, nil
	})
	return client, watching
}

// newFixture builds an Allocator for cidr on a fake clientset and waits until it is ready.
func newFixture(t testing.TB, cidr netip.Prefix, fo fixtureOptions, opts ...Option) *fixture {
	t.Helper()
	client, watching := newFakeClient(t, fo.simple)
	factory := informers.NewSharedInformerFactory(client, 0)
	a, err := New(cidr, client, factory.Networking().V1().IPAddresses(), opts...)
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
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			t.Fatalf("informer %v did not sync", typ)
		}
	}
	select {
	case <-watching:
	case <-time.After(30 * time.Second):
		t.Fatal("IPAddress watch not established")
	}
	if !cache.WaitForCacheSync(ctx.Done(), a.reg.HasSynced) {
		t.Fatal("handler did not sync")
	}
	return f
}

// createActions returns the IPAddress create actions the fake clientset saw, dry runs excluded.
func createActions(c *fake.Clientset) []k8stesting.CreateAction {
	var out []k8stesting.CreateAction
	for _, act := range c.Actions() {
		if ca, ok := act.(k8stesting.CreateAction); ok && act.GetResource().Resource == "ipaddresses" && !isDryRun(act) {
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

// isDryRun reports whether action is a create with DryRun set.
func isDryRun(action k8stesting.Action) bool {
	ca, ok := action.(k8stesting.CreateActionImpl)
	return ok && len(ca.CreateOptions.DryRun) > 0
}

// newInformer returns an IPAddress informer of a new factory on client, not started.
func newInformer(client *fake.Clientset) networkingv1informers.IPAddressInformer {
	return informers.NewSharedInformerFactory(client, 0).Networking().V1().IPAddresses()
}

func rvString(rv uint64) string {
	if rv == 0 {
		return ""
	}
	return strconv.FormatUint(rv, 10)
}
