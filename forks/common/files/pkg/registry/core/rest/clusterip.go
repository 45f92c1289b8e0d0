// This file is not part of Kubernetes: each kube-apiserver fork of github.com/kube-ipam/clusterip
// (forks/<release> in its repository; the file is kept once, in forks/common) adds it to package
// k8s.io/kubernetes/pkg/registry/core/rest. It puts clusterip's allocators behind kube-apiserver's
// ipallocator.Interface, and runs them and clusterip's repair controller in place of
// kube-apiserver's own. What differs by release is in clusterip_release.go.

package rest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/apiserver/pkg/util/compatibility"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/kubernetes"
	networkingv1listers "k8s.io/client-go/listers/networking/v1"
	"k8s.io/client-go/tools/events"
	basecompatibility "k8s.io/component-base/compatibility"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	api "k8s.io/kubernetes/pkg/apis/core"
	"k8s.io/kubernetes/pkg/features"
	"k8s.io/kubernetes/pkg/registry/core/service/ipallocator"
	ipaddressstore "k8s.io/kubernetes/pkg/registry/networking/ipaddress/storage"

	"github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/allocator"
	clusteripservice "github.com/kube-ipam/clusterip/allocator/service"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/repair"
	"github.com/kube-ipam/clusterip/reservation"
	"github.com/kube-ipam/clusterip/servicecidr"
)

const (
	// clusterIPCallTimeout bounds each call the Service registry makes to a ClusterIP allocator,
	// which has no context of its own: a write to etcd or an IPAddress create through the loopback
	// client.
	clusterIPCallTimeout = 30 * time.Second

	// clusterIPStartTimeout bounds one attempt to build the allocators (reading the bitmaps, and in
	// DualWrite mode creating a missing one from the IPAddress objects).
	clusterIPStartTimeout = 20 * time.Second

	// clusterIPReadyTimeout bounds the wait, at start-up in DualWrite and IPAddressOnly mode,
	// for a ready ServiceCIDR of every IP family.
	clusterIPReadyTimeout = 20 * time.Second

	// clusterIPRetryPeriod is how long the start-up waits after a failed attempt to build the
	// allocators or a failed first repair pass before it tries again.
	clusterIPRetryPeriod = time.Second
)

// clusterIPAllocators are clusterip's allocators of the cluster's Service IP families. The
// registry gets one clusterIPAllocator per family at once, from the flags; the allocators behind
// them are built by the PostStartHook start-service-ip-repair-controllers (see repairRunner),
// because in DualWrite mode clusterip.New may list IPAddress objects through the loopback client,
// which only answers once the server serves. Until then every allocation fails with
// ipallocator.ErrNotReady, and the server does not report ready.
//
// The zero value is not usable; build it with newClusterIPAllocators. It is safe for concurrent
// use.
type clusterIPAllocators struct {
	mode    featuregate.Mode
	ranges  []netip.Prefix
	storage storagebackend.ConfigForResource // of the Services: etcd's servers, TLS files and prefix
	config  *Config
	ready   atomic.Pointer[clusterip.Allocators] // nil until started

	// writes is how the allocators write IPAddress objects: clusterIPWritesLoopback or
	// clusterIPWritesRegistry (see clusterIPWritesEnv).
	writes string
	// reservations is whether the allocators keep reservations (see clusterIPReservationsEnv),
	// and claims the claims a failed create or update may yet undo.
	reservations bool
	claims       pendingClaims

	mu        sync.Mutex // guards destroyed, ipAddresses and the store of ready
	destroyed bool
	// ipAddresses is the registry the allocators' IPAddress creates and deletes go to with
	// clusterIPWritesRegistry (see useRESTOptions); nil until the server's REST storage is
	// built, and in Legacy mode or with clusterIPWritesLoopback.
	ipAddresses *ipaddressstore.REST
}

