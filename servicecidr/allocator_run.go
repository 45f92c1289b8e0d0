package servicecidr

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/kube-ipam/clusterip/internal/informerutil"
)

// Run watches ServiceCIDRs and keeps the per-CIDR allocators in step with them until ctx is done,
// then returns nil. It returns an error at once if the Allocator was already started. The
// informers must be started by their factory; until the ServiceCIDR informer has synced, Run
// only waits.
//
// Run does not close the Allocator: call Close when done with it.
func (a *Allocator) Run(ctx context.Context) error {
	if !a.started.CompareAndSwap(false, true) {
		return errors.New("servicecidr: Allocator.Run called twice")
	}
	logger := klog.FromContext(ctx).WithValues("controller", "servicecidr-allocator", "family", a.family)
	ctx = klog.NewContext(ctx, logger)

	a.queue = workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "servicecidr_allocator_" + string(a.family)},
	)
	defer a.queue.ShutDown()

	reg, err := a.cidrs.AddEventHandler(a.handlers(logger))
	if err != nil {
		if ctx.Err() != nil {
			return nil // done before it started: the informer stopped with ctx
		}
		return fmt.Errorf("servicecidr: watch ServiceCIDRs: %w", err)
	}
	defer func() {
		if err := a.cidrs.RemoveEventHandler(reg); err != nil {
			logger.Error(err, "Removing the ServiceCIDR event handler")
		}
	}()

	logger.Info("Starting")
	defer logger.Info("Stopped")
	if !cache.WaitForNamedCacheSyncWithContext(ctx, reg.HasSynced) {
		return nil // ctx is done
	}
	a.queue.Add(syncAllKey)

	informerutil.RunWorkers(ctx, 1, a.queue, a.processNext)
	return nil
}

// processNext syncs the next key; it returns false once the queue is shut down.
func (a *Allocator) processNext(ctx context.Context) bool {
	return informerutil.ProcessNext(ctx, a.queue,
		func(ctx context.Context, _ string) error { return a.syncAll(ctx) },
		func(ctx context.Context, key string, err error) {
			klog.FromContext(ctx).Error(err, "Syncing ServiceCIDRs, will retry", "requeues", a.queue.NumRequeues(key))
		})
}
