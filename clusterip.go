package clusterip

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1informers "k8s.io/client-go/informers/networking/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	networkingv1listers "k8s.io/client-go/listers/networking/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/component-base/compatibility"

	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/allocator/service"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/reservation"
	"github.com/kube-ipam/clusterip/servicecidr"
)

// Allocators are the ClusterIP allocators of a cluster's IP families for one Mode. Build them with
// New; the zero Allocators is not usable. Allocators are safe for concurrent use.
type Allocators struct {
	mode     featuregate.Mode
	families []corev1.IPFamily // in the order of Config.Ranges: the primary family first
	ranges   map[corev1.IPFamily]netip.Prefix
	allocs   map[corev1.IPFamily]allocator.Interface
	bitmaps  map[corev1.IPFamily]*bitmap.Persistent
	cidrs    map[corev1.IPFamily]*servicecidr.Allocator
	dual     map[corev1.IPFamily]*DualWriteAllocator // DualWrite mode only, never wrapped
	services *service.Allocator
	claimer  *reservation.Claimer          // with Config.Reservations: what Services() claims and retains with
	expiry   *reservation.ExpiryController // with Config.Reservations: Run deletes ended reservations

	// With Config.DefaultServiceCIDR, what Run builds its servicecidr.DefaultController from.
	defaultCIDR bool
	version     compatibility.EffectiveVersion // the kube-apiserver the allocators behave as
	flagRanges  []netip.Prefix                 // Config.Ranges
	client      kubernetes.Interface
	cidrsInf    networkingv1informers.ServiceCIDRInformer

	// The informers the servicecidr allocators follow, for WaitReady's diagnosis; nil in Legacy mode.
	cidrInformer cache.SharedIndexInformer
	ipInformer   cache.SharedIndexInformer
	cidrLister   networkingv1listers.ServiceCIDRLister

	mu      sync.Mutex // guards running and closed
	running bool
	closed  bool
}

// New builds the allocator of each IP family of cfg.Ranges for cfg.Mode:
//
//   - Legacy: a bitmap.Persistent of the range, in the store Config.Bitmaps gives for its position
//     in Ranges (with etcdstore.Stores, the first range at <prefix>/ranges/serviceips, the second
//     at <prefix>/ranges/secondaryserviceips), created empty if missing.
//   - DualWrite: a DualWriteAllocator over the family's servicecidr.Allocator (the primary) and a
//     bitmap mirror of the family's own range at the same key as in Legacy mode. A missing mirror
//     is created from the IPAddress objects already in its range, and New then keeps catching up
//     for about two seconds with objects that a kube-apiserver v1.33 created without bits while
//     the key was missing (see bootstrap.go).
//   - IPAddressOnly: the family's servicecidr.Allocator.
//
// A bitmap stored for another range than its flag range (--service-cluster-ip-range changed since
// it was written) does not make New fail, as it does not stop kube-apiserver v1.33 from starting.
// In Legacy mode that family's operations fail with an error matching
// allocator.ErrMismatchedNetwork, whose text is kube-apiserver's "the provided range does not
// match the current range", until package repair's first pass rewrites the bitmap to the flag
// range, as kube-apiserver's repair does. In DualWrite mode the mirror stays as stored, as in
// kube-apiserver: AllocateNext takes addresses from the ServiceCIDRs alone, Allocate of an address
// inside the flag range fails with that error, and Release leaves the bitmap alone.
//
// A Config missing what its mode needs gives a *ConfigError naming the field, and so do ranges
// kube-apiserver refuses for the mode (see Config.Ranges). New reads the bitmaps and lists
// IPAddress objects, but starts no goroutine: start cfg.Informers after New and call Run.
func New(ctx context.Context, cfg Config) (*Allocators, error) {
	version, gate, err := cfg.check()
	if err != nil {
		return nil, err
	}
	a := &Allocators{
		mode:    cfg.Mode,
		ranges:  map[corev1.IPFamily]netip.Prefix{},
		allocs:  map[corev1.IPFamily]allocator.Interface{},
		bitmaps: map[corev1.IPFamily]*bitmap.Persistent{},
		cidrs:   map[corev1.IPFamily]*servicecidr.Allocator{},
		dual:    map[corev1.IPFamily]*DualWriteAllocator{},
	}
	for i, r := range cfg.Ranges {
		f := familyOf(r)
		a.families = append(a.families, f)
		a.ranges[f] = r
		if err := a.build(ctx, &cfg, i, r); err != nil {
			a.Close()
			return nil, err
		}
	}
	if cfg.Registerer != nil {
		if err := a.instrument(cfg.Registerer); err != nil {
			a.Close()
			return nil, err
		}
	}
	if cfg.Mode != featuregate.Legacy {
		nw := cfg.Informers.Networking().V1()
		a.cidrInformer, a.cidrLister = nw.ServiceCIDRs().Informer(), nw.ServiceCIDRs().Lister()
		a.ipInformer = nw.IPAddresses().Informer()
		if cfg.DefaultServiceCIDR {
			a.defaultCIDR, a.flagRanges, a.client, a.cidrsInf = true, slices.Clone(cfg.Ranges), cfg.Client, nw.ServiceCIDRs()
		}
	}
	a.version = version
	opts := service.Options{Version: version, FeatureGate: gate}
	if cfg.Reservations {
		nw := cfg.Informers.Networking().V1()
		claimer, err := reservation.NewClaimer(cfg.Client, nw.IPAddresses(), cfg.ManagedBy, reservation.WithServiceCIDRs(nw.ServiceCIDRs()),
			reservation.WithNamespaces(cfg.Informers.Core().V1().Namespaces()))
		if err != nil {
			a.Close()
			return nil, &ConfigError{Field: "Reservations", Reason: "the IPAddress informer", Err: err}
		}
		opts.Reserved, a.claimer = claimer, claimer
		if a.expiry, err = reservation.NewExpiryController(cfg.Client, cfg.Informers.Networking().V1().IPAddresses()); err != nil {
			a.Close()
			return nil, &ConfigError{Field: "Reservations", Reason: "the IPAddress informer", Err: err}
		}
	}
	a.services = service.NewWithOptions(a.families[0], a.allocs, opts)
	return a, nil
}

