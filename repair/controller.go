package repair

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"time"

	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	clusterip "github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/featuregate"
)

// Controller repairs what Audit finds, per mode, with a leak hold-off. It remembers between
// passes how long each bit has been seen leaked. Build it with NewController; the zero Controller
// is not usable. A Controller is safe for concurrent use, but passes are serialised.
//
// What it repairs (DESIGN §7):
//
//   - IPAddressOnly: creates the IPAddress of a Service that has none, deletes an IPAddress no
//     Service holds once it is older than the hold-off, recreates one whose parentRef names the
//     wrong Service. Every decision is confirmed with a live Get first, and every delete carries a
//     UID and resourceVersion precondition, so a repair racing an allocation cannot undo it.
//   - Legacy: rebuilds each bitmap from the Services and writes it back with a compare-and-swap
//     on the revision it read before listing the Services, so a concurrent allocation makes the
//     write fail instead of being undone. A leaked bit is kept until it has been seen leaked on 3
//     passes and for the hold-off, as kube-apiserver does; a missing bitmap is created.
//   - DualWrite: both, and the bitmap from the IPAddress objects and Services, which
//     kube-apiserver does not do (kubernetes#136475): a Service's bit that is clear is set, a
//     stale bit (no IPAddress, no Service) is cleared once seen so for the hold-off and a live Get
//     finds no IPAddress, and the bit of a leaked IPAddress goes with it.
//
// Invalid, duplicate and out-of-range ClusterIPs only get an Event.
type Controller struct {
	cfg       clusterip.Config
	opts      Options
	now       func() time.Time
	retryBase time.Duration // the first retry delay of Run; 1 s

	pass sync.Mutex // serialises passes

	mu      sync.Mutex // guards leaks and heldOff
	leaks   map[netip.Addr]bitLeak
	heldOff int
}

// bitLeak is what the Controller remembers of a bit it has seen leaked.
type bitLeak struct {
	since  time.Time // when it was first seen leaked
	passes int       // on how many passes in a row
}

// NewController returns a Controller that repairs the cluster cfg describes, as Audit reads it.
// It starts nothing. A Config without what the mode needs gives a *clusterip.ConfigError.
func NewController(cfg clusterip.Config, opts Options) (*Controller, error) {
	if err := checkConfig(&cfg); err != nil {
		return nil, err
	}
	return &Controller{cfg: cfg, opts: opts, now: time.Now, retryBase: time.Second, leaks: map[netip.Addr]bitLeak{}}, nil
}

// RunOnce audits the cluster and makes the repairs the audit and the hold-off allow. It returns
// the audit it acted on, which still lists what was repaired. A failed repair does not stop the
// others: their errors are joined in the returned error, next to the report.
func (c *Controller) RunOnce(ctx context.Context) (*Report, error) {
	c.pass.Lock()
	defer c.pass.Unlock()
	w, err := read(ctx, &c.cfg)
	if err != nil {
		return nil, err
	}
	res := classify(w)
	var held, heldBits int
	var deleted map[netip.Addr]bool
	var errIPs, errBits error
	if c.cfg.Mode != featuregate.Legacy {
		held, deleted, errIPs = c.repairIPAddresses(ctx, res)
	}
	if c.cfg.Mode != featuregate.IPAddressOnly {
		heldBits, errBits = c.repairBitmaps(ctx, w, res, deleted)
	}
	held += heldBits
	err = errors.Join(errIPs, errBits)
	c.mu.Lock()
	c.heldOff = held
	c.mu.Unlock()
	return res.report(c.cfg.Mode), err
}

// HeldOff returns how many leaks the last RunOnce left in place because of the hold-off (the
// LeakGrace, or in Legacy mode the 3 passes): a caller that wants the cluster clean calls RunOnce
// again until it is 0.
func (c *Controller) HeldOff() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.heldOff
}

// Run makes repair passes until ctx is done, and then returns nil. The first pass starts at once;
// after a pass that succeeds the next comes Options.Interval later, and after one that fails it is
// retried with an exponential backoff (1 s doubling up to the Interval) through a typed
// rate-limited workqueue, so an API server or etcd that is not up yet never blocks the caller.
// Failed passes are logged with the contextual logger of ctx.
func (c *Controller) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithName("clusterip-repair")
	ctx = klog.NewContext(ctx, logger)
	interval := c.opts.interval()
	q := workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](c.retryBase, interval),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "clusterip_repair"},
	)
	defer q.ShutDown()
	stop := context.AfterFunc(ctx, q.ShutDown)
	defer stop()
	q.Add(passKey)
	for {
		key, shutdown := q.Get()
		if shutdown {
			return nil
		}
		rep, err := c.RunOnce(ctx)
		switch {
		case ctx.Err() != nil:
		case err != nil:
			logger.Error(err, "repair pass failed; retrying", "retries", q.NumRequeues(key))
			q.AddRateLimited(key)
		default:
			logger.V(2).Info("repair pass done", "consistent", rep.Consistent, "counts", rep.Counts, "heldOff", c.HeldOff())
			q.Forget(key)
			q.AddAfter(key, interval)
		}
		q.Done(key)
	}
}

// passKey is the one key of Run's queue: each pass is level-based over the whole cluster.
const passKey = "pass"