// clusterIPVersion returns the kube-apiserver version whose semantics the allocators must have:
// this binary's version, as component-base's compatibility registry holds it for kube-apiserver,
// and the version it emulates (--emulated-version, the binary's own by default), as the feature
// gates hold it that select the mode. The gates are the process's, which every server in it
// obeys; kube-apiserver's in-process test server keeps a compatibility registry of its own, but
// sets the gates' emulated version from it.
func clusterIPVersion() (binary, emulated *version.Version) {
	binary = compatibility.DefaultComponentGlobalsRegistry.EffectiveVersionFor(basecompatibility.DefaultKubeComponent).BinaryVersion()
	return binary, utilfeature.DefaultMutableFeatureGate.EmulationVersion()
}

// newClusterIPAllocators checks the --service-cluster-ip-range flag as clusterip does and returns
// the allocators of its families: the primary (the flag's first range), and every family's. It
// registers the ServiceCIDR and IPAddress informers the allocators will use, so that the generic
// server starts them with the others.
func (c *Config) newClusterIPAllocators(storage *storagebackend.ConfigForResource) (*clusterIPAllocators, ipallocator.Interface, map[api.IPFamily]ipallocator.Interface, error) {
	flag := []string{c.Services.ClusterIPRange.String()}
	if c.Services.SecondaryClusterIPRange.IP != nil {
		flag = append(flag, c.Services.SecondaryClusterIPRange.String())
	}
	ranges, err := clusterip.ParseRanges(strings.Join(flag, ","))
	if err != nil {
		return nil, nil, nil, fmt.Errorf("cannot create cluster IP allocator: %w", err)
	}
	writes, err := clusterIPWrites(os.Getenv(clusterIPWritesEnv))
	if err != nil {
		return nil, nil, nil, fmt.Errorf("cannot create cluster IP allocator: %w", err)
	}
	a := &clusterIPAllocators{mode: clusterIPMode(), ranges: ranges, storage: *storage, config: c, writes: writes}
	if a.reservations, err = clusterIPReservations(os.Getenv(clusterIPReservationsEnv), a.mode); err != nil {
		return nil, nil, nil, fmt.Errorf("cannot create cluster IP allocator: %w", err)
	}
	if a.mode != featuregate.Legacy {
		c.Informers.Networking().V1().ServiceCIDRs().Informer()
		ipInformer := c.Informers.Networking().V1().IPAddresses().Informer()
		if a.reservations {
			// The reservations' index, which the allocators built once the server serves
			// find there: an informer takes a new index only before it starts.
			if _, err := reservation.NewIndex(ipInformer); err != nil {
				return nil, nil, nil, fmt.Errorf("cannot create cluster IP allocator: %w", err)
			}
		}
	}
	byFamily := map[api.IPFamily]ipallocator.Interface{}
	var primary ipallocator.Interface
	for i, r := range ranges {
		f := api.IPFamily(allocator.FamilyOf(r.Addr()))
		al := &clusterIPAllocator{all: a, family: f, cidr: ipNetOf(r)}
		byFamily[f] = al
		if i == 0 {
			primary = al
		}
	}
	klog.InfoS("Service ClusterIPs are allocated by clusterip", "mode", a.mode, "ranges", flag, "ipAddressWrites", writes, "reservations", a.reservations)
	return a, primary, byFamily, nil
}