// build makes the allocator of the range at index i of cfg.Ranges.
func (a *Allocators) build(ctx context.Context, cfg *Config, i int, r netip.Prefix) error {
	f := familyOf(r)
	field := fmt.Sprintf("Ranges[%d]", i)
	var sc *servicecidr.Allocator
	if cfg.Mode != featuregate.Legacy {
		var err error
		nw := cfg.Informers.Networking().V1()
		if sc, err = servicecidr.New(f, cfg.Client, nw.ServiceCIDRs(), nw.IPAddresses(), servicecidr.WithManagedBy(cfg.ManagedBy)); err != nil {
			return fmt.Errorf("clusterip: %s allocator: %w", f, err)
		}
		a.cidrs[f] = sc
		a.allocs[f] = sc
	}
	if cfg.Mode == featuregate.IPAddressOnly {
		return nil
	}
	store := cfg.Bitmaps.Store(i)
	if cfg.Mode == featuregate.DualWrite {
		if err := bootstrap(ctx, cfg.Client, r, store); err != nil {
			return fmt.Errorf("clusterip: create the bitmap of %s at %s: %w", r, storeName(store), err)
		}
	}
	bm, err := bitmap.NewPersistent(ctx, r, store)
	if err != nil {
		var pe *allocator.PrefixError
		if errors.As(err, &pe) {
			return &ConfigError{Field: field, Reason: "cannot be held in a bitmap", Err: err}
		}
		return fmt.Errorf("clusterip: bitmap of %s at %s: %w", r, storeName(store), err)
	}
	a.bitmaps[f] = bm
	if cfg.Mode == featuregate.Legacy {
		a.allocs[f] = bm
		return nil
	}
	dw, err := NewDualWrite(sc, bm, WithClient(cfg.Client))
	if err != nil {
		bm.Close()
		return err
	}
	a.dual[f] = dw
	a.allocs[f] = dw
	return nil
}

// Mode returns the mode the allocators were built for.
func (a *Allocators) Mode() featuregate.Mode { return a.mode }

// Families returns the IP families served, in the order of Config.Ranges: the primary first.
func (a *Allocators) Families() []corev1.IPFamily { return slices.Clone(a.families) }

// Range returns the flag range of family f (Config.Ranges), or the zero Prefix if f is not served.
func (a *Allocators) Range(f corev1.IPFamily) netip.Prefix { return a.ranges[f] }

