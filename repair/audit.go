package repair

import (
	"context"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	clusterip "github.com/kube-ipam/clusterip"
	"github.com/kube-ipam/clusterip/allocator"
	"github.com/kube-ipam/clusterip/bitmap"
	"github.com/kube-ipam/clusterip/bitmap/etcdstore"
	"github.com/kube-ipam/clusterip/featuregate"
)

// listPageSize is the Limit of each List call: the API server answers a paginated List from one
// consistent snapshot without holding every object in one response.
const listPageSize = 500

// Audit reads the cluster's ClusterIP state and returns a Report of every address that needs
// attention, judged by cfg.Mode. It writes nothing.
//
// It lists Services (every mode), ServiceCIDRs and IPAddress objects (DualWrite and
// IPAddressOnly) from the API server with cfg.Client, in pages and never from a cache, and in
// Legacy and DualWrite mode reads the bitmaps of cfg.Ranges from cfg.Etcd at the keys their
// order chooses (the first range at <EtcdPrefix>/ranges/serviceips, the second at
// <EtcdPrefix>/ranges/secondaryserviceips); a missing bitmap counts as empty. cfg.Informers is
// not used.
//
// The reads are not one transaction. They are ordered so that an allocation or release running
// meanwhile can only show up as a leak or a stale bit, which repair holds off, and never as a
// missing record: ServiceCIDRs and IPAddress objects first, then the bitmaps, then the Services.
// (An allocator writes its records before the Service and releases them after it is deleted;
// this library's dual write also writes the bit before the IPAddress, DESIGN §6.)
//
// A Config without what the mode needs gives a *clusterip.ConfigError naming the field (Client
// is required in every mode); a bitmap stored for another range than cfg.Ranges gives an error
// wrapping allocator.ErrMismatchedNetwork; API and etcd errors are wrapped.
func Audit(ctx context.Context, cfg clusterip.Config) (*Report, error) {
	w, err := read(ctx, &cfg)
	if err != nil {
		return nil, err
	}
	return classify(w).report(cfg.Mode), nil
}

// checkConfig returns what Audit needs of cfg that it lacks.
func checkConfig(cfg *clusterip.Config) error {
	switch cfg.Mode {
	case featuregate.Legacy, featuregate.DualWrite, featuregate.IPAddressOnly:
	default:
		return &clusterip.ConfigError{Field: "Mode", Reason: fmt.Sprintf("unknown mode %v", cfg.Mode)}
	}
	switch {
	case len(cfg.Ranges) == 0:
		return &clusterip.ConfigError{Field: "Ranges", Reason: "required: the Service CIDRs of --service-cluster-ip-range"}
	case len(cfg.Ranges) > 2:
		return &clusterip.ConfigError{Field: "Ranges", Reason: fmt.Sprintf("%d ranges given, at most one per IP family", len(cfg.Ranges))}
	case len(cfg.Ranges) == 2 && cfg.Ranges[0].Addr().Is4() == cfg.Ranges[1].Addr().Is4():
		return &clusterip.ConfigError{Field: "Ranges[1]", Reason: "of the same IP family as Ranges[0]"}
	case cfg.Client == nil:
		return &clusterip.ConfigError{Field: "Client", Reason: "required to audit: Services are read from the API server"}
	case cfg.Mode != featuregate.IPAddressOnly && cfg.Etcd == nil:
		return &clusterip.ConfigError{Field: "Etcd", Reason: "required in " + cfg.Mode.String() + " mode, to read the bitmaps"}
	}
	for i, r := range cfg.Ranges {
		if err := allocator.CheckPrefix(r); err != nil {
			return &clusterip.ConfigError{Field: fmt.Sprintf("Ranges[%d]", i), Reason: "not a usable range", Err: err}
		}
	}
	return nil
}

