package localcluster

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

// NewFakeClient returns client-go's fake clientset, the in-memory stand-in for kube-apiserver of
// the demo and the bench, whose watches are drained into an unbounded queue (see RelayWatch). The
// fake's own watchers hold watch.DefaultChanSize events (100) and panic when a consumer falls
// further behind, which informers do on a busy machine while thousands of objects come and go:
// the relay takes them off at once, and the buffer is raised to fakeWatchBuffer (a
// process-wide setting of package watch, which only fake watchers read) for the moments the relay
// waits for a CPU.
func NewFakeClient() *fake.Clientset {
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
		return true, RelayWatch(w), nil
	})
	return c
}