// For returns the allocator of IP family f, or nil if f is not served: a *bitmap.Persistent in
// Legacy mode, a *DualWriteAllocator in DualWrite mode and a *servicecidr.Allocator in
// IPAddressOnly mode. With Config.Registerer set, that allocator comes wrapped in one that records
// its metrics, whose Unwrap method returns it; Bitmap, DualWrite and ServiceCIDRs return the
// parts without a type assertion.
func (a *Allocators) For(f corev1.IPFamily) allocator.Interface {
	if al, ok := a.allocs[f]; ok {
		return al
	}
	return nil
}

// Bitmap returns the bitmap of family f: the allocator itself in Legacy mode, the mirror in
// DualWrite mode; nil in IPAddressOnly mode or if f is not served.
func (a *Allocators) Bitmap(f corev1.IPFamily) *bitmap.Persistent { return a.bitmaps[f] }

// DualWrite returns the dual-write allocator of family f, unwrapped even when Config.Registerer
// wraps For's result in metrics, so that its Stats can be read; nil outside DualWrite mode or if
// f is not served.
func (a *Allocators) DualWrite(f corev1.IPFamily) *DualWriteAllocator { return a.dual[f] }

// ServiceCIDRs returns the servicecidr allocator of family f: the allocator itself in
// IPAddressOnly mode, the primary in DualWrite mode; nil in Legacy mode or if f is not served.
func (a *Allocators) ServiceCIDRs(f corev1.IPFamily) *servicecidr.Allocator { return a.cidrs[f] }

// Services returns the allocator of a Service's ClusterIPs across every family served, with the
// first family of Config.Ranges as the cluster's primary, as kube-apiserver's Service registry
// uses it: see [service.Allocator].
func (a *Allocators) Services() *service.Allocator { return a.services }

// Reservations returns the Claimer through which Services() gives a Service the address reserved
// for it and keeps the addresses its release policy retains, for a caller that allocates address
// by address, as kube-apiserver's Service registry does (package reservation); nil unless
// Config.Reservations is set.
func (a *Allocators) Reservations() *reservation.Claimer { return a.claimer }

// readyPoll is how often WaitReady looks at the allocators, and bitmapPoll how often it reads a
// bitmap that could not be loaded again.
const (
	readyPoll  = 10 * time.Millisecond
	bitmapPoll = 250 * time.Millisecond
)

// WaitReady waits until the allocator of every family served can allocate, as
// informers.SharedInformerFactory.WaitForCacheSync waits for its caches, and returns nil.
//
// In DualWrite and IPAddressOnly mode that is once each family's servicecidr allocator has
// synced (servicecidr.Allocator.HasSynced), which needs Config.Informers started and Run running,
// and serves at least one ready ServiceCIDR (servicecidr.Allocator.Ready). In Legacy mode the
// bitmaps New read serve at once and WaitReady returns nil without waiting, unless a bitmap is
// stored for another range than its flag range (--service-cluster-ip-range changed): then it
// reads it again every 250 ms until package repair's first pass has rewritten it, as
// kube-apiserver's repair does. (In DualWrite mode such a mirror is kept as stored, as
// kube-apiserver keeps it, and does not stop allocation.)
//
// If ctx is done first, WaitReady returns a *NotReadyError that names the first family not ready
// and what it waits for (ErrNotSynced, ErrNoServiceCIDR, ErrServiceCIDRNotReady with the
// ServiceCIDR and its Ready condition, or ErrBitmapNotLoaded) and wraps ctx.Err(). It returns an
// error at once if the Allocators are closed. WaitReady does not start anything and may be called
// from several goroutines.
func (a *Allocators) WaitReady(ctx context.Context) error {
	var ticker *time.Ticker
	var lastRead time.Time
	for {
		a.mu.Lock()
		closed := a.closed
		a.mu.Unlock()
		if closed {
			return errors.New("clusterip: WaitReady after Close")
		}
		if a.ready() {
			return nil
		}
		if a.mode == featuregate.Legacy && time.Since(lastRead) >= bitmapPoll {
			if !lastRead.IsZero() {
				a.refreshUnloaded(ctx)
			}
			lastRead = time.Now()
		}
		if ticker == nil {
			ticker = time.NewTicker(readyPoll)
			defer ticker.Stop()
		}
		select {
		case <-ctx.Done():
			e := a.notReady()
			if e == nil {
				return nil // ready just now
			}
			e.Err = ctx.Err()
			return e
		case <-ticker.C:
		}
	}
}

