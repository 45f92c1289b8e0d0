// Package fakeclient builds the client-go fake clientset the unit tests of this module use, with
// the few API server behaviours the allocators depend on added: every created IPAddress gets a UID
// and an increasing resourceVersion, a dry-run create of an IPAddress persists nothing, watches
// never overflow, a watch that asks for initial events gets them and the initial-events-end
// bookmark (a streaming list, as client-go's WatchListClient does), and a test can wait until an
// informer watches.
//
// ServiceCIDRs get the API server's optimistic concurrency: a resourceVersion on every write, a
// Conflict for an update that carries an older one, and a status update that changes the status
// only. Without it a controller's update from a stale cache silently erases a newer write (such
// as a deletionTimestamp), which a real API server refuses.
//
// The fake still validates nothing but a watch's options, keeps no resourceVersion on other
// objects and ignores delete preconditions: what depends on those is tested against a real
// kube-apiserver (see testenv).
// Tests only: it imports testing, and no package the clusterip command links may import it.
package fakeclient

import (
	"context"
	"fmt"
	"slices"
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
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"github.com/kube-ipam/clusterip/internal/localcluster"
	"github.com/kube-ipam/clusterip/internal/testenv"
)

// Options adjusts New. The zero Options builds an empty NewSimpleClientset.
type Options struct {
	// Objects are in the tracker from the start.
	Objects []runtime.Object
	// FieldManaged builds the clientset with fake.NewClientset, whose tracker does field
	// management, instead of the deprecated fake.NewSimpleClientset. It builds a REST mapper on
	// every create (about 2.5 ms), so tests that create many objects leave it off.
	FieldManaged bool
}

// Clientset is a fake clientset with the behaviours of the package doc. Use it wherever a
// kubernetes.Interface is wanted; its embedded *fake.Clientset gives the tracker, the recorded
// actions and reactors. It is safe for concurrent use.
type Clientset struct {
	*fake.Clientset

	mu       sync.Mutex // guards watchers and watching
	watchers []*watch.RaceFreeFakeWatcher
	watching map[string]int // resource → watches started on it
}

// New returns a Clientset built as o says.
//
// The fake's own watch channels hold 100 events and panic when full, which a busy test under the
// race detector reaches before an informer drains them: here every watch is drained into an
// unbounded queue, and every write first waits until no watch has more than half a channel
// pending (the fake runs one action at a time, so that bounds the backlog). The fake also loses
// what is written between an informer's list and its watch, so tests wait with [Clientset.WaitWatching]
// until their informers watch. A watch with SendInitialEvents is answered as
// [localcluster.WatchTracker] says, its bookmark at the latest resourceVersion given to an
// IPAddress ("0" before any).
func New(o Options) *Clientset {
	c := &Clientset{watching: map[string]int{}}
	if o.FieldManaged {
		c.Clientset = fake.NewClientset(o.Objects...)
	} else {
		c.Clientset = fake.NewSimpleClientset(o.Objects...) //nolint:staticcheck // NewClientset needs apply configurations we do not use
	}
	tracker := c.Tracker()
	var rv atomic.Uint64
	c.PrependWatchReactor("*", func(action k8stesting.Action) (bool, watch.Interface, error) {
		w, relayed, err := localcluster.WatchTracker(tracker, action, strconv.FormatUint(rv.Load(), 10))
		if err != nil {
			return true, nil, err
		}
		c.mu.Lock()
		if rf, ok := w.(*watch.RaceFreeFakeWatcher); ok {
			c.watchers = append(c.watchers, rf)
		}
		c.watching[action.GetResource().Resource]++
		c.mu.Unlock()
		return true, relayed, nil
	})
	// Like the API server, give every created IPAddress a UID and an increasing resourceVersion:
	// the ipaddress allocator orders informer events against its own writes with it. A dry run
	// is answered as the API server answers it, without persisting (the fake ignores DryRun).
	c.PrependReactor("create", "ipaddresses", func(action k8stesting.Action) (bool, runtime.Object, error) {
		obj := action.(k8stesting.CreateAction).GetObject().(*networkingv1.IPAddress)
		if IsDryRun(action) {
			if _, err := tracker.Get(action.GetResource(), "", obj.Name); err == nil {
				return true, nil, apierrors.NewAlreadyExists(schema.GroupResource{Group: networkingv1.GroupName, Resource: "ipaddresses"}, obj.Name)
			}
			return true, obj.DeepCopy(), nil
		}
		n := rv.Add(1)
		obj.UID = types.UID("uid-" + strconv.FormatUint(n, 10))
		obj.ResourceVersion = strconv.FormatUint(n, 10)
		return false, nil, nil
	})
	serviceCIDRs := networkingv1.SchemeGroupVersion.WithResource("servicecidrs")
	c.PrependReactor("create", "servicecidrs", func(action k8stesting.Action) (bool, runtime.Object, error) {
		obj := action.(k8stesting.CreateAction).GetObject().(*networkingv1.ServiceCIDR)
		obj.ResourceVersion = strconv.FormatUint(rv.Add(1), 10)
		return false, nil, nil
	})
	c.PrependReactor("update", "servicecidrs", func(action k8stesting.Action) (bool, runtime.Object, error) {
		obj := action.(k8stesting.UpdateAction).GetObject().(*networkingv1.ServiceCIDR)
		stored, err := tracker.Get(serviceCIDRs, "", obj.Name)
		if err != nil {
			return true, nil, err
		}
		old := stored.(*networkingv1.ServiceCIDR)
		if obj.ResourceVersion != "" && obj.ResourceVersion != old.ResourceVersion {
			return true, nil, apierrors.NewConflict(serviceCIDRs.GroupResource(), obj.Name,
				fmt.Errorf("the object has been modified; please apply your changes to the latest version and try again"))
		}
		updated := obj.DeepCopy()
		if action.GetSubresource() == "status" {
			updated = old.DeepCopy()
			updated.Status = *obj.Status.DeepCopy()
		}
		updated.ResourceVersion = strconv.FormatUint(rv.Add(1), 10)
		if err := tracker.Update(serviceCIDRs, updated, ""); err != nil {
			return true, nil, err
		}
		return true, updated.DeepCopy(), nil
	})
	c.PrependReactor("*", "*", func(action k8stesting.Action) (bool, runtime.Object, error) {
		switch action.GetVerb() {
		case "create", "update", "patch", "delete", "delete-collection":
		default:
			return false, nil, nil
		}
		c.mu.Lock()
		ws := slices.Clone(c.watchers)
		c.mu.Unlock()
		for _, w := range ws {
			for !w.IsStopped() && len(w.ResultChan()) > int(watch.DefaultChanSize)/2 {
				time.Sleep(100 * time.Microsecond)
			}
		}
		return false, nil, nil
	})
	return c
}