// clusterIPConfig returns the clusterip.Config of the allocators and of the repair controller:
// the flag ranges, an etcd client built from the Service storage's transport (nil in
// IPAddressOnly mode), its prefix, a clientset of the loopback client config (whose IPAddress
// creates and deletes go to the IPAddress registry in this process with clusterIPWritesRegistry),
// and the server's shared informer factory. The caller closes the etcd client.
func (a *clusterIPAllocators) clusterIPConfig() (clusterip.Config, error) {
	cfg := clusterip.Config{
		Mode:         a.mode,
		Ranges:       a.ranges,
		Informers:    a.config.Informers,
		Registerer:   legacyregistry.Registerer(),
		Reservations: a.reservations,
	}
	// The one place the fork tells the library which release's semantics to have: this binary's
	// version and the version it emulates (clusterIPVersion), and the one gate of the library's
	// validation that --feature-gates may set besides the mode's. The mode above already follows
	// --emulated-version, through the server's own feature gates.
	binary, emulated := clusterIPVersion()
	v := basecompatibility.NewEffectiveVersion(binary, false, version.MajorMinor(0, 0), version.MajorMinor(0, 0))
	v.SetEmulationVersion(emulated)
	cfg.Version = v
	cfg.FeatureGates = map[string]bool{
		string(features.StrictIPCIDRValidation): utilfeature.DefaultFeatureGate.Enabled(features.StrictIPCIDRValidation),
	}
	klog.V(2).InfoS("ClusterIP allocators configured", "mode", a.mode, "binaryVersion", binary, "emulatedVersion", emulated)
	client, err := kubernetes.NewForConfig(a.config.LoopbackClientConfig)
	if err != nil {
		return cfg, err
	}
	cfg.Client = client
	if a.mode != featuregate.Legacy && a.writes == clusterIPWritesRegistry {
		a.mu.Lock()
		registry := a.ipAddresses
		a.mu.Unlock()
		if registry == nil {
			return cfg, fmt.Errorf("%s=%s: the server built no IPAddress registry", clusterIPWritesEnv, clusterIPWritesRegistry)
		}
		cfg.Client = registryClientset{client, registry}
	}
	if a.mode == featuregate.IPAddressOnly {
		return cfg, nil
	}
	etcd, err := newClusterIPEtcdClient(a.storage.Transport)
	if err != nil {
		return cfg, fmt.Errorf("etcd client for the Service IP bitmaps: %w", err)
	}
	cfg.Bitmaps = etcdstore.Stores{Client: etcd, Prefix: a.storage.Prefix}
	return cfg, nil
}

// repairRunner returns the function that the PostStartHook start-service-ip-repair-controllers
// runs in place of kube-apiserver's ClusterIP repair loop. It builds the allocators (retrying
// until it succeeds or stopCh closes), starts them, and runs clusterip's repair controller; it
// calls onFirstSuccess once the first repair pass has succeeded, as kube-apiserver's loop does,
// so that the hook, and the server's readiness, wait for it.
func (a *clusterIPAllocators) repairRunner(interval time.Duration, client kubernetes.Interface) func(onFirstSuccess func(), stopCh chan struct{}) {
	return func(onFirstSuccess func(), stopCh chan struct{}) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			select {
			case <-stopCh:
				cancel()
			case <-ctx.Done():
			}
		}()
		logger := klog.FromContext(ctx).WithName("clusterip")
		ctx = klog.NewContext(ctx, logger)

		var cfg clusterip.Config
		var allocs *clusterip.Allocators
		err := wait.PollUntilContextCancel(ctx, clusterIPRetryPeriod, true, func(ctx context.Context) (bool, error) {
			var err error
			if cfg, err = a.clusterIPConfig(); err != nil {
				logger.Error(err, "Cannot configure the ClusterIP allocators; retrying")
				return false, nil
			}
			nctx, ncancel := context.WithTimeout(ctx, clusterIPStartTimeout)
			allocs, err = clusterip.New(nctx, cfg)
			if errors.Is(err, allocator.ErrMismatchedNetwork) {
				allocs, err = a.newMismatched(nctx, &cfg, err)
			}
			ncancel()
			if err != nil {
				closeBitmapsClient(cfg)
				logger.Error(err, "Cannot build the ClusterIP allocators; retrying")
				return false, nil
			}
			return true, nil
		})
		if err != nil {
			return // stopped
		}
		defer func() {
			closeBitmapsClient(cfg)
		}()
		if !a.start(allocs) {
			return // destroyed meanwhile
		}
		broadcaster := events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
		broadcaster.StartRecordingToSink(ctx.Done())
		defer broadcaster.Shutdown()
		// Built before the informers start: outside Legacy mode it follows Services on their
		// informer, as kube-apiserver's IPAddress repair loop does.
		ctrl, err := repair.NewController(cfg, repair.Options{
			Interval:   interval,
			Recorder:   broadcaster.NewRecorder(legacyscheme.Scheme, "ipallocator-repair-controller"),
			Registerer: legacyregistry.Registerer(),
		})
		if err != nil {
			// Only the metrics can fail here (the Config built the allocators): repair without them.
			logger.Error(err, "ClusterIP repair runs without metrics")
			if ctrl, err = repair.NewController(cfg, repair.Options{Interval: interval, Recorder: broadcaster.NewRecorder(legacyscheme.Scheme, "ipallocator-repair-controller")}); err != nil {
				logger.Error(err, "Cannot build the ClusterIP repair controller")
				return
			}
		}
		if cfg.Informers != nil {
			cfg.Informers.Start(ctx.Done()) // the informers added since the server started them
		}
		go func() {
			if err := allocs.Run(ctx); err != nil {
				logger.Error(err, "ClusterIP allocators stopped")
			}
		}()

		// Let the ServiceCIDR allocators see the ServiceCIDRs of the flags (which the
		// kubernetes-service-cidr-controller creates on a new cluster) before the first
		// pass, so that it judges Services against them and the server, once ready, can
		// allocate. Bounded, as the hook has a minute in all.
		if cfg.Mode != featuregate.Legacy {
			rctx, rcancel := context.WithTimeout(ctx, clusterIPReadyTimeout)
			err := waitServiceCIDRs(rctx, allocs, cfg.Informers.Networking().V1().ServiceCIDRs().Lister())
			rcancel()
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				logger.Info("No ready ServiceCIDR yet for every IP family; repairing anyway", "waited", clusterIPReadyTimeout)
			}
		}

		// Run retries a failed first pass with its backoff; the hook may report done once one
		// has succeeded, as kube-apiserver's repair loops report their first success.
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := ctrl.Run(ctx); err != nil {
				logger.Error(err, "ClusterIP repair stopped")
			}
		}()
		select {
		case <-ctrl.FirstPass():
			onFirstSuccess()
		case <-done:
			return // stopped
		}
		<-done
	}
}

