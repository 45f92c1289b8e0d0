package informerutil

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

func TestObjectFrom(t *testing.T) {
	sc := &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "a"}}
	for _, tt := range []struct {
		name   string
		obj    any
		want   *networkingv1.ServiceCIDR
		wantOK bool
	}{
		{"object", sc, sc, true},
		{"tombstone", cache.DeletedFinalStateUnknown{Key: "a", Obj: sc}, sc, true},
		{"other type", &networkingv1.IPAddress{}, nil, false},
		{"tombstone of another type", cache.DeletedFinalStateUnknown{Key: "a", Obj: "x"}, nil, false},
		{"nil", nil, nil, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := ObjectFrom[*networkingv1.ServiceCIDR](tt.obj)
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("ObjectFrom() = %v, %v; want %v, %v", got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

func TestRunWorkersDrainsTheQueueAndReturnsAfterShutDown(t *testing.T) {
	q := workqueue.NewTyped[int]()
	for i := range 10 {
		q.Add(i)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var done atomic.Int32
	next := func(context.Context) bool {
		item, quit := q.Get()
		if quit {
			return false
		}
		defer q.Done(item)
		if done.Add(1) == 10 {
			cancel()
		}
		return true
	}
	RunWorkers(ctx, 3, q, next)
	if got := done.Load(); got != 10 {
		t.Errorf("RunWorkers processed %d items, want 10", got)
	}
	if !q.ShuttingDown() {
		t.Errorf("RunWorkers returned with its queue not shut down")
	}
}

func TestProcessNextForgetsOnSuccessAndRequeuesOnError(t *testing.T) {
	q := workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Millisecond, time.Millisecond))
	defer q.ShutDown()
	ctx := context.Background()
	fail := errors.New("boom")
	var failed []string
	sync := func(_ context.Context, key string) error {
		if key == "bad" {
			return fail
		}
		return nil
	}
	onError := func(_ context.Context, key string, err error) {
		if !errors.Is(err, fail) {
			t.Errorf("onError(%q, %v), want the sync error", key, err)
		}
		failed = append(failed, key)
	}
	q.Add("good")
	if !ProcessNext(ctx, q, sync, onError) || q.NumRequeues("good") != 0 || len(failed) != 0 {
		t.Errorf("after a good sync: requeues %d, onError calls %v; want 0, none", q.NumRequeues("good"), failed)
	}
	q.Add("bad")
	if !ProcessNext(ctx, q, sync, onError) || q.NumRequeues("bad") != 1 || len(failed) != 1 {
		t.Errorf("after a failed sync: requeues %d, onError calls %v; want 1, [bad]", q.NumRequeues("bad"), failed)
	}
	if key, _ := q.Get(); key != "bad" {
		t.Errorf("Get() after a failed sync = %q, want the key back", key)
	} else {
		q.Done(key)
	}
	q.ShutDown()
	if ProcessNext(ctx, q, sync, onError) {
		t.Errorf("ProcessNext() on a shut-down queue = true, want false")
	}
}