// Watching returns the number of watches started on resource (such as "ipaddresses").
func (c *Clientset) Watching(resource string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.watching[resource]
}

// WaitWatching waits until c has a watch on each of resources, failing t after testenv.WaitFor's
// bound.
func (c *Clientset) WaitWatching(t testing.TB, resources ...string) {
	t.Helper()
	for _, r := range resources {
		testenv.WaitFor(t, "a watch on "+r, func() bool { return c.Watching(r) > 0 })
	}
}

// IsWatchListSemanticsUnSupported reports false: c answers streaming lists. client-go v0.35's
// fake clientset reports true, which turns WatchListClient off for informers built on it (the
// reflector asks the clientset through cache.ToListWatcherWithWatchListSemantics); c overrides it
// so that informers on c take the streaming list, as they do on a real API server. Older
// client-go releases do not ask.
func (c *Clientset) IsWatchListSemanticsUnSupported() bool { return false }

// IsDryRun reports whether action is a create with DryRun set.
func IsDryRun(action k8stesting.Action) bool {
	ca, ok := action.(k8stesting.CreateActionImpl)
	return ok && len(ca.CreateOptions.DryRun) > 0
}

// probeIP names the IPAddress WaitShowsNewIPAddresses creates: an address of TEST-NET-1 (RFC
// 5737), in no range of the tests.
const probeIP = "192.0.2.1"

// WaitShowsNewIPAddresses waits until inf, an IPAddress informer on client, shows an IPAddress
// created after the call, and then deletes it: for any fake clientset, such as client-go's own,
// which loses what is written between an informer's list and its watch and whose watches
// [Clientset.WaitWatching] cannot count. It creates the probe IPAddress 192.0.2.1 again until
// inf shows it, failing t after testenv.WaitFor's bound.
func WaitShowsNewIPAddresses(t testing.TB, client kubernetes.Interface, inf cache.SharedIndexInformer) {
	t.Helper()
	ctx := context.Background()
	ips := client.NetworkingV1().IPAddresses()
	probe := &networkingv1.IPAddress{
		ObjectMeta: metav1.ObjectMeta{Name: probeIP},
		Spec:       networkingv1.IPAddressSpec{ParentRef: &networkingv1.ParentReference{Resource: "services", Namespace: "default", Name: "probe"}},
	}
	testenv.WaitFor(t, "the IPAddress informer to show an object created now", func() bool {
		if err := ips.Delete(ctx, probeIP, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatalf("delete the probe IPAddress: %v", err)
		}
		if _, err := ips.Create(ctx, probe, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create the probe IPAddress: %v", err)
		}
		for range 20 {
			if _, ok, _ := inf.GetIndexer().GetByKey(probeIP); ok {
				return true
			}
			time.Sleep(5 * time.Millisecond)
		}
		return false
	})
	if err := ips.Delete(ctx, probeIP, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete the probe IPAddress: %v", err)
	}
}