// waitServiceCIDRs waits until the allocators have a ready ServiceCIDR of every family, or of
// every family of the default ServiceCIDR once it is ready (servicecidr.Ready). The default ServiceCIDR is what
// kube-apiserver's start-kubernetes-service-cidr-controller hook waits for; when the flags' primary
// family has changed (IPv4 to IPv6), kube-apiserver keeps it as it was, so no ServiceCIDR of the new
// family comes by itself, and stock kube-apiserver reports ready without one.
func waitServiceCIDRs(ctx context.Context, allocs *clusterip.Allocators, serviceCIDRs networkingv1listers.ServiceCIDRLister) error {
	all := allocs.Families()
	return wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(context.Context) (bool, error) {
		families := all
		if def, err := serviceCIDRs.Get(defaultServiceCIDR); err == nil && servicecidr.Ready(def) {
			families = nil
			for _, p := range servicecidr.Prefixes(def) {
				if f := allocator.FamilyOf(p.Addr()); slices.Contains(all, f) {
					families = append(families, f)
				}
			}
		}
		for _, f := range families {
			if c := allocs.ServiceCIDRs(f); c != nil && !c.Ready() {
				return false, nil
			}
		}
		return true, nil
	})
}

// closeBitmapsClient closes the etcd client of cfg's bitmap stores, if clusterIPConfig made one.
func closeBitmapsClient(cfg clusterip.Config) {
	if stores, ok := cfg.Bitmaps.(etcdstore.Stores); ok && stores.Client != nil {
		stores.Client.Close()
	}
}

// defaultServiceCIDR is the name of the ServiceCIDR kube-apiserver makes of its flags.
const defaultServiceCIDR = "kubernetes"

