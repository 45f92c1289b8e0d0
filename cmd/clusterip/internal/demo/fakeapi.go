package demo

import (
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// fakeWatchBuffer is how many events a watcher of the fake clientset holds before it panics.
const fakeWatchBuffer = 10000

// widenFakeWatchers raises the buffer of the fake clientset's watchers, once per process.
var widenFakeWatchers = sync.OnceFunc(func() {
	if watch.DefaultChanSize < fakeWatchBuffer {
		watch.DefaultChanSize = fakeWatchBuffer
	}
})

// newFakeClient returns client-go's fake clientset, whose watches are drained into an unbounded
// queue. The fake's own watchers hold watch.DefaultChanSize events (100) and panic when a
// consumer falls further behind, which informers do on a busy machine while thousands of Services
// come and go: the relay takes them off at once, and the buffer is raised to fakeWatchBuffer (a
// process-wide setting of package watch, which only fake watchers read) for the moments the relay
// waits for a CPU.
func newFakeClient() *fake.Clientset {
	widenFakeWatchers()
	c := fake.NewSimpleClientset() //nolint:staticcheck // the simple fake needs no apply configurations
	tracker := c.Tracker()
	c.PrependWatchReactor("*", func(action k8stesting.Action) (bool, watch.Interface, error) {
		var opts metav1.ListOptions
		if wa, ok := action.(k8stesting.WatchActionImpl); ok {
			opts = wa.ListOptions
		}
		w, err := tracker.Watch(action.GetResource(), action.GetNamespace(), opts)
		if err != nil {
			return false, nil, err
		}
		return true, newQueueWatcher(w), nil
	})
	return c
}

// queueWatcher relays the events of another watcher through a queue without bound, so that the
// other never waits on its consumer. It is safe for concurrent use.
type queueWatcher struct {
	src  watch.Interface
	out  chan watch.Event
	stop chan struct{}
	once sync.Once
}

func newQueueWatcher(src watch.Interface) *queueWatcher {
	q := &queueWatcher{src: src, out: make(chan watch.Event), stop: make(chan struct{})}
	go q.relay()
	return q
}

func (q *queueWatcher) relay() {
	defer close(q.out)
	in := q.src.ResultChan()
	var queue []watch.Event
	for in != nil || len(queue) > 0 {
		var out chan watch.Event
		var next watch.Event
		if len(queue) > 0 {
			out, next = q.out, queue[0]
		}
		select {
		case e, ok := <-in:
			if !ok {
				in = nil
				continue
			}
			queue = append(queue, e)
		case out <- next:
			queue[0] = watch.Event{}
			queue = queue[1:]
		case <-q.stop:
			return
		}
	}
}

// Stop stops the watcher it relays and the relay.
func (q *queueWatcher) Stop() {
	q.once.Do(func() {
		close(q.stop)
		q.src.Stop()
	})
}

// ResultChan returns the relayed events.
func (q *queueWatcher) ResultChan() <-chan watch.Event { return q.out }
