package repair

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"sync"
	"time"

	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	clusterip "github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/internal/metrics"
)

// Controller repairs what Audit finds, per mode, with a leak hold-off. It remembers between
// passes how long each bit has been seen leaked. Build it with NewController; the zero Controller
// is not usable. A Controller is safe for concurrent use, but passes are serialised.
//
// The package documentation lists what it repairs in each mode and the metrics it keeps.
type Controller struct {
	cfg       clusterip.Config
	opts      Options
	now       func() time.Time
	retryBase time.Duration // the first retry delay of Run; 1 s
	// followWindow is the least time between the starts of a pass and of one that followed
	// Services bring forward; defaultFollowWindow.
	followWindow time.Duration
	metrics      *metrics.Repair // nil without Options.Registerer
	families     []string        // the IP families of cfg.Ranges, for the drift gauges
	follow       *follower       // nil in Legacy mode or without cfg.Informers

	firstPass     chan struct{} // closed once a pass has succeeded
	firstPassOnce sync.Once

	pass sync.Mutex // serialises passes and Run's retries of single addresses

	mu      sync.Mutex // guards leaks, heldOff, reported and found
	leaks   map[netip.Addr]bitLeak
	heldOff int
	// reported holds the causes an Event was emitted for that every pass since still found
	// (see event); found, the causes the pass in progress found, nil outside a pass.
	reported map[cause]struct{}
	found    map[cause]struct{}
}

// bitLeak is what the Controller remembers of a bit it has seen leaked.
type bitLeak struct {
	since  time.Time // when it was first seen leaked
	passes int       // on how many passes in a row
}

// NewController returns a Controller that repairs the cluster cfg describes, as Audit reads it.
// It starts nothing. Outside Legacy mode it registers the Service and IPAddress informers of
// cfg.Informers, if set, which Run follows: start the factory after NewController. A Config without what the mode needs gives a *clusterip.ConfigError; a
// Registerer that refuses the metrics gives its error, wrapped.
func NewController(cfg clusterip.Config, opts Options) (*Controller, error) {
	if err := checkConfig(&cfg); err != nil {
		return nil, err
	}
	c := &Controller{cfg: cfg, opts: opts, now: time.Now, retryBase: time.Second, followWindow: defaultFollowWindow, leaks: map[netip.Addr]bitLeak{}, reported: map[cause]struct{}{}, firstPass: make(chan struct{})}
	c.follow = newFollower(c)
	for _, r := range cfg.Ranges {
		c.families = append(c.families, string(allocator.FamilyOf(r.Addr())))
	}
	if opts.Registerer != nil {
		m, err := metrics.NewRepair(opts.Registerer, c.families)
		if err != nil {
			return nil, fmt.Errorf("repair: %w", err)
		}
		c.metrics = m
	}
	return c, nil
}

// RunOnce audits the cluster and makes the repairs the audit and the hold-off allow. It returns
// the audit it acted on, which still lists what was repaired. A failed repair does not stop the
// others: their errors are joined in the returned error, next to the report.
func (c *Controller) RunOnce(ctx context.Context) (*Report, error) {
	ctx = withControllerLogger(ctx)
	rep, _, itemErr, err := c.runOnce(ctx)
	if err == nil {
		c.firstPassOnce.Do(func() { close(c.firstPass) })
	}
	if rep == nil {
		return nil, err
	}
	return rep, errors.Join(itemErr, err)
}

// controllerName is the value of the "controller" key of the Controller's log lines, as the
// servicecidr controllers log theirs.
const controllerName = "clusterip-repair"

// withControllerLogger returns ctx with its logger naming the repair controller.
func withControllerLogger(ctx context.Context) context.Context {
	return klog.NewContext(ctx, klog.FromContext(ctx).WithValues("controller", controllerName))
}

// retry is a repair of one address that Run retries on its own, with the finding it acts on.
type retry struct {
	f finding
	// after is how long until the hold-off that kept it ends; 0 after a failure, which is
	// retried with the queue's backoff.
	after time.Duration
}

// runOnce makes one pass. It returns the audit (nil if the reads failed), the repairs of single
// IPAddress objects to retry (failed or held off), their errors, and the error of the pass
// itself: a failed read or bitmap write.
func (c *Controller) runOnce(ctx context.Context) (rep *Report, retries []retry, itemErr, err error) {
	c.pass.Lock()
	defer c.pass.Unlock()
	defer func() {
		if (itemErr != nil || err != nil) && ctx.Err() == nil { // not one cut short by shutdown
			c.metrics.ReconcileError()
		}
	}()
	if c.cfg.Mode != featuregate.IPAddressOnly {
		if err := c.rewriteBitmapsOfOtherRanges(ctx); err != nil {
			return nil, nil, nil, err
		}
	}
	w, res, err := audit(ctx, &c.cfg)
	if err != nil {
		return nil, nil, nil, err // judged nothing: every cause reported stays reported
	}
	c.startFindingCauses()
	defer c.endFindingCauses()
	c.setDrift(res)
	var held, heldBits int
	var deleted map[netip.Addr]bool
	if c.cfg.Mode != featuregate.Legacy {
		held, deleted, retries, itemErr = c.repairIPAddresses(ctx, res)
	}
	if c.cfg.Mode != featuregate.IPAddressOnly {
		heldBits, err = c.repairBitmaps(ctx, w, res, deleted)
	}
	c.mu.Lock()
	c.heldOff = held + heldBits
	c.mu.Unlock()
	return res.report(c.cfg.Mode), retries, itemErr, err
}