// newMismatched builds the allocators when a bitmap stored in etcd is of another range than the
// flags (the flags changed: a family added, removed or swapped), err being what clusterip.New
// said of it. It does what kube-apiserver does with such a bitmap:
//
//   - DualWrite: kube-apiserver's dual write finds the bitmap unusable and allocates from the
//     ServiceCIDRs alone, so cfg becomes IPAddressOnly (allocators and repair), and the bitmap is
//     left as it is for whoever still uses it.
//   - Legacy: kube-apiserver's repair rewrites the bitmap for the flag's range from the Services
//     on its first pass, so this rewrites every mismatched bitmap of cfg.Ranges (see
//     rewriteBitmap) and tries again.
func (a *clusterIPAllocators) newMismatched(ctx context.Context, cfg *clusterip.Config, err error) (*clusterip.Allocators, error) {
	logger := klog.FromContext(ctx)
	switch cfg.Mode {
	case featuregate.DualWrite:
		logger.Error(err, "A stored Service IP bitmap is of another range than --service-cluster-ip-range; allocating from ServiceCIDRs only (no bitmap mirror), as kube-apiserver's dual write does")
		cfg.Mode = featuregate.IPAddressOnly
		return clusterip.New(ctx, *cfg)
	case featuregate.Legacy:
		stores := cfg.Bitmaps.(etcdstore.Stores) // as clusterIPConfig builds it
		for i, r := range cfg.Ranges {
			key := etcdstore.KeyFor(stores.Prefix, i)
			if err := rewriteBitmap(ctx, cfg.Client, etcdstore.New(stores.Client, key), r); err != nil {
				return nil, fmt.Errorf("rewrite the bitmap at %s for %s: %w", key, r, err)
			}
		}
		return clusterip.New(ctx, *cfg)
	}
	return nil, err
}

// rewriteBitmap replaces the bitmap in store, if it is of another range than r, with one of r
// holding the ClusterIPs in r of every Service, as kube-apiserver's repair does when the range
// changed. The write is a compare-and-swap on the revision read before the Services are
// listed, so a concurrent write makes it fail rather than be lost.
func rewriteBitmap(ctx context.Context, client kubernetes.Interface, store *etcdstore.Store, r netip.Prefix) error {
	old, rev, err := store.Get(ctx)
	if err != nil {
		return err
	}
	if stored, err := netip.ParsePrefix(old.Range); rev == 0 || err == nil && stored.Masked() == r.Masked() {
		return nil // missing, or of r: New creates or uses it
	}
	bm, err := bitmap.New(r)
	if err != nil {
		return err
	}
	svcs, err := client.CoreV1().Services(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, svc := range svcs.Items {
		for _, s := range svc.Spec.ClusterIPs {
			if ip, err := allocator.ParseClusterIP(s); err == nil && r.Contains(ip) {
				_ = bm.Allocate(ctx, ip, allocator.Owner{}) // a duplicate or reserved address stays as it is
			}
		}
	}
	if _, err := store.Update(ctx, rev, bm.Snapshot()); err != nil {
		return err
	}
	klog.FromContext(ctx).Info("Rewrote the Service IP bitmap for the changed range, as kube-apiserver's repair does", "key", store.Key(), "from", old.Range, "to", r, "allocated", bm.Used())
	return nil
}

// start makes allocs the allocators that the registry's calls go to. It reports false, and
// closes allocs, if the registry has been destroyed.
func (a *clusterIPAllocators) start(allocs *clusterip.Allocators) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.destroyed {
		allocs.Close()
		return false
	}
	a.ready.Store(allocs)
	return true
}

// destroy closes the allocators, if started, and the IPAddress registry. It is idempotent.
func (a *clusterIPAllocators) destroy() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.destroyed {
		return
	}
	a.destroyed = true
	if allocs := a.ready.Load(); allocs != nil {
		allocs.Close()
	}
	if a.ipAddresses != nil {
		a.ipAddresses.Destroy()
	}
}

