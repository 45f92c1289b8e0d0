package localcluster

import (
	"sync"

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
// the demo and the bench, whose watches are drained into an unbounded queue (see RelayWatch) and
// answer a streaming list (see WatchTracker; the fake keeps no resourceVersions). The
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
		_, w, err := WatchTracker(tracker, action, "")
		if err != nil {
			return true, nil, err
		}
		return true, w, nil
	})
	return c
}
