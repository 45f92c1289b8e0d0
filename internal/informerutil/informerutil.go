// Package informerutil holds small helpers for client-go informer event handlers, shared by the
// controllers of the library.
package informerutil

import (
	"context"
	"sync"

	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// ObjectFrom returns the object of type T that an informer passed to an event handler: obj
// itself or, for a delete whose final state the informer missed, the object inside the
// cache.DeletedFinalStateUnknown tombstone. It reports false if that object is not a T.
func ObjectFrom[T any](obj any) (T, bool) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	t, ok := obj.(T)
	return t, ok
}

// RunWorkers runs n goroutines (at least one) that each call next until it reports false,
// shuts queue down once ctx is done, and returns when every worker has returned. next should
// report false once queue is shut down, as a controller's processNext does when Get says quit.
func RunWorkers(ctx context.Context, n int, queue interface{ ShutDown() }, next func(context.Context) bool) {
	var wg sync.WaitGroup
	for range max(n, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next(ctx) {
			}
		}()
	}
	<-ctx.Done()
	queue.ShutDown()
	wg.Wait()
}

// ProcessNext takes the next key from queue and syncs it, the level-based step of a controller's
// worker: on success it forgets the key's rate-limit history; on failure it calls onError (to log)
// and adds the key back rate-limited. It marks the key done either way, and reports false once
// queue is shut down, so that a worker can run `for ProcessNext(...) {}`.
func ProcessNext[T comparable](ctx context.Context, queue workqueue.TypedRateLimitingInterface[T], sync func(context.Context, T) error, onError func(context.Context, T, error)) bool {
	key, quit := queue.Get()
	if quit {
		return false
	}
	defer queue.Done(key)
	if err := sync(ctx, key); err != nil {
		onError(ctx, key, err)
		queue.AddRateLimited(key)
		return true
	}
	queue.Forget(key)
	return true
}