// clusterIPAllocator is clusterip's allocator of one IP family as kube-apiserver's Service
// registry uses it: an ipallocator.Interface, plus AllocateService and AllocateNextService, which
// record the Service as the owner of the address. Errors carry kube-apiserver's own values and
// texts (ipallocator.ErrFull, ErrAllocated, *ErrNotInRange, ErrMismatchedNetwork, ErrNotReady).
// Each call is bounded by clusterIPCallTimeout.
type clusterIPAllocator struct {
	all    *clusterIPAllocators
	family api.IPFamily
	cidr   net.IPNet // the family's --service-cluster-ip-range
	dryRun bool
}

var _ ipallocator.Interface = (*clusterIPAllocator)(nil)

// get returns the allocator calls go to, or ipallocator.ErrNotReady before the allocators are
// started.
func (c *clusterIPAllocator) get() (allocator.Interface, error) {
	allocs := c.all.ready.Load()
	if allocs == nil {
		return nil, ipallocator.ErrNotReady
	}
	al := allocs.For(corev1.IPFamily(c.family))
	if al == nil {
		return nil, ipallocator.ErrNotReady
	}
	if c.dryRun {
		return al.DryRun(), nil
	}
	return al, nil
}

// AllocateService reserves ip for svc.
func (c *clusterIPAllocator) AllocateService(svc *api.Service, ip net.IP) error {
	addr, ok := addrOf(ip)
	if !ok {
		return &ipallocator.ErrNotInRange{IP: ip, ValidRange: c.cidr.String()}
	}
	al, err := c.get()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterIPCallTimeout)
	defer cancel()
	return c.ipallocatorError(al.Allocate(ctx, addr, ownerOf(svc)), ip)
}

// AllocateNextService reserves a free address for svc and returns it: with reservations, the
// address reserved for svc in the family if there is one.
func (c *clusterIPAllocator) AllocateNextService(svc *api.Service) (net.IP, error) {
	if ip, ok, err := c.claimReserved(svc); ok || err != nil {
		return ip, err
	}
	al, err := c.get()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterIPCallTimeout)
	defer cancel()
	addr, err := al.AllocateNext(ctx, ownerOf(svc))
	if err != nil {
		return nil, c.ipallocatorError(c.ownerRefusal(ctx, al, err), nil)
	}
	return net.IP(addr.AsSlice()), nil
}

// ownerRefusal returns err, an error of al's AllocateNext, as stock's allocator answers for an
// owner the library refuses before it writes anything (a Service without a name): stock creates
// the IPAddress object and the server refuses it (see clusteripservice.OwnerRefusal), except that before
// v1.35 its IPAddressOnly allocator goes on to the next address after each refusal and answers
// that the range is full.
func (c *clusterIPAllocator) ownerRefusal(ctx context.Context, al allocator.Interface, err error) error {
	var oe *allocator.OwnerError
	if !errors.As(err, &oe) {
		return err
	}
	if binary, _ := clusterIPVersion(); c.all.mode == featuregate.IPAddressOnly && binary.LessThan(version.MajorMinor(1, 35)) {
		return ipallocator.ErrFull
	}
	return clusteripservice.OwnerRefusal(ctx, al, err)
}

// Allocate reserves ip with no owner: kube-apiserver's registry calls it in Legacy mode, whose
// bitmaps record none.
func (c *clusterIPAllocator) Allocate(ip net.IP) error { return c.AllocateService(nil, ip) }

// AllocateNext reserves a free address with no owner; see Allocate.
func (c *clusterIPAllocator) AllocateNext() (net.IP, error) { return c.AllocateNextService(nil) }

// Release frees ip; an address that is not allocated, or out of range, is not an error. A claim
// of ip that could still be reverted is forgotten: stock's registry releases an address a Service
// gives up on update through here, and the undo must not outlive the allocation it undoes.
func (c *clusterIPAllocator) Release(ip net.IP) error {
	addr, ok := addrOf(ip)
	if !ok {
		return nil
	}
	c.all.claims.forget(addr)
	al, err := c.get()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterIPCallTimeout)
	defer cancel()
	return c.ipallocatorError(al.Release(ctx, addr), ip)
}

