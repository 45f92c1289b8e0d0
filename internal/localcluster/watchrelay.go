package localcluster

import (
	"sync"

	"k8s.io/apimachinery/pkg/watch"
)

// RelayWatch returns a watch.Interface that relays the events of w through a queue without bound,
// so that w never waits on the consumer. It is for client-go's fake clientset, the in-memory
// stand-in for kube-apiserver: its watchers hold watch.DefaultChanSize events (100) and panic
// when a consumer falls further behind, which an informer does on a busy machine. Stop stops w
// and the relay; ResultChan is closed when w's is drained or Stop is called. The result is safe
// for concurrent use.
func RelayWatch(w watch.Interface) watch.Interface { return relayAfter(nil, w) }

// relayAfter is RelayWatch sending the events of first before those of w.
func relayAfter(first []watch.Event, w watch.Interface) watch.Interface {
	r := &relayWatch{in: w, out: make(chan watch.Event), stop: make(chan struct{})}
	go r.run(first)
	return r
}

// relayWatch is the watch.Interface of RelayWatch.
type relayWatch struct {
	in   watch.Interface
	out  chan watch.Event
	stop chan struct{}
	once sync.Once
}

func (r *relayWatch) run(queue []watch.Event) {
	defer close(r.out)
	in := r.in.ResultChan()
	for in != nil || len(queue) > 0 {
		var (
			out  chan watch.Event
			next watch.Event
		)
		if len(queue) > 0 {
			out, next = r.out, queue[0]
		}
		select {
		case ev, ok := <-in:
			if !ok {
				in = nil
				continue
			}
			queue = append(queue, ev)
		case out <- next:
			queue[0] = watch.Event{} // let the object go
			queue = queue[1:]
		case <-r.stop:
			return
		}
	}
}

// ResultChan returns the relayed events.
func (r *relayWatch) ResultChan() <-chan watch.Event { return r.out }

// Stop stops the relayed watch and the relay.
func (r *relayWatch) Stop() {
	r.once.Do(func() {
		close(r.stop)
		r.in.Stop()
	})
}