// read reads the world cfg describes, in the order Audit documents.
func read(ctx context.Context, cfg *clusterip.Config) (*world, error) {
	if err := checkConfig(cfg); err != nil {
		return nil, err
	}
	w := &world{mode: cfg.Mode, managedBy: cfg.ManagedBy}
	var err error
	if cfg.Mode != featuregate.Legacy {
		if w.cidrs, err = listServiceCIDRs(ctx, cfg.Client); err != nil {
			return nil, err
		}
		if w.ipAddresses, err = listIPAddresses(ctx, cfg.Client); err != nil {
			return nil, err
		}
	}
	if cfg.Mode != featuregate.IPAddressOnly {
		for i, r := range cfg.Ranges {
			b, rev, err := readBitmap(ctx, etcdstore.New(cfg.Etcd, bitmapKey(cfg.EtcdPrefix, i)), r)
			if err != nil {
				return nil, err
			}
			w.bitmaps = append(w.bitmaps, b)
			w.revs = append(w.revs, rev)
		}
	}
	if w.services, err = listServices(ctx, cfg.Client); err != nil {
		return nil, err
	}
	return w, nil
}

// bitmapKey returns the etcd key of the bitmap of the range at index i of Config.Ranges.
func bitmapKey(prefix string, i int) string {
	if i == 0 {
		return etcdstore.ServiceIPsKey(prefix)
	}
	return etcdstore.SecondaryServiceIPsKey(prefix)
}

// readBitmap reads the bitmap of r from store and returns it with its revision; a missing one is
// empty, at revision 0.
func readBitmap(ctx context.Context, store *etcdstore.Store, r netip.Prefix) (*bitmap.Allocator, int64, error) {
	b, err := bitmap.New(r)
	if err != nil {
		return nil, 0, fmt.Errorf("repair: bitmap of %s: %w", r, err)
	}
	snap, rev, err := store.Get(ctx)
	if err != nil {
		return nil, 0, fmt.Errorf("repair: read the bitmap of %s at %s: %w", r, store.Key(), err)
	}
	if rev == 0 {
		return b, 0, nil
	}
	if err := b.Restore(snap); err != nil {
		return nil, 0, fmt.Errorf("repair: the bitmap at %s: %w", store.Key(), err)
	}
	return b, rev, nil
}

// listServices lists every Service, a page at a time.
func listServices(ctx context.Context, c kubernetes.Interface) ([]*corev1.Service, error) {
	return listPages(ctx, "Services", c.CoreV1().Services(metav1.NamespaceAll).List, func(l *corev1.ServiceList) []corev1.Service { return l.Items })
}

// listIPAddresses lists every IPAddress object, a page at a time.
func listIPAddresses(ctx context.Context, c kubernetes.Interface) ([]*networkingv1.IPAddress, error) {
	return listPages(ctx, "IPAddresses", c.NetworkingV1().IPAddresses().List, func(l *networkingv1.IPAddressList) []networkingv1.IPAddress { return l.Items })
}

// listServiceCIDRs lists every ServiceCIDR, a page at a time.
func listServiceCIDRs(ctx context.Context, c kubernetes.Interface) ([]*networkingv1.ServiceCIDR, error) {
	return listPages(ctx, "ServiceCIDRs", c.NetworkingV1().ServiceCIDRs().List, func(l *networkingv1.ServiceCIDRList) []networkingv1.ServiceCIDR { return l.Items })
}

// listPages calls list for pages of listPageSize until the last, and returns pointers to the
// items of every page; what names the resource in the error.
func listPages[L interface{ GetContinue() string }, T any](ctx context.Context, what string, list func(context.Context, metav1.ListOptions) (L, error), items func(L) []T) ([]*T, error) {
	var out []*T
	opts := metav1.ListOptions{Limit: listPageSize}
	for {
		l, err := list(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("repair: list %s: %w", what, err)
		}
		page := items(l)
		for i := range page {
			out = append(out, &page[i])
		}
		if l.GetContinue() == "" {
			return out, nil
		}
		opts.Continue = l.GetContinue()
	}
}