// ForEach calls f with every allocated address, in ascending order; nothing before start.
func (c *clusterIPAllocator) ForEach(f func(net.IP)) {
	al, err := c.get()
	if err != nil {
		return
	}
	for addr := range al.All() {
		f(net.IP(addr.AsSlice()))
	}
}

// CIDR returns the family's --service-cluster-ip-range.
func (c *clusterIPAllocator) CIDR() net.IPNet { return c.cidr }

// IPFamily returns the IP family served.
func (c *clusterIPAllocator) IPFamily() api.IPFamily { return c.family }

// Has reports whether ip is allocated; false before start.
func (c *clusterIPAllocator) Has(ip net.IP) bool {
	addr, ok := addrOf(ip)
	if !ok {
		return false
	}
	al, err := c.get()
	return err == nil && al.Has(addr)
}

// Destroy closes the allocators of every family (they share their clients); it is idempotent.
// A dry-run view destroys nothing.
func (c *clusterIPAllocator) Destroy() {
	if !c.dryRun {
		c.all.destroy()
	}
}

// EnableMetrics does nothing: the allocators register kube-apiserver's allocator metrics in the
// legacy registry when they are built.
func (c *clusterIPAllocator) EnableMetrics() {}

// DryRun returns a view that validates every call as the allocator would but changes nothing;
// unlike kube-apiserver's (which answers from one ServiceCIDR chosen at random), it reports
// an address that is already allocated.
func (c *clusterIPAllocator) DryRun() ipallocator.Interface {
	v := *c
	v.dryRun = true
	return &v
}

// ipallocatorError returns err as kube-apiserver's ipallocator reports the same case, so that the
// registry's messages ("provided IP is already allocated", "range is full", "The range of valid
// IPs is …") are kube-apiserver's. ip is the address asked for, nil for AllocateNext.
func (c *clusterIPAllocator) ipallocatorError(err error, ip net.IP) error {
	var nir *allocator.NotInRangeError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &nir):
		if !nir.Range.IsValid() {
			// No ServiceCIDR holds it: kube-apiserver's multi-CIDR allocator says so this way.
			return ipallocator.ErrMismatchedNetwork
		}
		if ip == nil {
			ip = net.IP(nir.IP.AsSlice())
		}
		return &ipallocator.ErrNotInRange{IP: ip, ValidRange: nir.Range.String()}
	case errors.Is(err, allocator.ErrAllocated):
		return ipallocator.ErrAllocated
	case errors.Is(err, allocator.ErrFull):
		return ipallocator.ErrFull
	case errors.Is(err, allocator.ErrNotReady):
		return ipallocator.ErrNotReady
	case errors.Is(err, allocator.ErrMismatchedNetwork):
		return ipallocator.ErrMismatchedNetwork
	}
	// An answer of the API server, such as an admission policy's refusal of an IPAddress
	// object: as stock's allocator returns it, without what the library's layers added.
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		if statusErr, ok := status.(error); ok {
			return statusErr
		}
	}
	return err
}

// addrOf returns ip as an unmapped netip.Addr, and false if ip is not an address.
func addrOf(ip net.IP) (netip.Addr, bool) {
	addr, ok := netip.AddrFromSlice(ip)
	if !ok {
		return netip.Addr{}, false
	}
	return addr.Unmap(), true
}

// ipNetOf returns p as a net.IPNet, 4 bytes long for IPv4.
func ipNetOf(p netip.Prefix) net.IPNet {
	bits := p.Addr().BitLen()
	return net.IPNet{IP: net.IP(p.Masked().Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), bits)}
}

// ownerOf returns the Owner that names svc, the internal Service of the registry: the core group,
// resource "services", its namespace, name and UID. A nil svc gives the zero Owner.
func ownerOf(svc *api.Service) allocator.Owner {
	if svc == nil {
		return allocator.Owner{}
	}
	return allocator.Owner{Resource: "services", Namespace: svc.Namespace, Name: svc.Name, UID: svc.UID}
}
