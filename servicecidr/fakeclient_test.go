package servicecidr

import (
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kube-ipam/clusterip/internal/testenv"
)

// newFakeClient returns a fake clientset holding objects whose watches do not overflow and whose
// IPAddresses get resourceVersions. The fake's
// own watch channels hold 100 events and panic when full, which a busy test under the race detector
// reaches before the informer drains them. Here every watch is drained into an unbounded queue,
// and every write first waits until no watch has more than half a channel pending (the fake runs
// one action at a time, so that bounds the backlog).
//
// The fake also loses what is written between an informer's list and its watch, so tests wait
// with waitWatching until the informers watch.
func newFakeClient(objects ...runtime.Object) *fake.Clientset {
	client := fake.NewSimpleClientset(objects...) //nolint:staticcheck // NewClientset needs apply configurations we do not use
	tracker := client.Tracker()
	var (
		mu       sync.Mutex
		watchers []*watch.RaceFreeFakeWatcher
	)
	watching := map[string]int{}
	fakeWatching.Store(client, func(resource string) int {
		mu.Lock()
		defer mu.Unlock()
		return watching[resource]
	})
	client.PrependWatchReactor("*", func(action k8stesting.Action) (bool, watch.Interface, error) {
		var opts metav1.ListOptions
		if wa, ok := action.(k8stesting.WatchActionImpl); ok {
			opts = wa.ListOptions
		}
		w, err := tracker.Watch(action.GetResource(), action.GetNamespace(), opts)
		if err != nil {
			return false, nil, err
		}
		mu.Lock()
		if rf, ok := w.(*watch.RaceFreeFakeWatcher); ok {
			watchers = append(watchers, rf)
		}
		watching[action.GetResource().Resource]++
		mu.Unlock()
		return true, newBufferedWatch(w), nil
	})
	// Like the API server, give every created IPAddress a UID and an increasing resourceVersion:
	// the ipaddress allocator orders informer events against its own writes with it.
	var rv atomic.Uint64
	client.PrependReactor("create", "ipaddresses", func(action k8stesting.Action) (bool, runtime.Object, error) {
		obj := action.(k8stesting.CreateAction).GetObject().(*networkingv1.IPAddress)
		n := rv.Add(1)
		obj.UID = types.UID("uid-" + strconv.FormatUint(n, 10))
		obj.ResourceVersion = strconv.FormatUint(n, 10)
		return false, nil, nil
	})
	client.PrependReactor("*", "*", func(action k8stesting.Action) (bool, runtime.Object, error) {
		switch action.GetVerb() {
		case "create", "update", "patch", "delete", "delete-collection":
		default:
			return false, nil, nil
		}
		mu.Lock()
		ws := slices.Clone(watchers)
		mu.Unlock()
		for _, w := range ws {
			for !w.IsStopped() && len(w.ResultChan()) > int(watch.DefaultChanSize)/2 {
				time.Sleep(100 * time.Microsecond)
			}
		}
		return false, nil, nil
	})
	return client
}

// fakeWatching maps each client of newFakeClient to a function that counts the watches started on a
// resource.
var fakeWatching sync.Map

// waitWatching waits until client, if it came from newFakeClient, has a watch on each resource.
func waitWatching(t testing.TB, client any, resources ...string) {
	t.Helper()
	v, ok := fakeWatching.Load(client)
	if !ok {
		return
	}
	count := v.(func(string) int)
	for _, r := range resources {
		testenv.WaitFor(t, "a watch on "+r, func() bool { return count(r) > 0 })
	}
}

// bufferedWatch drains a watch.Interface into an unbounded queue.
type bufferedWatch struct {
	in   watch.Interface
	out  chan watch.Event
	stop chan struct{}
	once sync.Once
}

func newBufferedWatch(in watch.Interface) *bufferedWatch {
	w := &bufferedWatch{in: in, out: make(chan watch.Event), stop: make(chan struct{})}
	go w.run()
	return w
}

func (w *bufferedWatch) run() {
	defer close(w.out)
	in := w.in.ResultChan()
	var queue []watch.Event
	for in != nil || len(queue) > 0 {
		var (
			out  chan watch.Event
			next watch.Event
		)
		if len(queue) > 0 {
			out, next = w.out, queue[0]
		}
		select {
		case ev, ok := <-in:
			if !ok {
				in = nil
				continue
			}
			queue = append(queue, ev)
		case out <- next:
			queue = queue[1:]
		case <-w.stop:
			return
		}
	}
}

func (w *bufferedWatch) ResultChan() <-chan watch.Event { return w.out }

func (w *bufferedWatch) Stop() {
	w.once.Do(func() {
		close(w.stop)
		w.in.Stop()
	})
}
