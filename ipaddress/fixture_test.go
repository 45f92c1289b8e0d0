package ipaddress

import (
	"context"
	"net/netip"
	"strconv"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	networkingv1informers "k8s.io/client-go/informers/networking/v1"
	"k8s.io/client-go/kubernetes"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"github.com/kube-ipam/clusterip/internal/fakeclient"
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
}

// newFixture builds an Allocator for cidr on a fake clientset and waits until it is ready.
func newFixture(t testing.TB, cidr netip.Prefix, fo fixtureOptions, opts ...Option) *fixture {
	t.Helper()
	client := fakeclient.New(fakeclient.Options{FieldManaged: !fo.simple})
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
