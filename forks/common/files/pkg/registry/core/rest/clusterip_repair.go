// This file is not part of Kubernetes: each kube-apiserver fork of github.com/kube-ipam/clusterip
// (forks/<release> in its repository; the file is kept once, in forks/common) adds it to package
// k8s.io/kubernetes/pkg/registry/core/rest, beside clusterip.go. It is what the PostStartHook
// start-service-ip-repair-controllers runs: it builds clusterip's allocators once the server
// serves, and runs clusterip's repair controller in place of kube-apiserver's.

package rest

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	networkingv1listers "k8s.io/client-go/listers/networking/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/api/legacyscheme"

	"github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
	"github.com/kube-ipam/clusterip/repair"
	"github.com/kube-ipam/clusterip/servicecidr"
)

const (
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