// setDrift sets the drift gauges from the findings of an audit.
func (c *Controller) setDrift(res result) {
	if c.metrics == nil {
		return
	}
	n := map[[2]string]int{}
	for i := range res.findings {
		f := &res.findings[i]
		if f.Class == BitmapOnly || f.Class == IPAddressOnly {
			n[[2]string{string(allocator.FamilyOf(f.addr)), string(f.Class)}]++
		}
	}
	for _, fam := range c.families {
		for _, kind := range []string{metrics.DriftBitmapOnly, metrics.DriftIPAddressOnly} {
			c.metrics.SetDrift(fam, kind, n[[2]string{fam, kind}])
		}
	}
}

// FirstPass returns a channel that is closed once a pass, of Run or RunOnce, has succeeded: its
// reads and its bitmap writes went through (single repairs may still be retried). A server that
// must not serve before its ClusterIP state has been repaired once, as kube-apiserver's
// start-service-ip-repair-controllers hook waits for its repair loops, waits for it.
func (c *Controller) FirstPass() <-chan struct{} {
	return c.firstPass
}

// HeldOff returns how many leaks the last RunOnce left in place because of the hold-off (the
// LeakGrace, or in Legacy mode the 3 passes): a caller that wants the cluster clean calls RunOnce
// again until it is 0.
func (c *Controller) HeldOff() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.heldOff
}

// Run makes repair passes until ctx is done, and then returns nil. It never blocks its caller's
// start-up on the cluster: an API server or etcd that is down only makes passes fail and be
// retried, and Run returns as soon as ctx is done, whatever is in flight.
//
// The first pass starts at once; after a pass that succeeds the next comes Options.Interval
// later, and after one whose reads or bitmap writes failed it is retried with an exponential
// backoff (1 s doubling up to the Interval). Each is level-based: a full audit and the repairs
// it allows.
//
// Between passes, Run retries single addresses through the same typed rate-limited workqueue,
// keyed by address and class: a repair of an IPAddress object that failed (a create, a
// recreate, a label update or a delete) is retried with its own exponential backoff, and a
// leaked IPAddress the hold-off kept is reconsidered as soon as its hold-off ends instead of at
// the next pass. A retry confirms live state first as a pass does (live Gets, then writes with
// UID and resourceVersion preconditions), and is dropped once a pass finds nothing to repair at
// that address. Bits are repaired by passes, except the bit of a leaked IPAddress a retry deleted
// in DualWrite mode, which the retry clears with a compare-and-swap. Failures are logged with the contextual
// logger of ctx.
//
// Outside Legacy mode, with cfg.Informers started, Run also follows Services as kube-apiserver's
// IPAddress repair loop does: a Service added or updated holding a ClusterIP that still has no
// IPAddress object in the cache one second later (a Service a Legacy peer allocated, in the skew
// window) brings the next pass forward to then, or to 10 seconds after the last pass began if
// that is later, so that a burst of such Services costs one pass, not one each. A Service whose
// address a pass has reported as one repair cannot fix (an out-of-range ClusterIP, say) brings
// no pass forward while every pass since finds it so; the periodic passes judge it.
//
// Each cause of an Event (object, address and reason) is reported once, on the first pass or
// retry that finds it, not again while every pass since finds it (see Options.Recorder).
func (c *Controller) Run(ctx context.Context) error {
	ctx = withControllerLogger(ctx)
	logger := klog.FromContext(ctx)
	interval := c.opts.interval()
	logger.Info("Starting", "interval", interval)
	defer logger.Info("Stopped")
	q := workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[itemKey](c.retryBase, interval),
		workqueue.TypedRateLimitingQueueConfig[itemKey]{Name: "clusterip_repair"},
	)
	defer q.ShutDown()
	stop := context.AfterFunc(ctx, q.ShutDown)
	defer stop()
	pending := map[itemKey]finding{} // the retries of the last pass, by key
	var lastPass time.Time           // when the last pass began
	defer c.follow.follow(q)()
	q.Add(passKey)
	for {
		key, shutdown := q.Get()
		if shutdown {
			return nil
		}
		switch {
		case ctx.Err() != nil:
		case key == passKey:
			lastPass = time.Now()
			c.runPass(ctx, q, pending)
		case key.class == followClass:
			c.followed(ctx, q, key.addr, lastPass)
			q.Forget(key)
		default:
			c.runItem(ctx, q, pending, key)
		}
		q.Done(key)
	}
}