// refreshUnloaded reads again each bitmap that could not be loaded, so that WaitReady sees a
// rewrite by repair. A failed read leaves the bitmap's LoadError as it was.
func (a *Allocators) refreshUnloaded(ctx context.Context) {
	for _, f := range a.families {
		if bm := a.bitmaps[f]; bm != nil && bm.LoadError() != nil {
			_ = bm.Refresh(ctx)
		}
	}
}

// Run runs what the allocators need in the background (the servicecidr allocators, which follow
// ServiceCIDRs, in DualWrite and IPAddressOnly mode, and with Config.DefaultServiceCIDR a
// servicecidr.DefaultController, whose Events it writes with Config.Client) until ctx is done,
// then returns nil. It returns an error at once if it is already running or the Allocators are
// closed, and the first error a servicecidr allocator's Run returns. Run does not close the
// Allocators. WaitReady tells when the allocators it runs can serve.
func (a *Allocators) Run(ctx context.Context) error {
	a.mu.Lock()
	switch {
	case a.closed:
		a.mu.Unlock()
		return errors.New("clusterip: Run after Close")
	case a.running:
		a.mu.Unlock()
		return errors.New("clusterip: Run called twice")
	}
	a.running = true
	a.mu.Unlock()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var runs []func(context.Context) error
	for _, sc := range a.cidrs {
		runs = append(runs, sc.Run)
	}
	if a.expiry != nil {
		runs = append(runs, a.expiry.Run)
	}
	if a.defaultCIDR {
		run, err := a.defaultController(ctx)
		if err != nil {
			return err
		}
		runs = append(runs, run)
	}
	errs := make(chan error, len(runs))
	for _, run := range runs {
		go func() { errs <- run(ctx) }()
	}
	var first error
	for range runs {
		if err := <-errs; err != nil && first == nil {
			first = err
			cancel()
		}
	}
	if first != nil {
		return fmt.Errorf("clusterip: %w", first)
	}
	<-ctx.Done()
	return nil
}

// defaultController returns the Run of the servicecidr.DefaultController of Config.Ranges, whose
// Events are written with Config.Client until ctx is done, as kube-apiserver's controller writes
// them.
func (a *Allocators) defaultController(ctx context.Context) (func(context.Context) error, error) {
	broadcaster := events.NewBroadcaster(&events.EventSinkImpl{Interface: a.client.EventsV1()})
	if err := broadcaster.StartRecordingToSinkWithContext(ctx); err != nil {
		return nil, fmt.Errorf("clusterip: record the default ServiceCIDR's Events: %w", err)
	}
	dc, err := servicecidr.NewDefaultController(a.flagRanges, a.client, a.cidrsInf, servicecidr.DefaultOptions{
		Version:  a.version,
		Recorder: broadcaster.NewRecorder(scheme.Scheme, servicecidr.DefaultControllerName),
	})
	if err != nil {
		broadcaster.Shutdown()
		return nil, fmt.Errorf("clusterip: %w", err)
	}
	return func(ctx context.Context) error {
		defer broadcaster.Shutdown()
		return dc.Run(ctx)
	}, nil
}

// Close closes every allocator. It does not close what Config.Bitmaps keeps the bitmaps in (the
// etcd client of an etcdstore.Stores) or stop Config.Informers. Close is idempotent.
func (a *Allocators) Close() error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil
	}
	a.closed = true
	a.mu.Unlock()
	var errs []error
	for _, f := range a.families {
		if al, ok := a.allocs[f]; ok {
			errs = append(errs, al.Close())
			continue
		}
		// New failed half way: close the parts.
		if bm := a.bitmaps[f]; bm != nil {
			errs = append(errs, bm.Close())
		}
		if sc := a.cidrs[f]; sc != nil {
			errs = append(errs, sc.Close())
		}
	}
	return errors.Join(errs...)
}

// storeName names where store keeps its bitmap, for error messages: its Key, such as an
// etcdstore.Store's etcd key, if it has one.
func storeName(store bitmap.Store) string {
	if k, ok := store.(interface{ Key() string }); ok {
		return k.Key()
	}
	return fmt.Sprintf("a %T", store)
}