// followed brings the next pass forward, to no sooner than c.followWindow after lastPass, if the
// Service followed for ip still lacks its IPAddress object and no pass has reported ip as one
// repair cannot fix. The queue keeps one passKey, at the earliest time it is asked for, so
// every Service followed within a window shares one pass.
func (c *Controller) followed(ctx context.Context, q workqueue.TypedRateLimitingInterface[itemKey], ip netip.Addr, lastPass time.Time) {
	logger := klog.FromContext(ctx)
	svc := c.follow.stillMissing(ip)
	switch {
	case svc == nil:
		return
	case c.reportedUnfixable(svc, ip):
		logger.V(4).Info("A Service holds a ClusterIP without an IPAddress object that a pass reported; not repairing sooner", "ip", ip, "service", serviceKey(svc))
		return
	}
	wait := c.followWindow - time.Since(lastPass)
	logger.V(2).Info("A Service holds a ClusterIP without an IPAddress object; bringing the next pass forward", "ip", ip, "service", serviceKey(svc), "in", max(wait, 0))
	q.AddAfter(passKey, wait) // now if wait ≤ 0
}

// runPass makes one of Run's passes and queues what it leaves to retry.
func (c *Controller) runPass(ctx context.Context, q workqueue.TypedRateLimitingInterface[itemKey], pending map[itemKey]finding) {
	logger := klog.FromContext(ctx)
	rep, retries, itemErr, err := c.runOnce(ctx)
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		logger.Error(err, "Repair pass failed, will retry", "retries", q.NumRequeues(passKey))
		q.AddRateLimited(passKey)
	} else {
		logger.V(2).Info("Repair pass done", "consistent", rep.Consistent, "counts", rep.Counts, "heldOff", c.HeldOff(), "retries", len(retries))
		q.Forget(passKey)
		q.AddAfter(passKey, c.opts.interval())
		c.firstPassOnce.Do(func() { close(c.firstPass) })
	}
	if rep == nil {
		return // nothing was judged: keep the retries there are
	}
	if itemErr != nil {
		logger.Error(itemErr, "Some repairs failed, will retry each")
	}
	old := maps.Clone(pending)
	clear(pending)
	for _, r := range retries {
		k := itemKey{addr: r.f.addr, class: r.f.Class}
		pending[k] = r.f
		delete(old, k)
		if r.after > 0 {
			q.AddAfter(k, r.after)
		} else {
			q.AddRateLimited(k)
		}
	}
	for k := range old {
		q.Forget(k) // repaired, or no longer a problem
	}
}

// runItem retries the repair of one address, if a pass still wants it.
func (c *Controller) runItem(ctx context.Context, q workqueue.TypedRateLimitingInterface[itemKey], pending map[itemKey]finding, key itemKey) {
	f, ok := pending[key]
	if !ok {
		q.Forget(key)
		return
	}
	c.pass.Lock()
	after, deleted, err := c.repairOne(ctx, &f)
	if deleted && f.bit && c.cfg.Mode == featuregate.DualWrite {
		if err := c.releaseBit(ctx, f.addr); err != nil {
			klog.FromContext(ctx).Error(err, "Cannot clear the bit of a deleted leak; the next pass will", "ip", f.IP)
		}
	}
	c.pass.Unlock()
	switch {
	case ctx.Err() != nil:
	case err != nil:
		klog.FromContext(ctx).Error(err, "Repair failed, will retry", "ip", f.IP, "class", f.Class, "retries", q.NumRequeues(key))
		q.AddRateLimited(key)
	case after > 0:
		q.AddAfter(key, after)
	default:
		delete(pending, key)
		q.Forget(key)
	}
}

// releaseBit clears ip's bit in the bitmap of its family with one compare-and-swap on the
// revision it reads (bitmap.Modify with one attempt), once repair deleted the leaked IPAddress of
// ip outside a pass (a pass clears such a bit itself). A bitmap of another range is read, and
// written, as the pass's rewrite leaves it. A bit that is set blocks every allocator that writes
// bits, so none can have taken ip meanwhile. A failed or conflicting write is returned, and the
// next pass finds the bit bitmap-only.
func (c *Controller) releaseBit(ctx context.Context, ip netip.Addr) error {
	for i, r := range c.cfg.Ranges {
		if r.Addr().Is4() != ip.Is4() {
			continue
		}
		store := c.cfg.Bitmaps.Store(i)
		cleared := false
		err := bitmap.Modify(ctx, store, r, func(b *bitmap.Allocator) (bool, error) {
			cleared = b.Has(ip)
			if !cleared {
				return false, nil
			}
			return true, b.Release(ctx, ip)
		}, bitmap.WithProjection(), bitmap.WithAttempts(1))
		if err != nil {
			return fmt.Errorf("repair: clear bit %s in the bitmap of %s at %s: %w", ip, r, storeName(store), err)
		}
		if !cleared {
			return nil
		}
		klog.FromContext(ctx).V(2).Info("Cleared the bit of a deleted leak", "ip", ip)
	}
	return nil
}

// itemKey is a key of Run's queue: one address and the class of its finding, or, as the zero
// itemKey, a whole pass. It is a small comparable value.
type itemKey struct {
	addr  netip.Addr
	class Class
}

// passKey is the key of a pass: level-based over the whole cluster.
var passKey = itemKey{}
